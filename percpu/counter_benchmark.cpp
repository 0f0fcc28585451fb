// percpu::counter::add against the alternatives, at 1, 2 and 12 threads:
//   SharedAtomic     one std::atomic, fetch_add from every thread
//   PerCpuAtomic     one cache-line atomic per CPU, indexed by cpu_id()
//   CounterAdd       percpu::counter (rseq add on the CPU's slot)
//   ThreadLocal      a plain thread_local increment in memory: the limit
//   CidCounterAdd    percpu::cid_counter (rseq add on the concurrency id's slot)
// and the readers, each sum once two threads have added:
//   CounterLoad      percpu::counter::load(): max_cpus() slots
//   CidCounterLoad   percpu::cid_counter::load(): the ids used so far
// On a host whose possible-CPU list is long, or with one bind-mounted over
// sysfs's (docs/results.md, "Concurrency id"), the two loads part ways.
//
// Compare ratios within one run, e.g.
//   counter_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// and read the medians.

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"

namespace {

percpu::counter g_counter;
percpu::cid_counter g_cid_counter;
percpu::counter g_read_counter;
percpu::cid_counter g_read_cid_counter;
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

void BM_CidCounterAdd(benchmark::State& state) {
  label(state);
  for (auto _ : state) g_cid_counter.add(1);
  state.SetItemsProcessed(state.iterations());
}

void BM_CounterLoad(benchmark::State& state) {
  state.SetLabel("slots=" + std::to_string(percpu::max_cpus()));
  for (auto _ : state) benchmark::DoNotOptimize(g_read_counter.load());
}

void BM_CidCounterLoad(benchmark::State& state) {
  state.SetLabel("limit=" + std::to_string(percpu::internal::concurrency_limit()));
  for (auto _ : state) benchmark::DoNotOptimize(g_read_cid_counter.load());
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
BENCHMARK(BM_CidCounterAdd)->Threads(1)->Threads(2)->Threads(12);
BENCHMARK(BM_CounterLoad);
BENCHMARK(BM_CidCounterLoad);

void add_to_read_counters() {
  for (int i = 0; i < 1000; ++i) {
    g_read_counter.add(1);
    g_read_cid_counter.add(1);
  }
}

struct setup {
  setup() {
    g_per_cpu.reset(new padded_atomic[static_cast<std::size_t>(percpu::max_cpus())]);
    g_counter.add(0);  // map the slots outside the timed loops
    g_cid_counter.add(0);
    // The readers' counters: two threads add to each, as the issue's
    // two-thread process would.
    std::thread a([] { add_to_read_counters(); });
    std::thread b([] { add_to_read_counters(); });
    a.join();
    b.join();
  }
} g_setup;

}  // namespace
