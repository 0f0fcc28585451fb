// The CPU-number sources used when a thread has no rseq area: RDPID, the
// vDSO getcpu and the getcpu system call. One of them is chosen per process,
// fastest correct first, by percpu's constructor.
//
// All functions are thread-safe and async-signal-safe and leave errno alone.
#pragma once

#include "percpu/cpu.hpp"

namespace percpu {
namespace internal {

// Whether `backend` (rdpid, vdso or syscall) works in this process. When it
// does not and `why` is non-null, *why names the reason in a few words.
bool fallback_usable(cpu_backend backend, const char** why) noexcept;

// Asks `backend` for the current CPU and node. Returns 0 and fills *cpu and
// *node (either may be null), or returns a positive errno value.
int fallback_query(cpu_backend backend, unsigned* cpu, unsigned* node) noexcept;

// The raw mechanisms, for the slow path and for benchmarks and tests that
// compare against them.

// RDPID (see internal/thread_pointer_x86_64.hpp). Only call it where
// fallback_usable(rdpid) is true.
inline unsigned raw_rdpid() noexcept { return rdpid_tsc_aux(); }

// The vDSO's getcpu, or nullptr where the kernel's vDSO has none (arm64).
using vdso_getcpu_fn = long (*)(unsigned* cpu, unsigned* node, void* unused);
vdso_getcpu_fn vdso_getcpu_function() noexcept;

int raw_vdso_getcpu(unsigned* cpu, unsigned* node) noexcept;     // -1 without a vDSO getcpu
int raw_syscall_getcpu(unsigned* cpu, unsigned* node) noexcept;  // errno value or 0

}  // namespace internal
}  // namespace percpu
