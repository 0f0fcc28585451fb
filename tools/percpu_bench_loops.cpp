// The timed loops. Every loop has the same shape, so the rows differ only by
// the method: a counted loop whose body is one call (or one inlined load)
// whose result is consumed by an empty asm statement. The asm takes the value
// in a register and has no memory clobber: a memory clobber would force the
// compiler to reload cpu_id()'s thread-pointer offset on every iteration,
// which would time the harness rather than the method.

#include "tools/percpu_bench_loops.hpp"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/percpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

// Out of line and opaque to interprocedural analysis, so a caller cannot see
// through the function (and, say, fold an empty one away or clone it).
//
// Every function starts on a cache-line boundary, and the build aligns loop
// heads the same way (-falign-loops, see tools/CMakeLists.txt): a loop body
// that happens to straddle a fetch-block boundary can take a cycle more per
// iteration, and that placement luck would otherwise differ from row to row
// and from build to build. The tool's disassembly section shows the result.
#if defined(__clang__)
#define PERCPU_BENCH_OPAQUE __attribute__((noinline, used, aligned(64)))
#else
#define PERCPU_BENCH_OPAQUE __attribute__((noipa, used, aligned(64)))
#endif

namespace percpu {
namespace bench {
namespace {

template <typename T>
inline void keep(T value) {
  asm volatile("" : : "r"(value));
}

// Static TLS of the executable itself: one %fs- (or tpidr_el0-) relative
// load, the cheapest per-thread read there is and so the limit for cpu_id().
thread_local int g_limit_value = 1;

}  // namespace

bool cpu_has_rdtscp() noexcept {
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 27)) != 0;
#else
  return false;
#endif
}

}  // namespace bench
}  // namespace percpu

using percpu::bench::keep;

extern "C" {

PERCPU_BENCH_OPAQUE void percpu_bench_loop_glibc_sched_getcpu(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(sched_getcpu());
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_percpu_sched_getcpu(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(percpu_sched_getcpu());
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_cpu_id(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(percpu::cpu_id());
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_vdso_getcpu(std::uint64_t n) {
  // Looked up once, outside the loop: the row times the vDSO function itself.
  const percpu::internal::vdso_getcpu_fn f = percpu::internal::vdso_getcpu_function();
  for (std::uint64_t i = 0; i < n; ++i) {
    unsigned cpu = 0;
    f(&cpu, nullptr, nullptr);
    keep(cpu);
  }
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_rdpid(std::uint64_t n) {
#if defined(__x86_64__)
  for (std::uint64_t i = 0; i < n; ++i) {
    keep(percpu::internal::raw_rdpid());
  }
#else
  (void)n;
#endif
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_rdtscp(std::uint64_t n) {
#if defined(__x86_64__)
  for (std::uint64_t i = 0; i < n; ++i) {
    unsigned lo, hi, aux;
    asm volatile("rdtscp" : "=a"(lo), "=d"(hi), "=c"(aux));
    keep(aux);
  }
#else
  (void)n;
#endif
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_syscall_getcpu(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    unsigned cpu = 0;
    syscall(SYS_getcpu, &cpu, nullptr, nullptr);
    keep(cpu);
  }
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_thread_local(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    keep(*static_cast<volatile int*>(&percpu::bench::g_limit_value));
  }
}

// The arm64 seed's get_cpu_id(): the same out-of-line wrapper around each
// way of asking, called in a loop.
PERCPU_BENCH_OPAQUE int percpu_bench_get_cpu_id_before(void) { return sched_getcpu(); }

PERCPU_BENCH_OPAQUE int percpu_bench_get_cpu_id_after(void) { return percpu::cpu_id(); }

PERCPU_BENCH_OPAQUE int percpu_bench_empty_call(void) {
  int value = 0;
  asm volatile("" : "+r"(value));
  return value;
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_get_cpu_id_before(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(percpu_bench_get_cpu_id_before());
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_get_cpu_id_after(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(percpu_bench_get_cpu_id_after());
}

PERCPU_BENCH_OPAQUE void percpu_bench_loop_empty_call(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(percpu_bench_empty_call());
}

}  // extern "C"
