// object_pool allocate + deallocate against the process's malloc/free of the
// same size, in one run of one process.
//
// The same source is built three times: object_pool_benchmark (glibc malloc),
// object_pool_benchmark_jemalloc (linked with -ljemalloc) and
// object_pool_benchmark_tcmalloc (linked with -ltcmalloc_minimal), which is
// how those allocators are normally loaded: they replace malloc and free.
// Each binary names the malloc it measured in its context line, and
// BM_Pool_* / BM_Malloc_* in one run give the ratio.
//
// BM_FirstTrimInFreshProcess measures something else: the latency of the
// first trim() of a new process whose threads already use a pool, the first
// access that needs a membarrier fence. Each iteration runs this binary again
// as a child that does only that and reports the trim's wall time.

#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
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

// ---- the first remote access -------------------------------------------------

constexpr const char* kFirstTrimFd = "PERCPU_BENCH_FIRST_TRIM_FD";

// The child's side, before main: start threads as a program would, create a
// pool they use, then time the first trim(). Writes the nanoseconds to the
// pipe named by kFirstTrimFd and exits.
const bool g_first_trim_child = [] {
  const char* fd_text = std::getenv(kFirstTrimFd);
  if (fd_text == nullptr) return false;
  const int fd = std::atoi(fd_text);
  std::atomic<percpu::object_pool*> shared{nullptr};
  std::atomic<bool> stop{false};
  std::atomic<int> used{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      percpu::object_pool* p = nullptr;
      while ((p = shared.load()) == nullptr) std::this_thread::yield();
      bool counted = false;
      while (!stop.load(std::memory_order_relaxed)) {
        void* x = p->allocate();
        p->deallocate(x);
        if (!counted) {
          counted = true;
          used.fetch_add(1);
        }
      }
    });
  }
  percpu::object_pool pool(kSize);
  shared.store(&pool);
  while (used.load() < 2) std::this_thread::yield();
  pool.deallocate(pool.allocate());
  const auto start = std::chrono::steady_clock::now();
  pool.trim();
  const auto stop_time = std::chrono::steady_clock::now();
  stop.store(true);
  for (std::thread& t : threads) t.join();
  const std::int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(stop_time - start).count();
  const bool written = write(fd, &ns, sizeof(ns)) == static_cast<ssize_t>(sizeof(ns));
  _exit(written ? 0 : 1);
}();

void BM_FirstTrimInFreshProcess(benchmark::State& state) {
  for (auto _ : state) {
    int fds[2];
    if (pipe(fds) != 0) {
      state.SkipWithError("pipe failed");
      return;
    }
    const std::string variable = std::string(kFirstTrimFd) + "=" + std::to_string(fds[1]);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      putenv(const_cast<char*>(variable.c_str()));
      char self[] = "/proc/self/exe";
      char* argv[] = {self, nullptr};
      execv(self, argv);
      _exit(127);
    }
    close(fds[1]);
    std::int64_t ns = -1;
    const bool read_all = read(fds[0], &ns, sizeof(ns)) == static_cast<ssize_t>(sizeof(ns));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (pid < 0 || !read_all || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      state.SkipWithError("the child did not report a trim");
      return;
    }
    state.SetIterationTime(static_cast<double>(ns) * 1e-9);
  }
}

BENCHMARK(BM_FirstTrimInFreshProcess)
    ->UseManualTime()
    ->Iterations(10)
    ->Repetitions(3)
    ->Unit(benchmark::kMillisecond);

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
