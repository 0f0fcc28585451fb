// percpu::ref get+put against the alternatives, at 1 and 2 threads:
//   GetPut/Percpu      percpu::ref before kill(): the CPU's slot
//   GetPut/Atomic      one std::atomic reference count, fetch_add + fetch_sub
//   GetPut/SharedPtr   copying and dropping a std::shared_ptr
//   GetPut/Killed      percpu::ref after kill(): its atomic count
//
// Compare ratios within one run, e.g.
//   ref_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// and read the medians.

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "percpu/cpu.hpp"
#include "percpu/ref.hpp"

namespace {

percpu::ref* g_ref = new percpu::ref(nullptr);
percpu::ref* g_killed = [] {
  percpu::ref* r = new percpu::ref(nullptr);
  r->get();  // stays alive: the owner's reference goes with kill()
  r->kill();
  return r;
}();
alignas(64) std::atomic<std::int64_t> g_atomic{1};
std::shared_ptr<int> g_shared = std::make_shared<int>(0);

void BM_GetPut_Percpu(benchmark::State& state) {
  if (state.thread_index() == 0) {
    state.SetLabel(std::string("backend=") + percpu::to_string(percpu::backend()));
  }
  for (auto _ : state) {
    g_ref->get();
    g_ref->put();
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_GetPut_Atomic(benchmark::State& state) {
  for (auto _ : state) {
    g_atomic.fetch_add(1, std::memory_order_relaxed);
    g_atomic.fetch_sub(1, std::memory_order_acq_rel);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_GetPut_SharedPtr(benchmark::State& state) {
  for (auto _ : state) {
    std::shared_ptr<int> copy = g_shared;
    benchmark::DoNotOptimize(copy);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_GetPut_Killed(benchmark::State& state) {
  for (auto _ : state) {
    g_killed->get();
    g_killed->put();
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(BM_GetPut_Percpu)->Threads(1)->Threads(2);
BENCHMARK(BM_GetPut_Atomic)->Threads(1)->Threads(2);
BENCHMARK(BM_GetPut_SharedPtr)->Threads(1)->Threads(2);
BENCHMARK(BM_GetPut_Killed)->Threads(1)->Threads(2);
