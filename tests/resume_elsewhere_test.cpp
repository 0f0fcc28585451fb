// Code that continues on another thread in the middle of a function: a C++20
// coroutine resumed by another thread, and a fiber (ucontext) switched in by
// another thread. percpu's inline paths must read the thread pointer afresh
// after the switch; a value kept from before would aim the new thread's
// critical sections at the old thread's rseq area, so they would neither be
// restarted on preemption nor commit on the CPU they checked.
//
// Each test pins thread A to the first test CPU and thread B to the second,
// moves one piece of code back and forth between them many times, and runs
// hammer threads pinned to A's CPU that use the same structure meanwhile. An
// update committed from B's CPU into A's slot without protection races with
// the hammers and is lost: the totals below are exact or the test fails.
#include <ucontext.h>

#include <atomic>
#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/free_list.hpp"
#include "percpu/object_pool.hpp"
#include "percpu/ref.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "tests/stress/stress.hpp"

namespace {

using percpu::stress::restrict_to;
using percpu::stress::test_cpus;

// A thread that runs whatever is handed to it, in order.
class executor {
 public:
  explicit executor(int cpu) : thread_([this, cpu] { run(cpu); }) {}
  ~executor() {
    post(nullptr);
    thread_.join();
  }
  void post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
    }
    wake_.notify_one();
  }
  int cpu() const { return cpu_; }

 private:
  void run(int cpu) {
    if (cpu >= 0) restrict_to({cpu});
    cpu_ = cpu;
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!work) return;
      work();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  int cpu_ = -1;
  std::thread thread_;
};

// co_await resume_on{e}: suspends and is resumed by executor e's thread.
struct resume_on {
  executor& target;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    target.post([h] { h.resume(); });
  }
  void await_resume() const noexcept {}
};

// A fire-and-forget coroutine that signals `done` when it returns.
struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

struct done_flag {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  void set() {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return done; });
  }
};

// A coroutine that signals done on one executor was resumed there by a task
// of the other, which may still be inside post() (signalling the first one's
// condition variable) when the test goes on. An executor runs its tasks in
// order: once a later task of that other executor has run, the post() has
// returned, and the executors may go.
void wait_until_idle(executor& resumer) {
  done_flag idle;
  resumer.post([&] { idle.set(); });
  idle.wait();
}

