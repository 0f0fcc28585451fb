// object_pool allocate + deallocate against the process's malloc/free of the
// same size, in one run of one process.
//
// The same source is built three times: object_pool_benchmark (glibc malloc),
// object_pool_benchmark_jemalloc (linked with -ljemalloc) and
// object_pool_benchmark_tcmalloc (linked with -ltcmalloc_minimal), which is
// how those allocators are normally loaded: they replace malloc and free.
// Each binary names the malloc it measured in its context line, and
// BM_Pool_* / BM_Malloc_* in one run give the ratio.

#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "percpu/cpu.hpp"
#include "percpu/object_pool.hpp"

namespace {

constexpr std::size_t kSize = 64;
constexpr int kBurst = 32;

const char* which_malloc() {
  if (dlsym(RTLD_DEFAULT, "mallocx") != nullptr) return "jemalloc";
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  return "glibc";
}

percpu::object_pool& pool() {
  static percpu::object_pool* p = [] {
    percpu::object_pool::options o;
    o.object_size = kSize;
    o.checks = false;
    return new percpu::object_pool(o);
  }();
  return *p;
}

void BM_Pool_AllocateDeallocatePair(benchmark::State& state) {
  percpu::object_pool& p = pool();
  for (auto _ : state) {
    void* x = p.allocate();
    benchmark::DoNotOptimize(x);
    p.deallocate(x);
  }
}

void BM_Malloc_AllocateDeallocatePair(benchmark::State& state) {
  for (auto _ : state) {
    void* x = std::malloc(kSize);
    benchmark::DoNotOptimize(x);
    std::free(x);
  }
}

// kBurst objects live at once, then freed in reverse: exercises refills and
// spills of the pool's caches as well as the fast path.
void BM_Pool_Burst(benchmark::State& state) {
  percpu::object_pool& p = pool();
  void* held[kBurst];
  for (auto _ : state) {
    for (int i = 0; i < kBurst; ++i) held[i] = p.allocate();
    benchmark::DoNotOptimize(held);
    for (int i = kBurst - 1; i >= 0; --i) p.deallocate(held[i]);
  }
  state.SetItemsProcessed(state.iterations() * kBurst);
}

void BM_Malloc_Burst(benchmark::State& state) {
  void* held[kBurst];
  for (auto _ : state) {
    for (int i = 0; i < kBurst; ++i) held[i] = std::malloc(kSize);
    benchmark::DoNotOptimize(held);
    for (int i = kBurst - 1; i >= 0; --i) std::free(held[i]);
  }
  state.SetItemsProcessed(state.iterations() * kBurst);
}

BENCHMARK(BM_Pool_AllocateDeallocatePair)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Malloc_AllocateDeallocatePair)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Pool_Burst)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Malloc_Burst)->Threads(1)->Threads(2)->UseRealTime();

const bool g_context = [] {
  benchmark::AddCustomContext("malloc", which_malloc());
  benchmark::AddCustomContext("percpu_backend", percpu::to_string(percpu::backend()));
  return true;
}();

}  // namespace
