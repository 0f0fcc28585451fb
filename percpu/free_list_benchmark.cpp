// free_list push + pop against a mutex-guarded stack and a lock-free Treiber
// stack with a tagged head (a 32-bit node index and a 32-bit ABA tag packed
// in one 64-bit word), with 1 and 2 threads, in one run.

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "percpu/cpu.hpp"
#include "percpu/free_list.hpp"

namespace {

constexpr int kMaxThreads = 64;
constexpr int kNodesPerThread = 8;

percpu::free_list& shared_list() {
  static percpu::free_list* list = new percpu::free_list;
  return *list;
}

void BM_FreeList_PushPop(benchmark::State& state) {
  percpu::free_list& list = shared_list();
  static percpu::free_list_node nodes[kMaxThreads];
  percpu::free_list_node* mine = &nodes[state.thread_index() % kMaxThreads];
  for (auto _ : state) {
    list.push(mine);
    // pop() may come back empty while another thread's steal holds the
    // nodes for a moment (it never waits); pushing nullptr next would crash.
    do {
      mine = list.pop();
    } while (mine == nullptr);
    benchmark::DoNotOptimize(mine);
  }
}

// The classic alternative: one intrusive stack behind one mutex.
struct mutex_stack {
  std::mutex mutex;
  percpu::free_list_node* head = nullptr;
  void push(percpu::free_list_node* n) {
    std::lock_guard<std::mutex> lock(mutex);
    n->next = head;
    head = n;
  }
  percpu::free_list_node* pop() {
    std::lock_guard<std::mutex> lock(mutex);
    percpu::free_list_node* n = head;
    if (n != nullptr) head = n->next;
    return n;
  }
};

void BM_MutexStack_PushPop(benchmark::State& state) {
  static mutex_stack stack;
  static percpu::free_list_node nodes[kMaxThreads];
  percpu::free_list_node* mine = &nodes[state.thread_index() % kMaxThreads];
  for (auto _ : state) {
    stack.push(mine);
    mine = stack.pop();
    benchmark::DoNotOptimize(mine);
  }
  if (mine == nullptr) state.SkipWithError("pop came back empty");
}

// Lock-free Treiber stack over an array of nodes. The head packs the index
// of the top node (plus one; zero is empty) with a tag bumped by every
// change, so a pop's compare-and-swap fails if the head went away and came
// back (ABA).
struct treiber_stack {
  struct node {
    std::atomic<std::uint32_t> next{0};
  };
  std::atomic<std::uint64_t> head{0};
  node nodes[kMaxThreads * kNodesPerThread];

  void push(std::uint32_t index) {
    std::uint64_t old = head.load(std::memory_order_relaxed);
    std::uint64_t desired;
    do {
      nodes[index].next.store(static_cast<std::uint32_t>(old), std::memory_order_relaxed);
      desired = ((old >> 32) + 1) << 32 | (index + 1);
    } while (!head.compare_exchange_weak(old, desired, std::memory_order_release,
                                         std::memory_order_relaxed));
  }
  // Returns the popped index, or -1 when empty.
  long pop() {
    std::uint64_t old = head.load(std::memory_order_acquire);
    for (;;) {
      const std::uint32_t top = static_cast<std::uint32_t>(old);
      if (top == 0) return -1;
      const std::uint32_t next = nodes[top - 1].next.load(std::memory_order_relaxed);
      const std::uint64_t desired = ((old >> 32) + 1) << 32 | next;
      if (head.compare_exchange_weak(old, desired, std::memory_order_acquire,
                                     std::memory_order_acquire)) {
        return top - 1;
      }
    }
  }
};

void BM_TreiberTagged_PushPop(benchmark::State& state) {
  static treiber_stack stack;
  long mine = state.thread_index() % kMaxThreads;
  for (auto _ : state) {
    stack.push(static_cast<std::uint32_t>(mine));
    mine = stack.pop();
    benchmark::DoNotOptimize(mine);
  }
  if (mine < 0) state.SkipWithError("pop came back empty");
}

BENCHMARK(BM_FreeList_PushPop)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_MutexStack_PushPop)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_TreiberTagged_PushPop)->Threads(1)->Threads(2)->UseRealTime();

const bool g_context = [] {
  benchmark::AddCustomContext("percpu_backend", percpu::to_string(percpu::backend()));
  return true;
}();

}  // namespace
