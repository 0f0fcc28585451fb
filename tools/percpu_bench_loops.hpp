// The timed loops behind percpu-bench, one out-of-line function per method.
//
// Each loop makes `n` calls of its method and keeps every result alive in a
// register, so the compiler can neither drop nor merge the calls, and adds no
// memory traffic of its own. The functions have C names so that the tool can
// find and disassemble them in its own binary (its disassembly section).
//
// The loops may run on every CPU at once. The vDSO loop must only run where
// percpu::internal::vdso_getcpu_function() is non-null, the RDPID loop where
// fallback_usable(rdpid) holds, the RDTSCP loop where cpu_has_rdtscp().
#pragma once

#include <cstdint>

namespace percpu {
namespace bench {

using loop_fn = void (*)(std::uint64_t n);
// Whether the CPU has the instruction (x86-64 CPUID); false elsewhere.
bool cpu_has_rdtscp() noexcept;

}  // namespace bench
}  // namespace percpu

extern "C" {
// The glibc seed's rows.
void percpu_bench_loop_glibc_sched_getcpu(std::uint64_t n);
void percpu_bench_loop_percpu_sched_getcpu(std::uint64_t n);
void percpu_bench_loop_cpu_id(std::uint64_t n);
void percpu_bench_loop_vdso_getcpu(std::uint64_t n);
void percpu_bench_loop_rdpid(std::uint64_t n);   // x86-64 only; a no-op elsewhere
void percpu_bench_loop_rdtscp(std::uint64_t n);  // x86-64 only; a no-op elsewhere
void percpu_bench_loop_syscall_getcpu(std::uint64_t n);
void percpu_bench_loop_thread_local(std::uint64_t n);

// The arm64 seed's rows: calls of an out-of-line get_cpu_id() wrapper.
int percpu_bench_get_cpu_id_before(void);
int percpu_bench_get_cpu_id_after(void);
int percpu_bench_empty_call(void);
void percpu_bench_loop_get_cpu_id_before(std::uint64_t n);
void percpu_bench_loop_get_cpu_id_after(std::uint64_t n);
void percpu_bench_loop_empty_call(std::uint64_t n);
}
