// Do not include directly; not a stable API (internal to percpu).
//
// The concurrency limit: one more than the highest concurrency id that any
// structure indexed by concurrency id (percpu::cid_counter) has used as an
// index in this process. Readers of those structures walk the copies below
// it instead of every possible CPU's.
//
// Why a limit, and why process-wide
//   The kernel keeps mm_cid dense (it hands out the lowest free id) and
//   below the number of possible CPUs, but promises no smaller bound a
//   reader could compute: it may run up to about 1.25 times the threads or
//   the allowed CPUs, for a while above even that, and threads that never
//   touch percpu hold ids too. So the writers say which ids they used. A
//   writer tests its id against the limit before it makes an address from
//   it, inside its section (one load of this read-mostly line, made before
//   arming), and goes out of line to raise the limit when the id is not
//   below it; ids only
//   reach new highs a few times in a process's life. One limit serves every
//   structure: ids are the process's, not a structure's, and a reader of a
//   structure that was never written at id k reads zero there.
//
// What a reader can rely on
//   A write at index k is made only after the limit was seen above k (by
//   the writer, on that same thread, before its section). So every write
//   that happened before a reader loaded the limit is at an index below
//   what it loads; the limit never falls, so the bound stays good.
//
// Where the kernel keeps no mm_cid (before Linux 6.3, a registrant's area
// that is shorter), the concurrency id is the CPU id (concurrency_id() in
// cpu.hpp, decided once at start-up) and the limit covers the CPUs used.
// Threads without rseq index by the CPU they last saw and raise the limit
// the same way. It is at most max_cpus().
//
// Thread safety: lock-free; raise_concurrency_limit() is async-signal-safe.
#pragma once

#include <cstdint>

#include "percpu/internal/config.hpp"

namespace percpu {
namespace internal {

// On a line of its own: written only when an id reaches a new high.
struct alignas(64) concurrency_limit_line {
  std::uint32_t limit;
};
extern PERCPU_EXPORT concurrency_limit_line g_concurrency_limit;

// Every index a concurrency-indexed structure has written at is below it.
inline std::uint32_t concurrency_limit() noexcept {
  return __atomic_load_n(&g_concurrency_limit.limit, __ATOMIC_RELAXED);
}

// Makes the limit at least id + 1. `id` must be below max_cpus().
PERCPU_LOCAL void raise_concurrency_limit(std::uint32_t id) noexcept;

}  // namespace internal
}  // namespace percpu