// Threads pinned to `cpu` that call `body` until stopped.
class hammers {
 public:
  hammers(int count, int cpu, std::function<void()> body) {
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, cpu, body] {
        restrict_to({cpu});
        while (!stop_.load(std::memory_order_relaxed)) body();
      });
    }
  }
  void stop() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  ~hammers() {
    if (!threads_.empty()) stop();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

long rounds() { return percpu::stress::scaled(4000L); }
constexpr int kAddsPerVisit = 64;

percpu::counter g_coroutine_counter;

task add_while_moving(percpu::counter& c, executor& a, executor& b, long n, done_flag& done) {
  for (long i = 0; i < n; ++i) {
    c.add(1);
    co_await resume_on{b};
    for (int k = 0; k < kAddsPerVisit; ++k) c.add(1);
    co_await resume_on{a};
    for (int k = 0; k < kAddsPerVisit; ++k) c.add(1);
  }
  done.set();
}

TEST(ResumeElsewhere, CoroutineCounterIsExact) {
  const std::vector<int> cpus = test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs to move between";
  std::atomic<long> hammered{0};
  {
    executor a(cpus[0]), b(cpus[1]);
    hammers h(2, cpus[0], [&] {
      g_coroutine_counter.add(1);
      hammered.fetch_add(1, std::memory_order_relaxed);
    });
    done_flag done;
    const long n = rounds();
    a.post([&] { add_while_moving(g_coroutine_counter, a, b, n, done); });
    done.wait();
    wait_until_idle(b);
    h.stop();
    EXPECT_EQ(g_coroutine_counter.load(), n * (1 + 2 * kAddsPerVisit) + hammered.load())
        << "updates were lost: a section ran on another thread's rseq area";
  }
}

struct node {
  percpu::free_list_node link;  // first member: the list hands back its address
  std::atomic<std::uint64_t> owner{0};
};

node* as_node(percpu::free_list_node* n) { return reinterpret_cast<node*>(n); }

// Takes a node, marks it as held by a fresh owner, checks nobody else marked
// it meanwhile, and gives it back. False when the node was held twice.
bool hold_and_return(percpu::free_list& list, percpu::free_list_node* n,
                     std::atomic<std::uint64_t>& next_owner) {
  const std::uint64_t me = next_owner.fetch_add(1);
  node* held = as_node(n);
  held->owner.store(me);
  for (int spin = 0; spin < 16; ++spin) asm volatile("" ::: "memory");
  const bool alone = held->owner.load() == me;
  list.push(n);
  return alone;
}

task cycle_while_moving(percpu::free_list& list, executor& a, executor& b, long n,
                        std::atomic<std::uint64_t>& next_owner, std::atomic<long>& doubled,
                        done_flag& done) {
  for (long i = 0; i < n; ++i) {
    percpu::free_list_node* mine = list.pop();
    co_await resume_on{b};
    if (mine != nullptr && !hold_and_return(list, mine, next_owner)) doubled.fetch_add(1);
    mine = list.pop();
    co_await resume_on{a};
    if (mine != nullptr && !hold_and_return(list, mine, next_owner)) doubled.fetch_add(1);
  }
  done.set();
}

// Every node is either in the list or held by exactly one user: at the end
// all of them are back, and no node was ever handed to two users at once.
TEST(ResumeElsewhere, CoroutineFreeListLosesNoNode) {
  const std::vector<int> cpus = test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs to move between";
  constexpr int kNodes = 64;
  std::vector<node> nodes(kNodes);
  percpu::free_list list;
  for (node& n : nodes) list.push(&n.link);
  std::atomic<long> doubled{0};
  std::atomic<std::uint64_t> next_owner{1};
  {
    executor a(cpus[0]), b(cpus[1]);
    hammers h(2, cpus[0], [&] {
      percpu::free_list_node* n = list.pop();
      if (n != nullptr && !hold_and_return(list, n, next_owner)) doubled.fetch_add(1);
    });
    done_flag done;
    a.post([&] { cycle_while_moving(list, a, b, rounds(), next_owner, doubled, done); });
    done.wait();
    wait_until_idle(b);
    h.stop();
  }
  // pop(), not take_all(): a list corrupted into a cycle then shows up as too
  // many nodes instead of a walk that never ends.
  long count = 0;
  if (percpu::backend() == percpu::cpu_backend::rseq &&
      percpu::sections_status() == percpu::sections::on &&
      !percpu::internal::slot_fence_available()) {
    // Without membarrier's RSEQ fence pop() never steals (free_list.hpp):
    // the nodes are counted from each CPU's list, popped on that CPU.
    std::printf("CoroutineFreeListLosesNoNode: no membarrier RSEQ fence: counted on each CPU\n");
    const std::vector<int> saved = percpu::stress::allowed_cpus();
    for (int cpu : saved) {
      if (!restrict_to({cpu})) continue;
      while (count <= 2 * kNodes && list.pop() != nullptr) ++count;
    }
    restrict_to(saved);
  } else {
    std::printf("CoroutineFreeListLosesNoNode: counted with pop() and its steals\n");
  }
  while (count <= 2 * kNodes && list.pop() != nullptr) ++count;
  EXPECT_EQ(count, kNodes) << "nodes were lost or duplicated";
  EXPECT_EQ(doubled.load(), 0) << "one node was handed to two users at once";
}

// The thread pointer itself (internal/thread_pointer.hpp), which the inline
// paths that still go through section_area() read: read after a move, it is
// the new thread's, never the one from before the move.
task note_thread_pointers(executor& b, char** before, char** after, done_flag& done) {
  *before = percpu::internal::thread_pointer();
  co_await resume_on{b};
  *after = percpu::internal::thread_pointer();
  done.set();
}

TEST(ResumeElsewhere, ThreadPointerIsReadAfterTheMove) {
  const std::vector<int> cpus = test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs to move between";
  executor a(cpus[0]), b(cpus[1]);
  char* before = nullptr;
  char* after = nullptr;
  char* b_own = nullptr;
  done_flag noted, done;
  b.post([&] {
    b_own = percpu::internal::thread_pointer();
    noted.set();
  });
  noted.wait();
  a.post([&] { note_thread_pointers(b, &before, &after, done); });
  done.wait();
  // Here the coroutine ends on b, resumed by a's task.
  wait_until_idle(a);
  EXPECT_NE(before, after) << "the thread pointer was kept across the move";
  EXPECT_EQ(after, b_own) << "not the thread the coroutine resumed on";
}

// object_pool::deallocate() still finds its area through the thread
// pointer (section_area()), where free_list's and allocate()'s started
// sections are %fs-relative throughout: a coroutine frees on both sides of
// each move, so a thread pointer kept across the move would arm the
// previous thread's area and commit on that thread's CPU, racing the
// hammers there.
struct pool_object {
  std::atomic<std::uint64_t> owner{0};
  char pad[56];
};

// Marks `p` as held by a fresh owner; false when another user marked it
// meanwhile. The caller frees it.
bool hold(void* p, std::atomic<std::uint64_t>& next_owner) {
  const std::uint64_t me = next_owner.fetch_add(1);
  auto* held = static_cast<pool_object*>(p);
  held->owner.store(me);
  for (int spin = 0; spin < 16; ++spin) asm volatile("" ::: "memory");
  return held->owner.load() == me;
}

// The frees are in the coroutine's own body, on both sides of each move.
task free_while_moving(percpu::object_pool& pool, executor& a, executor& b, long n,
                       std::atomic<std::uint64_t>& next_owner, std::atomic<long>& doubled,
                       done_flag& done) {
  for (long i = 0; i < n; ++i) {
    void* p = pool.allocate();
    if (p != nullptr && !hold(p, next_owner)) doubled.fetch_add(1);
    pool.deallocate(p);
    co_await resume_on{b};
    p = pool.allocate();
    if (p != nullptr && !hold(p, next_owner)) doubled.fetch_add(1);
    pool.deallocate(p);
    co_await resume_on{a};
  }
  done.set();
}

// No object is ever handed to two users at once, and every object carved
// is back in the pool at the end.
TEST(ResumeElsewhere, CoroutinePoolHandsNoObjectOutTwice) {
  const std::vector<int> cpus = test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs to move between";
  percpu::object_pool pool(sizeof(pool_object));
  std::atomic<long> doubled{0};
  std::atomic<std::uint64_t> next_owner{1};
  {
    executor a(cpus[0]), b(cpus[1]);
    hammers h(2, cpus[0], [&] {
      void* p = pool.allocate();
      if (p != nullptr && !hold(p, next_owner)) doubled.fetch_add(1);
      pool.deallocate(p);
    });
    done_flag done;
    a.post([&] { free_while_moving(pool, a, b, rounds(), next_owner, doubled, done); });
    done.wait();
    wait_until_idle(b);
    h.stop();
  }
  EXPECT_EQ(doubled.load(), 0) << "one object was handed to two users at once";
}

task get_while_moving(percpu::ref& r, executor& from, executor& to, long n, done_flag& done) {
  for (long i = 0; i < n; ++i) {
    for (int k = 0; k < kAddsPerVisit; ++k) r.get();
    co_await resume_on{to};
    for (int k = 0; k < kAddsPerVisit; ++k) r.get();
    co_await resume_on{from};
  }
  done.set();
}

// Two coroutines moving in opposite directions, so that while one runs on
// B the other runs on A: a get that used the thread it started on (its
// CPU's word from a section armed on that thread's rseq area, or, without
// rseq, that thread's own word by an index kept from before the move)
// would add to a word the other coroutine is adding to at that moment, and
// lose updates. Every reference is counted: count() is exact once nobody
// moves it, and kill() after the matching puts releases at once.
TEST(ResumeElsewhere, CoroutinesRefCountsEveryGet) {
  const std::vector<int> cpus = test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs to move between";
  std::atomic<int> released{0};
  percpu::ref r([](void* calls) { static_cast<std::atomic<int>*>(calls)->fetch_add(1); },
                &released);
  const long n = rounds() / 4;
  {
    executor a(cpus[0]), b(cpus[1]);
    hammers h(2, cpus[0], [&] {
      r.get();
      r.put();
    });
    done_flag there, back;
    a.post([&] { get_while_moving(r, a, b, n, there); });
    b.post([&] { get_while_moving(r, b, a, n, back); });
    there.wait();
    back.wait();
    wait_until_idle(a);
    wait_until_idle(b);
    h.stop();
  }
  const std::int64_t gets = 2 * n * 2 * kAddsPerVisit;
  EXPECT_EQ(r.count(), 1 + gets) << "gets were lost or counted twice after a move";
  for (std::int64_t i = 0; i < gets; ++i) r.put();
  r.kill();
  EXPECT_EQ(released.load(), 1);
}

// A fiber: its own stack and context, switched in by whichever thread runs
// the scheduler loop below. swapcontext is an ordinary call to the compiler,
// which may keep values such as the thread pointer across it.
struct fiber {
  ucontext_t self{}, caller{};
  std::vector<char> stack = std::vector<char>(256 * 1024);
  bool finished = false;
  long n = 0;
  percpu::counter* c = nullptr;
};

fiber* g_fiber = nullptr;

void fiber_body() {
  fiber& f = *g_fiber;
  for (long i = 0; i < f.n; ++i) {
    for (int k = 0; k < kAddsPerVisit; ++k) f.c->add(1);
    swapcontext(&f.self, &f.caller);  // back to the scheduler; the next thread resumes us
  }
  f.finished = true;
  swapcontext(&f.self, &f.caller);
}

percpu::counter g_fiber_counter;

TEST(ResumeElsewhere, FiberCounterIsExact) {
  const std::vector<int> cpus = test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs to move between";
  fiber f;
  f.n = rounds();
  f.c = &g_fiber_counter;
  g_fiber = &f;
  getcontext(&f.self);
  f.self.uc_stack.ss_sp = f.stack.data();
  f.self.uc_stack.ss_size = f.stack.size();
  f.self.uc_link = nullptr;
  makecontext(&f.self, fiber_body, 0);
  std::atomic<long> hammered{0};
  {
    executor a(cpus[0]), b(cpus[1]);
    hammers h(2, cpus[0], [&] {
      g_fiber_counter.add(1);
      hammered.fetch_add(1, std::memory_order_relaxed);
    });
    // Alternate threads: each visit runs the fiber until it yields.
    long visits = 0;
    while (!f.finished) {
      done_flag visit;
      executor& e = visits++ % 2 == 0 ? a : b;
      e.post([&] {
        swapcontext(&f.caller, &f.self);
        visit.set();
      });
      visit.wait();
    }
    h.stop();
  }
  EXPECT_EQ(g_fiber_counter.load(), f.n * kAddsPerVisit + hammered.load())
      << "updates were lost: a section ran on another thread's rseq area";
}

}  // namespace
