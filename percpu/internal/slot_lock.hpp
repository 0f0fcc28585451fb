// How a thread that is not running an owner section may touch a per-CPU slot:
// the remote-access protocol shared by percpu::free_list and
// percpu::object_pool.
//
// The problem
//   A slot's head word is written by rseq sections of its CPU with plain
//   stores (the "owners"). A section that read the head just before another
//   CPU's atomic exchange can still commit its plain store afterwards and
//   silently overwrite what the other thread wrote. So nobody else may write
//   the head unless every such section is known to be over.
//
// The protocol (lock_slot / unlock_slot)
//   1. Take the slot's `locker` flag with an atomic exchange; if it was held,
//      report busy (never wait: the holder may be the thread this signal
//      handler interrupted). The flag makes the locker the only thread that
//      ever writes kSlotLocked into this head.
//   2. Exchange the head with kSlotLocked (sequentially consistent).
//   3. If no thread of the process has ever been able to run an owner section
//      (see section users below), the exchange alone gives ownership.
//   4. Otherwise fence the CPU: membarrier(PRIVATE_EXPEDITED_RSEQ, FLAG_CPU,
//      cpu). On return, every section that was running on that CPU has been
//      aborted (the IPI makes the kernel restart it on return to user space),
//      every section that was preempted there was already restarted, and every
//      store such a section committed before the IPI is visible here. Owner
//      sections for this slot can only commit while on this CPU, because each
//      re-checks cpu_id inside; so after the fence no owner section that
//      loaded the head before step 2 can still commit.
//   5. Re-read the head. Still kSlotLocked: no owner committed between step 2
//      and the fence, so the exchanged value is the list and the locker owns
//      it. Anything else: an owner committed over kSlotLocked, its value is the
//      truth (it was computed from the very value we took, which we did not
//      modify), so go back to step 2. A bounded number of rounds, then busy.
//   6. While locked, owner sections see kSlotLocked: their compare fails (a
//      push expects the head it read, a pop refuses kSlotLocked as its
//      "expectnot"), and they take their slow path. They never wait for the
//      lock.
//   7. unlock_slot stores the new head with release order, then frees the
//      flag. Owners read the head and then the node it points to, an address
//      dependency, so they see the nodes the locker wrote.
//   If rseq sections may run and membarrier with the RSEQ command is not
//   available, lock_slot refuses before step 2: remote access would be unsafe.
//
// Section users (the Dekker flag that lets fallback threads skip the fence)
//   Every thread, before its first owner section, stores 1 into a process-wide
//   flag and issues a sequentially consistent fence (mark_section_user). A
//   locker reads the flag after its exchange (both seq_cst). If it reads 0,
//   its exchange precedes that thread's fence in the single total order, so
//   every later section of that thread reads kSlotLocked or a later value:
//   nothing to fence. If it reads 1, it fences. The flag never goes back to 0.
//   This is what makes threads without rseq (seccomp, valgrind, forced
//   backend) cheap and correct: in a process where no thread has rseq they
//   lock with atomics only.
//
// Side stack
//   A lock-free stack for nodes that cannot go to a slot right now (the slot
//   is locked, possibly by the thread a signal handler interrupted). Any
//   thread pushes with a CAS; only the holder of its `consumer` flag pops or
//   takes everything, and it takes the flag with an exchange and never waits.
//   With one consumer at a time, a pop's CAS cannot suffer ABA: the node it
//   read as the head cannot leave the stack without that consumer.
//
// Fork
//   Each structure registers itself (fork_participant); before fork percpu
//   takes every participant's flags, so the child never inherits a slot that
//   a thread which does not exist there holds.
//
// Async-signal-safe: everything here except register/unregister of fork
// participants. Nothing here waits for a flag another thread holds, except the
// fork handler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "percpu/internal/rseq_cs.hpp"

