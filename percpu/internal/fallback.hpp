// Do not include directly; not a stable API (internal to percpu).
//
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

int raw_vdso_getcpu(unsigned* cpu, unsigned* node) noexcept;     // errno value or 0 (ENOSYS: none)
int raw_syscall_getcpu(unsigned* cpu, unsigned* node) noexcept;  // errno value or 0

// How fallback_usable() trusts RDPID and the vDSO: `agrees_here` compares
// the source with the getcpu system call on the CPU it runs on and sets the
// CPU it agreed on. An agreement on CPU 0 is checked again on another
// allowed CPU, the calling thread moved there for the while, since a stub
// answering 0 everywhere agrees on CPU 0 (fallback.cpp says where the one
// agreement has to stand).
bool agrees_on_cpu_0_and_another(bool (*agrees_here)(unsigned* agreed)) noexcept;

// A CPU id in [0, max_cpus()) for a thread without rseq to pick the slot it
// tries first. Where the fallback answers without a system call (RDPID, the
// vDSO) it is cpu_id(); where the fallback is the getcpu system call (arm64
// has neither RDPID nor a vDSO getcpu) it is cpu_id() once every
// kCpuHintUses calls on the thread and the last answer in between, so no
// operation pays a system call. The per-CPU structures lock or check the
// slot they pick anyway, so a stale answer costs locality, never
// correctness.
// Thread-safe and async-signal-safe (a handler that interrupts the refresh
// reads an older answer, which is still in range).
constexpr unsigned kCpuHintUses = 256;
int cpu_hint_slow() noexcept;
inline int cpu_hint() noexcept {
  // RDPID answers inline, in one instruction.
  if (kArchHasRdpid && g_fast_path.rdpid_inline) return cpu_id();
  return cpu_hint_slow();
}

// cpu_hint() as an index into `count` slots: the slot of a recent CPU of
// the thread, for the atomic words that threads without a section share.
// The hint is below max_cpus() already; the fold keeps a caller whose
// count is smaller in range too.
inline unsigned cpu_hint_index(unsigned count) noexcept {
  const unsigned cpu = static_cast<unsigned>(cpu_hint());
  return cpu < count ? cpu : cpu % count;
}

}  // namespace internal
}  // namespace percpu
