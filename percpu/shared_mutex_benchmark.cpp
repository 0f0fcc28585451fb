// percpu::shared_mutex against the alternatives, at 1 and 2 threads:
//   Read/Percpu       lock_shared + unlock_shared
//   Read/PercpuFences the same on a mutex that chose fence mode (membarrier
//                     hidden from it, as under seccomp or valgrind)
//   Read/StdShared    std::shared_mutex
//   Read/Pthread      pthread_rwlock_t
//   Read/TbbSpin      tbb::spin_rw_mutex (when TBB is installed)
//   Read/UrcuMemb     urcu_memb_read_lock/unlock, the read side of liburcu's
//                     membarrier flavour (when liburcu is installed)
//   WriteLatency/*    lock + unlock by one writer while another thread reads
//                     in a loop; reports the median and p99 in microseconds
//
// Compare ratios within one run, e.g.
//   shared_mutex_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// and read the medians.

#include <benchmark/benchmark.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "percpu/shared_mutex.hpp"

#if defined(PERCPU_HAVE_TBB)
#include <tbb/spin_rw_mutex.h>
#endif
#if defined(PERCPU_HAVE_URCU)
#define _LGPL_SOURCE 1  // liburcu's inline read side, as its users get it
#include <urcu/urcu-memb.h>
#endif

namespace {

percpu::shared_mutex g_percpu;
std::shared_mutex g_std;
pthread_rwlock_t g_pthread = PTHREAD_RWLOCK_INITIALIZER;
#if defined(PERCPU_HAVE_TBB)
tbb::spin_rw_mutex g_tbb;
#endif

void label(benchmark::State& state) {
  if (state.thread_index() == 0) {
    state.SetLabel(std::string("backend=") + percpu::to_string(percpu::backend()));
  }
}

void BM_Read_Percpu(benchmark::State& state) {
  label(state);
  for (auto _ : state) {
    g_percpu.lock_shared();
    g_percpu.unlock_shared();
  }
  state.SetItemsProcessed(state.iterations());
}

// A mutex chooses its mode at its first use; this one makes that choice
// while membarrier is hidden, and keeps it.
percpu::shared_mutex& fence_mode_mutex() {
  static percpu::shared_mutex* m = [] {
    auto* made = new percpu::shared_mutex;
    percpu::internal::simulate_missing_membarrier(true);
    made->lock_shared();
    made->unlock_shared();
    percpu::internal::simulate_missing_membarrier(false);
    return made;
  }();
  return *m;
}

void BM_Read_PercpuFences(benchmark::State& state) {
  label(state);
  percpu::shared_mutex& m = fence_mode_mutex();
  for (auto _ : state) {
    m.lock_shared();
    m.unlock_shared();
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Read_StdShared(benchmark::State& state) {
  for (auto _ : state) {
    g_std.lock_shared();
    g_std.unlock_shared();
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Read_Pthread(benchmark::State& state) {
  for (auto _ : state) {
    pthread_rwlock_rdlock(&g_pthread);
    pthread_rwlock_unlock(&g_pthread);
  }
  state.SetItemsProcessed(state.iterations());
}

#if defined(PERCPU_HAVE_TBB)
void BM_Read_TbbSpin(benchmark::State& state) {
  for (auto _ : state) {
    g_tbb.lock_shared();
    g_tbb.unlock_shared();
  }
  state.SetItemsProcessed(state.iterations());
}
#endif

#if defined(PERCPU_HAVE_URCU)
void BM_Read_UrcuMemb(benchmark::State& state) {
  urcu_memb_register_thread();
  for (auto _ : state) {
    urcu_memb_read_lock();
    urcu_memb_read_unlock();
  }
  urcu_memb_unregister_thread();
  state.SetItemsProcessed(state.iterations());
}
#endif

// Writer latency: one writer times each lock+unlock while a reader thread
// takes the read lock in a loop.
template <typename Lock, typename Unlock, typename ReadLock, typename ReadUnlock>
void write_latency(benchmark::State& state, Lock lock, Unlock unlock, ReadLock read_lock,
                   ReadUnlock read_unlock) {
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      read_lock();
      read_unlock();
    }
  });
  std::vector<double> samples;
  samples.reserve(1 << 16);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    lock();
    unlock();
    const auto end = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  stop.store(true);
  reader.join();
  std::sort(samples.begin(), samples.end());
  if (!samples.empty()) {
    state.counters["median_us"] = samples[samples.size() / 2];
    state.counters["p99_us"] = samples[samples.size() * 99 / 100];
  }
}

void BM_WriteLatency_Percpu(benchmark::State& state) {
  write_latency(
      state, [] { g_percpu.lock(); }, [] { g_percpu.unlock(); }, [] { g_percpu.lock_shared(); },
      [] { g_percpu.unlock_shared(); });
}

void BM_WriteLatency_StdShared(benchmark::State& state) {
  write_latency(
      state, [] { g_std.lock(); }, [] { g_std.unlock(); }, [] { g_std.lock_shared(); },
      [] { g_std.unlock_shared(); });
}

}  // namespace

BENCHMARK(BM_Read_Percpu)->Threads(1)->Threads(2);
BENCHMARK(BM_Read_PercpuFences)->Threads(1)->Threads(2);
BENCHMARK(BM_Read_StdShared)->Threads(1)->Threads(2);
BENCHMARK(BM_Read_Pthread)->Threads(1)->Threads(2);
#if defined(PERCPU_HAVE_TBB)
BENCHMARK(BM_Read_TbbSpin)->Threads(1)->Threads(2);
#endif
#if defined(PERCPU_HAVE_URCU)
BENCHMARK(BM_Read_UrcuMemb)->Threads(1)->Threads(2);
#endif
BENCHMARK(BM_WriteLatency_Percpu)->Iterations(2000)->UseRealTime();
BENCHMARK(BM_WriteLatency_StdShared)->Iterations(2000)->UseRealTime();
