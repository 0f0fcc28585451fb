// Do not include directly; not a stable API (internal to percpu).
//
// The fork registry.
//
//   Each structure registers itself (fork_participant); before fork percpu
//   takes every participant's flags, so the child never inherits a slot that
//   a thread which does not exist there holds.
//   The waits of the fork handler are rule R3 of cpu_slots.hpp.
//
// Not async-signal-safe: registration takes a mutex. Never register or
// unregister while holding a flag.
#pragma once

#include "percpu/internal/config.hpp"

namespace percpu {
namespace internal {

// A structure whose flags must be held across fork().
// Exported: the public structures derive from it (its type information).
class PERCPU_EXPORT fork_participant {
 public:
  virtual void before_fork() noexcept = 0;  // take every flag, waiting if needed
  // Release them, in the parent (child false) and in the child (true),
  // whose only thread is the one that forked.
  virtual void after_fork(bool child) noexcept = 0;

 protected:
  fork_participant() = default;
  ~fork_participant() = default;
  // Called by the structures' own code in the library only: not exported.
  __attribute__((visibility("hidden"))) void register_for_fork() noexcept;
  __attribute__((visibility("hidden"))) void unregister_for_fork() noexcept;

 private:
  friend struct fork_registry;
  fork_participant* prev_ = nullptr;
  fork_participant* next_ = nullptr;
};

}  // namespace internal
}  // namespace percpu
