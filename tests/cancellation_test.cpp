// Deferred cancellation inside every structure's slow paths. percpu's
// operations are noexcept, so a cancellation point anywhere inside them
// (glibc's nanosleep, open, read, write, close...) turns a pending
// pthread_cancel() into an unwind that meets a noexcept frame:
// std::terminate, SIGABRT. Each case runs in a child process (a crash or a
// hang fails that case, not the whole binary): a thread is cancelled, then
// runs a slow path that must wait (another thread holds what it needs) or
// do remote work (steals, take_all, trim, kill); it must come back out, and
// be cancelled only at the pthread_testcancel() that follows.
// The mode variants (.glibc, .own, .fallback) run every case on each path.

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/free_list.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "percpu/object_pool.hpp"
#include "percpu/per_cpu.hpp"
#include "percpu/ref.hpp"
#include "percpu/shared_mutex.hpp"
#include "tests/stress/stress.hpp"

namespace percpu {
namespace {

namespace stress = percpu::stress;

struct cancel_case {
  std::function<void()> op;
  std::atomic<int> go{0};
  std::atomic<int> started{0};
  std::atomic<int> done{0};
};

void* cancelled_thread(void* arg) {
  auto* c = static_cast<cancel_case*>(arg);
  // sched_yield is not a cancellation point: the cancel stays pending.
  while (c->go.load() == 0) sched_yield();
  c->started.store(1);
  c->op();
  c->done.store(1);
  pthread_testcancel();
  return nullptr;  // not cancelled: the case fails
}

long thread_cpu_ns(clockid_t clock) {
  struct timespec t = {0, 0};
  clock_gettime(clock, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

// Runs `op` on a thread with a cancellation pending, while the calling
// thread calls hold() before and release() once op has surely reached its
// wait: the thread has used 5 ms of CPU since it started op (a wait spins
// and yields for far less before it sleeps), or it finished, or 2 s passed (a futex wait sleeps
// without CPU). On a loaded machine a fixed delay could end before the thread even ran. 0 when op
// finished and the thread was then cancelled.
int cancel_here(const std::function<void()>& op, const std::function<void()>& hold,
                const std::function<void()>& release) {
  cancel_case c;
  c.op = op;
  pthread_t thread;
  if (pthread_create(&thread, nullptr, cancelled_thread, &c) != 0) return 10;
  clockid_t cpu_clock;
  if (pthread_getcpuclockid(thread, &cpu_clock) != 0) return 13;
  hold();
  pthread_cancel(thread);
  c.go.store(1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (c.started.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const long cpu_start = thread_cpu_ns(cpu_clock);
  while (c.done.load() == 0 && thread_cpu_ns(cpu_clock) - cpu_start < 5000000L &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  release();
  void* result = nullptr;
  pthread_join(thread, &result);
  if (c.done.load() == 0) return 11;
  return result == PTHREAD_CANCELED ? 0 : 12;
}

// The same in a child process, so that an abort or a hang (the timeout is
// the watchdog) fails the case and not the binary.
int run_cancelled(const std::function<void()>& op, const std::function<void()>& hold,
                  const std::function<void()>& release) {
  return stress::run_in_child([&] { return cancel_here(op, hold, release); },
                              std::chrono::seconds(60));
}

void nothing() {}

// While the fork registry's hold is on (as during fork()), every wait for
// a flag waits: the depot, the thread slots' lockers, a kill's flag.
void hold_flags() { internal::begin_fork_flags(); }
void release_flags() { internal::end_fork_flags(); }

object_pool::options small_caches() {
  object_pool::options o;
  o.object_size = 64;
  o.cache_capacity = 2;
  o.batch = 1;
  return o;
}

// Refills and spills through the depot, and a trim.
void pool_churn(object_pool& pool, bool locked_path) {
  internal::force_locked_path_for_this_thread(locked_path);
  void* held[16];
  for (int round = 0; round < 4; ++round) {
    for (void*& p : held) p = pool.allocate();
    for (void* p : held) pool.deallocate(p);
  }
  (void)pool.trim();
  internal::force_locked_path_for_this_thread(false);
}

TEST(CancellationTest, ObjectPoolDepotRefillSpillAndTrim) {
  for (bool locked : {false, true}) {
    object_pool pool(small_caches());
    EXPECT_EQ(run_cancelled([&] { pool_churn(pool, locked); }, hold_flags, release_flags), 0)
        << (locked ? "locked path" : "own path");
    // Without the hold: trim while caches hold objects.
    EXPECT_EQ(run_cancelled(
                  [&] {
                    pool_churn(pool, locked);
                    void* p = pool.allocate();
                    pool.deallocate(p);
                    (void)pool.trim();
                  },
                  nothing, nothing),
              0)
        << (locked ? "locked path" : "own path");
  }
}

// The shape: twelve threads, caches of two, all cancelled while
// they fight over the depot.
TEST(CancellationTest, TwelveThreadsOnSmallCaches) {
  object_pool pool(small_caches());
  const int status = stress::run_in_child(
      [&] {
        std::vector<cancel_case> cases(12);
        std::vector<pthread_t> threads(cases.size());
        for (std::size_t i = 0; i < cases.size(); ++i) {
          cases[i].op = [&pool, i] {
            const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
            while (std::chrono::steady_clock::now() < until) {
              pool_churn(pool, i % 3 == 0);
            }
          };
          if (pthread_create(&threads[i], nullptr, cancelled_thread, &cases[i]) != 0) return 10;
          pthread_cancel(threads[i]);
        }
        for (cancel_case& c : cases) c.go.store(1);
        int bad = 0;
        for (std::size_t i = 0; i < cases.size(); ++i) {
          void* result = nullptr;
          pthread_join(threads[i], &result);
          if (result != PTHREAD_CANCELED || cases[i].done.load() == 0) ++bad;
        }
        return bad;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(status, 0);
}

TEST(CancellationTest, FreeListStealAndTakeAll) {
  for (bool locked : {false, true}) {
    free_list list;
    std::vector<free_list_node> nodes(64);
    // The child's main thread lists them (its CPU's list or its own), so
    // the cancelled thread's pops steal.
    auto fill = [&] {
      for (free_list_node& n : nodes) list.push(&n);
    };
    EXPECT_EQ(run_cancelled(
                  [&] {
                    internal::force_locked_path_for_this_thread(locked);
                    std::vector<free_list_node*> got;
                    while (free_list_node* n = list.pop()) got.push_back(n);
                    for (free_list_node* n : got) list.push(n);
                    free_list_node* all = list.take_all();
                    while (all != nullptr) {
                      free_list_node* next = all->next;
                      list.push(all);
                      all = next;
                    }
                    internal::force_locked_path_for_this_thread(false);
                  },
                  fill, nothing),
              0)
        << (locked ? "locked path" : "own path");
    EXPECT_EQ(run_cancelled(
                  [&] {
                    internal::force_locked_path_for_this_thread(locked);
                    for (int i = 0; i < 8; ++i) {
                      if (free_list_node* n = list.pop()) list.push(n);
                    }
                    (void)list.take_all();
                    internal::force_locked_path_for_this_thread(false);
                  },
                  [&] {
                    fill();
                    hold_flags();
                  },
                  release_flags),
              0)
        << (locked ? "locked path, flags held" : "own path, flags held");
  }
}

TEST(CancellationTest, SharedMutexWriterWaitAndReaderSlowPath) {
  shared_mutex mutex;
  // The writer waits for the main thread's read lock.
  EXPECT_EQ(run_cancelled(
                [&] {
                  mutex.lock();
                  mutex.unlock();
                },
                [&] { mutex.lock_shared(); }, [&] { mutex.unlock_shared(); }),
            0);
  // The reader waits for the main thread's write lock.
  EXPECT_EQ(run_cancelled(
                [&] {
                  mutex.lock_shared();
                  mutex.unlock_shared();
                  EXPECT_TRUE(mutex.try_lock_shared());
                  mutex.unlock_shared();
                },
                [&] { mutex.lock(); }, [&] { mutex.unlock(); }),
            0);
}

std::atomic<int> g_released{0};
void on_release(void*) { g_released.fetch_add(1); }

TEST(CancellationTest, RefKill) {
  for (bool flags_held : {false, true}) {
    const int status = stress::run_in_child(
        [&] {
          g_released.store(0);
          ref r(on_release);
          // References on this thread (its CPU's slot or its own word) and
          // on a thread without rseq sections, for kill() to fold.
          r.get();
          std::thread([&r] {
            internal::force_locked_path_for_this_thread(true);
            r.get();
          }).join();
          const int rc = cancel_here([&r] { r.kill(); }, flags_held ? hold_flags : nothing,
                                     flags_held ? release_flags : nothing);
          if (rc != 0) return rc;
          r.put();
          r.put();
          return g_released.load() == 1 ? 0 : 20;
        },
        std::chrono::seconds(60));
    EXPECT_EQ(status, 0) << (flags_held ? "flags held" : "flags free");
  }
}

TEST(CancellationTest, CounterFallback) {
  counter c;
  EXPECT_EQ(run_cancelled(
                [&] {
                  internal::force_locked_path_for_this_thread(true);
                  for (int i = 0; i < 1000; ++i) c.add(1);
                  internal::force_locked_path_for_this_thread(false);
                  for (int i = 0; i < 1000; ++i) c.add(1);
                  (void)c.load();
                },
                nothing, nothing),
            0);
}

struct two_words {
  std::int64_t a;
  std::uint64_t b;
};

// Every operation of one object, the first update (which maps its copies)
// among them.
template <typename Object>
void every_operation(Object& o) {
  o.add(&two_words::a, 1);
  (void)o.compare_and_store(&two_words::b, 0, 1);
  o.store(&two_words::b, 2);
  (void)o.load(&two_words::a);
  (void)o.copy(0);
  (void)o.atomic_copy(0);
  (void)o.shared_copy();
  (void)o.sum(&two_words::a);
}

// per_cpu<T> and cid_per_cpu<T>, on their sections and on the atomic
// copies (a thread forced off its sections), each object fresh.
TEST(CancellationTest, PerCpuEveryOperation) {
  EXPECT_EQ(run_cancelled(
                [] {
                  for (bool locked : {false, true}) {
                    internal::force_locked_path_for_this_thread(locked);
                    per_cpu<two_words> by_cpu;
                    cid_per_cpu<two_words> by_id;
                    every_operation(by_cpu);
                    every_operation(by_id);
                  }
                  internal::force_locked_path_for_this_thread(false);
                },
                nothing, nothing),
            0);
}

}  // namespace
}  // namespace percpu
