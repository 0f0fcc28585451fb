// percpu::counter::add against the alternatives, at 1, 2 and 12 threads:
//   SharedAtomic     one std::atomic, fetch_add from every thread
//   PerCpuAtomic     one cache-line atomic per CPU, indexed by cpu_id()
//   CounterAdd       percpu::counter (rseq add on the CPU's slot)
//   ThreadLocal      a plain thread_local increment in memory: the limit
//
// Compare ratios within one run, e.g.
//   counter_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// and read the medians.

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"

namespace {

percpu::counter g_counter;
std::atomic<std::int64_t> g_shared{0};

struct alignas(64) padded_atomic {
  std::atomic<std::int64_t> value{0};
};
std::unique_ptr<padded_atomic[]> g_per_cpu;

thread_local std::int64_t t_local = 0;

void label(benchmark::State& state) {
  if (state.thread_index() == 0) {
    state.SetLabel(std::string("backend=") + percpu::to_string(percpu::backend()));
  }
}

void BM_SharedAtomic(benchmark::State& state) {
  for (auto _ : state) g_shared.fetch_add(1, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
}

void BM_PerCpuAtomic(benchmark::State& state) {
  padded_atomic* slots = g_per_cpu.get();
  for (auto _ : state) slots[percpu::cpu_id()].value.fetch_add(1, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
}

void BM_CounterAdd(benchmark::State& state) {
  label(state);
  for (auto _ : state) g_counter.add(1);
  state.SetItemsProcessed(state.iterations());
}

void BM_ThreadLocal(benchmark::State& state) {
  for (auto _ : state) {
    ++t_local;
    benchmark::ClobberMemory();  // keep the increment in memory, as a counter's must be
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_SharedAtomic)->Threads(1)->Threads(2)->Threads(12);
BENCHMARK(BM_PerCpuAtomic)->Threads(1)->Threads(2)->Threads(12);
BENCHMARK(BM_CounterAdd)->Threads(1)->Threads(2)->Threads(12);
BENCHMARK(BM_ThreadLocal)->Threads(1)->Threads(2)->Threads(12);

struct setup {
  setup() {
    g_per_cpu.reset(new padded_atomic[static_cast<std::size_t>(percpu::max_cpus())]);
    g_counter.add(0);  // map the slots outside the timed loops
  }
} g_setup;

}  // namespace
