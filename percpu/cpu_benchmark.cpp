// cpu_id() against its physical limit and every alternative, side by side.
// The ratios percpu promises for cpu_id() are read from one run of this binary:
//   BM_CpuId / BM_ThreadLocalRead         (limit)
//   BM_GlibcSchedGetcpu / BM_CpuId
//   BM_PercpuSchedGetcpu / BM_GlibcSchedGetcpu
//   BM_CpuIdForced/<fallback> / BM_Raw<fallback>

#include <benchmark/benchmark.h>
#include <sched.h>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/registration.hpp"
#include "percpu/percpu.h"

namespace percpu {
namespace {

thread_local int g_thread_local_value = 1;

void BM_ThreadLocalRead(benchmark::State& state) {
  for (auto _ : state) {
    int value = *static_cast<volatile int*>(&g_thread_local_value);
    benchmark::DoNotOptimize(value);
  }
}
BENCHMARK(BM_ThreadLocalRead);

void BM_CpuId(benchmark::State& state) {
  internal::force_backend(cpu_backend::rseq);
  for (auto _ : state) benchmark::DoNotOptimize(cpu_id());
  state.SetLabel(to_string(backend()));
}
BENCHMARK(BM_CpuId);

void BM_GlibcSchedGetcpu(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(sched_getcpu());
}
BENCHMARK(BM_GlibcSchedGetcpu);

void BM_PercpuSchedGetcpu(benchmark::State& state) {
  internal::force_backend(cpu_backend::rseq);
  for (auto _ : state) benchmark::DoNotOptimize(percpu_sched_getcpu());
}
BENCHMARK(BM_PercpuSchedGetcpu);

void BM_RawRdpid(benchmark::State& state) {
  if (!internal::fallback_usable(cpu_backend::rdpid, nullptr)) {
    state.SkipWithError("RDPID unavailable on this machine");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(internal::raw_rdpid() & 0xfff);
}
BENCHMARK(BM_RawRdpid);

void BM_RawVdso(benchmark::State& state) {
  if (!internal::fallback_usable(cpu_backend::vdso, nullptr)) {
    state.SkipWithError("no vDSO getcpu on this machine");
    return;
  }
  unsigned cpu = 0;
  for (auto _ : state) {
    internal::raw_vdso_getcpu(&cpu, nullptr);
    benchmark::DoNotOptimize(cpu);
  }
}
BENCHMARK(BM_RawVdso);

void BM_RawSyscall(benchmark::State& state) {
  unsigned cpu = 0;
  for (auto _ : state) {
    internal::raw_syscall_getcpu(&cpu, nullptr);
    benchmark::DoNotOptimize(cpu);
  }
}
BENCHMARK(BM_RawSyscall);

void BM_CpuIdForced(benchmark::State& state) {
  const auto b = static_cast<cpu_backend>(state.range(0));
  if (!internal::force_backend(b)) {
    state.SkipWithError("backend unavailable on this machine");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(cpu_id());
  state.SetLabel(to_string(backend()));
  internal::force_backend(cpu_backend::rseq);
}
BENCHMARK(BM_CpuIdForced)
    ->Arg(static_cast<int>(cpu_backend::rdpid))
    ->Arg(static_cast<int>(cpu_backend::vdso))
    ->Arg(static_cast<int>(cpu_backend::syscall));

}  // namespace
}  // namespace percpu