namespace percpu {
namespace internal {

// The value a locker leaves in a head. Odd, so never a node address (nodes
// are at least pointer-aligned).
constexpr std::intptr_t kSlotLocked = 1;

// One CPU's slot: the head owner sections update and the locker flag.
struct alignas(64) cpu_slot {
  std::intptr_t head;  // plain stores by owner sections; atomics by lockers
  int locker;          // 0 free, 1 held; atomics only
};

enum class lock_result {
  acquired,  // the caller owns the list and must call unlock_slot
  busy,      // another thread holds it, or owners kept committing
  refused,   // rseq sections may run and membarrier cannot fence them
};

// Locks `slot`, the slot of CPU `cpu`, for a thread that is not its owner
// section. On acquired, *value is the list's head.
lock_result lock_slot(cpu_slot* slot, int cpu, std::intptr_t* value) noexcept;
// Publishes `value` as the new head and releases the slot.
void unlock_slot(cpu_slot* slot, std::intptr_t value) noexcept;
// False when lock_slot would refuse: sections may run and there is no fence.
bool remote_access_possible() noexcept;
// Whether lock_slot can fence a CPU (membarrier with the RSEQ command),
// whatever the section users: a structure that cannot count on it keeps its
// owner sections off its slots from the start.
bool slot_fence_available() noexcept;

// Marks the calling thread as a section user (t_section_state, see
// registration.hpp) and returns its new state: marked, or forced_locked
// under the test seam below.
section_user mark_section_user() noexcept;

// The area for owner sections of the calling thread, or nullptr when it must
// use the locked path (no rseq, or the seam says so). The state word is read
// through a fresh thread pointer (see t_section_state). It is only read once
// rseq_area_for_sections() has answered, that is after start-up has aimed
// g_fast_path.section_state; a stale offset 0 would read the thread control
// block's first word, a pointer, which is never 1, and so only costs a call.
inline rseq_area* section_area() noexcept {
  rseq_area* area = rseq_area_for_sections();
  if (area == nullptr) return nullptr;
  if (__builtin_expect(load_tp_relative_i32(g_fast_path.section_state) ==
                           static_cast<int>(section_user::marked),
                       1)) {
    return area;
  }
  return mark_section_user() == section_user::marked ? area : nullptr;
}

// The process-wide barrier of percpu::shared_mutex and percpu::ref:
// membarrier(PRIVATE_EXPEDITED), registered once per process (and again in a
// forked child, where the registration does not survive). On return every
// thread of the process that was running has executed a full memory barrier,
// and every thread that was not running will pass through the scheduler,
// which is one, before it runs again. So a thread's compiler barrier acts as
// a full barrier against this call: the asymmetric Dekker both rely on.
// barrier_available() is false without the command (old kernel, seccomp,
// valgrind) or under simulate_missing_membarrier(); then barrier_all()
// returns false and callers must make their readers fence for themselves.
bool barrier_available() noexcept;
bool barrier_all() noexcept;

// Test seam: from now on the calling thread takes the locked path, as a
// thread without rseq would, even though other threads run sections.
void force_locked_path_for_this_thread(bool on) noexcept;
// Test seam: how many membarrier fences this process issued.
unsigned long fence_count() noexcept;
// Test seam: pretend membarrier is missing (lock_slot then refuses whenever
// sections may run).
void simulate_missing_membarrier(bool on) noexcept;

// A node as the side stack sees it: the successor at offset 0.
struct side_node {
  side_node* next;
};

struct alignas(64) side_stack {
  std::intptr_t head;  // side_node*, 0 when empty; atomics only
  int consumer;        // 0 free, 1 held
};

// Pushes first..last (already linked through next) in one step.
void side_push(side_stack* stack, side_node* first, side_node* last) noexcept;
// Pops one node, or nullptr when empty or when another consumer is active.
side_node* side_pop(side_stack* stack) noexcept;
// Takes every node, or nullptr (empty, or another consumer is active).
side_node* side_take_all(side_stack* stack) noexcept;

// A structure whose flags must be held across fork().
class fork_participant {
 public:
  virtual void before_fork() noexcept = 0;  // take every flag, waiting if needed
  virtual void after_fork() noexcept = 0;   // release them (parent and child)

 protected:
  fork_participant() = default;
  ~fork_participant() = default;
  void register_for_fork() noexcept;
  void unregister_for_fork() noexcept;

 private:
  friend struct fork_registry;
  fork_participant* prev_ = nullptr;
  fork_participant* next_ = nullptr;
};

// Takes a slot's locker flag, waiting for it (fork preparation, destructors).
// Holders never keep the flag across anything that can block, so this ends.
void wait_for_locker(cpu_slot* slot) noexcept;
void release_locker(cpu_slot* slot) noexcept;
void wait_for_consumer(side_stack* stack) noexcept;
void release_consumer(side_stack* stack) noexcept;

}  // namespace internal
}  // namespace percpu
