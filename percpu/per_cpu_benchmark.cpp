// percpu::per_cpu<T> and cid_per_cpu<T> against the alternative, at 1, 2
// and 12 threads:
//   PerCpuAdd        per_cpu<T>::add (rseq add on the CPU's copy)
//   CidPerCpuAdd     cid_per_cpu<T>::add (rseq add on the concurrency id's copy)
//   SharedAtomic     one std::atomic field, fetch_add from every thread
// and the readers, each a sum once two threads have added:
//   PerCpuSum        per_cpu<T>::sum(): max_cpus() copies of each set
//   CidPerCpuSum     cid_per_cpu<T>::sum(): the ids used so far
// With the possible-CPU list bind-mounted to 0-4095 (docs/results.md,
// "Concurrency id") the two sums part ways.
//
// Compare ratios within one run, e.g.
//   per_cpu_benchmark --benchmark_repetitions=9 --benchmark_report_aggregates_only=true
// and read the medians.

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "percpu/cpu.hpp"
#include "percpu/internal/concurrency_limit.hpp"
#include "percpu/per_cpu.hpp"

namespace {

struct stats {
  std::int64_t requests, bytes;
};

percpu::per_cpu<stats> g_by_cpu;
percpu::cid_per_cpu<stats> g_by_id;
percpu::per_cpu<stats> g_read_by_cpu;
percpu::cid_per_cpu<stats> g_read_by_id;
std::atomic<std::int64_t> g_shared{0};

void BM_PerCpuAdd(benchmark::State& state) {
  for (auto _ : state) g_by_cpu.add(&stats::bytes, 1);
  state.SetItemsProcessed(state.iterations());
}

void BM_CidPerCpuAdd(benchmark::State& state) {
  for (auto _ : state) g_by_id.add(&stats::bytes, 1);
  state.SetItemsProcessed(state.iterations());
}

void BM_SharedAtomic(benchmark::State& state) {
  for (auto _ : state) g_shared.fetch_add(1, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
}

void BM_PerCpuSum(benchmark::State& state) {
  state.SetLabel("copies=" + std::to_string(percpu::max_cpus()));
  for (auto _ : state) benchmark::DoNotOptimize(g_read_by_cpu.sum(&stats::bytes));
}

void BM_CidPerCpuSum(benchmark::State& state) {
  state.SetLabel("limit=" + std::to_string(percpu::internal::concurrency_limit()));
  for (auto _ : state) benchmark::DoNotOptimize(g_read_by_id.sum(&stats::bytes));
}

BENCHMARK(BM_PerCpuAdd)->Threads(1)->Threads(2)->Threads(12);
BENCHMARK(BM_CidPerCpuAdd)->Threads(1)->Threads(2)->Threads(12);
BENCHMARK(BM_SharedAtomic)->Threads(1)->Threads(2)->Threads(12);
BENCHMARK(BM_PerCpuSum);
BENCHMARK(BM_CidPerCpuSum);

void add_to_read_objects() {
  for (int i = 0; i < 1000; ++i) {
    g_read_by_cpu.add(&stats::bytes, 1);
    g_read_by_id.add(&stats::bytes, 1);
  }
}

struct setup {
  setup() {
    g_by_cpu.add(&stats::bytes, 0);  // take the copies outside the timed loops
    g_by_id.add(&stats::bytes, 0);
    // The readers' objects: two threads add to each, as a two-thread
    // process would.
    std::thread a([] { add_to_read_objects(); });
    std::thread b([] { add_to_read_objects(); });
    a.join();
    b.join();
  }
} g_setup;

}  // namespace
