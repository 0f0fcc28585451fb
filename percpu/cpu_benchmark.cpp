// "Which CPU am I on?", every method, as a Google Benchmark suite: the
// developers' view of what percpu-bench prints for users, with the library's
// usual tooling (filters, --benchmark_format=json, --benchmark_repetitions,
// compare.py).
//
// Every benchmark runs the very loop percpu-bench times
// (tools/percpu_bench_loops.cpp, compiled in with the same loop alignment) in
// batches, so the two tools measure the same code; the "per_call" counter is
// the figure to compare with percpu-bench. Only BM_CpuIdForced has no row
// there: cpu_id() with each fallback forced, to hold against BM_Raw<fallback>.
//
// The ratios percpu promises for cpu_id() are read from one run of this binary:
//   BM_CpuId / BM_ThreadLocalRead         (limit)
//   BM_GlibcSchedGetcpu / BM_CpuId
//   BM_PercpuSchedGetcpu / BM_GlibcSchedGetcpu
//   BM_CpuIdForced/<fallback> / BM_Raw<fallback>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/registration.hpp"
#include "tools/percpu_bench_loops.hpp"

namespace percpu {
namespace {

// Calls per benchmark iteration: enough to bury the harness's own per-
// iteration cost under the method's.
constexpr std::uint64_t kBatch = 1000;

void run_batches(benchmark::State& state, bench::loop_fn loop) {
  for (auto _ : state) loop(kBatch);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBatch));
  // Seconds per call of one thread, shown with an SI prefix (ns, ps).
  state.counters["per_call"] =
      benchmark::Counter(static_cast<double>(kBatch),
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kAvgThreads | benchmark::Counter::kInvert);
}

bool usable(benchmark::State& state, cpu_backend backend) {
  const char* why = nullptr;
  if (internal::fallback_usable(backend, &why)) return true;
  state.SkipWithError(why != nullptr ? why : "unavailable on this machine");
  return false;
}

// The limit: a thread_local read, the least a per-thread answer can cost.
void BM_ThreadLocalRead(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_thread_local);
}
BENCHMARK(BM_ThreadLocalRead);

void BM_CpuId(benchmark::State& state) {
  internal::force_backend(cpu_backend::rseq);
  run_batches(state, percpu_bench_loop_cpu_id);
  state.SetLabel(to_string(backend()));
}
BENCHMARK(BM_CpuId);

void BM_GlibcSchedGetcpu(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_glibc_sched_getcpu);
  state.SetLabel(std::string("rseq owner: ") + to_string(rseq_ownership()));
}
BENCHMARK(BM_GlibcSchedGetcpu);

void BM_PercpuSchedGetcpu(benchmark::State& state) {
  internal::force_backend(cpu_backend::rseq);
  run_batches(state, percpu_bench_loop_percpu_sched_getcpu);
}
BENCHMARK(BM_PercpuSchedGetcpu);

void BM_RawRdpid(benchmark::State& state) {
  if (!usable(state, cpu_backend::rdpid)) return;
  run_batches(state, percpu_bench_loop_rdpid);
}
BENCHMARK(BM_RawRdpid);

void BM_RawVdso(benchmark::State& state) {
  if (!usable(state, cpu_backend::vdso)) return;
  run_batches(state, percpu_bench_loop_vdso_getcpu);
}
BENCHMARK(BM_RawVdso);

void BM_RawSyscall(benchmark::State& state) {
  if (!usable(state, cpu_backend::syscall)) return;
  run_batches(state, percpu_bench_loop_syscall_getcpu);
}
BENCHMARK(BM_RawSyscall);

void BM_Rdtscp(benchmark::State& state) {
  if (!bench::cpu_has_rdtscp()) {
    state.SkipWithError("no RDTSCP on this CPU");
    return;
  }
  run_batches(state, percpu_bench_loop_rdtscp);
}
BENCHMARK(BM_Rdtscp);

void BM_CpuIdForced(benchmark::State& state) {
  const auto b = static_cast<cpu_backend>(state.range(0));
  if (!internal::force_backend(b)) {
    state.SkipWithError("backend unavailable on this machine");
    return;
  }
  run_batches(state, percpu_bench_loop_cpu_id);
  state.SetLabel(to_string(backend()));
  internal::force_backend(cpu_backend::rseq);
}
BENCHMARK(BM_CpuIdForced)
    ->Arg(static_cast<int>(cpu_backend::rdpid))
    ->Arg(static_cast<int>(cpu_backend::vdso))
    ->Arg(static_cast<int>(cpu_backend::syscall));

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
void BM_CpuIdThreads(benchmark::State& state) { run_batches(state, percpu_bench_loop_cpu_id); }
BENCHMARK(BM_CpuIdThreads)->ThreadPerCpu();

void BM_GlibcSchedGetcpuThreads(benchmark::State& state) {
  run_batches(state, percpu_bench_loop_glibc_sched_getcpu);
}
BENCHMARK(BM_GlibcSchedGetcpuThreads)->ThreadPerCpu();

}  // namespace
}  // namespace percpu
