// percpu-bench's rows as a Google Benchmark suite, for developers who want
// the library's usual tooling (filters, --benchmark_format=json,
// --benchmark_repetitions, compare.py) rather than the seed-shaped tables.
//
// Every benchmark runs the very loop percpu-bench times (tools/
// percpu_bench_loops.cpp) in batches, so the two tools measure the same code;
// the "per_call" counter is the figure to compare with percpu-bench.
//
//   bench/cpu_methods_benchmark --benchmark_format=json --benchmark_repetitions=N

#include <benchmark/benchmark.h>

#include <cstdint>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "tools/percpu_bench_loops.hpp"

namespace {

// Calls per benchmark iteration: enough to bury the harness's own per-
// iteration cost under the method's.
constexpr std::uint64_t kBatch = 1000;

void run_batches(benchmark::State& state, percpu::bench::loop_fn loop) {
  for (auto _ : state) loop(kBatch);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBatch));
  // Seconds per call of one thread, shown with an SI prefix (ns, ps).
  state.counters["per_call"] = benchmark::Counter(
      static_cast<double>(kBatch), benchmark::Counter::kIsIterationInvariantRate |
                                       benchmark::Counter::kAvgThreads |
                                       benchmark::Counter::kInvert);
}

bool usable(benchmark::State& state, percpu::cpu_backend backend) {
  const char* why = nullptr;
  if (percpu::internal::fallback_usable(backend, &why)) return true;
  state.SkipWithError(why != nullptr ? why : "unavailable on this machine");
  return false;
}

void BM_GlibcSchedGetcpu(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_glibc_sched_getcpu);
  state.SetLabel(std::string("rseq owner: ") + percpu::to_string(percpu::rseq_ownership()));
}
BENCHMARK(BM_GlibcSchedGetcpu);

void BM_PercpuSchedGetcpu(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_percpu_sched_getcpu);
}
BENCHMARK(BM_PercpuSchedGetcpu);

void BM_CpuIdInline(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_cpu_id);
  state.SetLabel(percpu::to_string(percpu::backend()));
}
BENCHMARK(BM_CpuIdInline);

void BM_RawVdsoGetcpu(benchmark::State& state) {
  if (!usable(state, percpu::cpu_backend::vdso)) return;
  run_batches(state, percpu_bench_loop_vdso_getcpu);
}
BENCHMARK(BM_RawVdsoGetcpu);

void BM_Rdpid(benchmark::State& state) {
  if (!usable(state, percpu::cpu_backend::rdpid)) return;
  run_batches(state, percpu_bench_loop_rdpid);
}
BENCHMARK(BM_Rdpid);

void BM_Rdtscp(benchmark::State& state) {
  if (!percpu::bench::cpu_has_rdtscp()) {
    state.SkipWithError("no RDTSCP on this CPU");
    return;
  }
  run_batches(state, percpu_bench_loop_rdtscp);
}
BENCHMARK(BM_Rdtscp);

void BM_SyscallGetcpu(benchmark::State& state) {
  if (!usable(state, percpu::cpu_backend::syscall)) return;
  run_batches(state, percpu_bench_loop_syscall_getcpu);
}
BENCHMARK(BM_SyscallGetcpu);

void BM_ThreadLocalLimit(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_thread_local);
}
BENCHMARK(BM_ThreadLocalLimit);

// The arm64 seed's shape: an out-of-line get_cpu_id() wrapper.
void BM_GetCpuIdBefore(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_get_cpu_id_before);
}
BENCHMARK(BM_GetCpuIdBefore);

void BM_GetCpuIdAfter(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_get_cpu_id_after);
}
BENCHMARK(BM_GetCpuIdAfter);

void BM_EmptyNoinlineCall(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_empty_call);
}
BENCHMARK(BM_EmptyNoinlineCall);

// Every CPU at once, like percpu-bench --threads.
void BM_CpuIdInlineThreads(benchmark::State& state) { run_batches(state, percpu_bench_loop_cpu_id); }
BENCHMARK(BM_CpuIdInlineThreads)->ThreadPerCpu();

void BM_GlibcSchedGetcpuThreads(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_glibc_sched_getcpu);
}
BENCHMARK(BM_GlibcSchedGetcpuThreads)->ThreadPerCpu();

}  // namespace
