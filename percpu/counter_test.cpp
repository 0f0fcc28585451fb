// Tests for percpu::counter: the API, and exact sums with 12 threads on 2
// CPUs under oversubscription, affinity flipping, timer signals whose
// handlers add too, fork during heavy use, and thread churn. The mode
// variants (.glibc, .own, .fallback) run all of it on each path.

#include "percpu/counter.hpp"

#include <gtest/gtest.h>
#include <linux/audit.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "tests/stress/stress.hpp"
#include "tools/seccomp_deny_rseq.hpp"

namespace percpu {
namespace {

namespace stress = percpu::stress;

constexpr int kWorkers = 12;

// Constant-initialised: usable before main and from any static constructor.
counter g_global;

TEST(CounterTest, GlobalStartsAtZeroAndCounts) {
  EXPECT_EQ(g_global.load(), 0);
  g_global.increment();
  g_global.increment();
  g_global.decrement();
  g_global.add(41);
  g_global.add(-2);
  EXPECT_EQ(g_global.load(), 40);
}

TEST(CounterTest, SlotsAreMaxCpusAndSumToLoad) {
  counter c;
  EXPECT_EQ(c.slots(), max_cpus());
  for (int i = 0; i < c.slots(); ++i) EXPECT_EQ(c.slot(i), 0);
  for (int i = 0; i < 1000; ++i) c.add(i % 7 - 3);
  std::int64_t sum = 0;
  for (int i = 0; i < c.slots(); ++i) sum += c.slot(i);
  EXPECT_EQ(sum, c.load());
  std::int64_t expected = 0;
  for (int i = 0; i < 1000; ++i) expected += i % 7 - 3;
  EXPECT_EQ(c.load(), expected);
}

TEST(CounterTest, AddsLandInTheCurrentCpusSlot) {
  const std::vector<int> saved = stress::allowed_cpus();
  for (int cpu : stress::test_cpus(2)) {
    counter c;
    ASSERT_TRUE(stress::restrict_to({cpu}));
    c.add(5);
    c.add(7);
    if (backend() == cpu_backend::syscall) {
      // The system-call fallback is asked only every so many adds (no
      // system call per add), so an add may land on a CPU this thread left
      // a moment ago; each lands whole in one slot.
      int slots_used = 0;
      std::int64_t sum = 0;
      for (int i = 0; i < c.slots(); ++i) {
        slots_used += c.slot(i) != 0;
        sum += c.slot(i);
      }
      EXPECT_GE(slots_used, 1);
      EXPECT_LE(slots_used, 2);
      EXPECT_EQ(sum, 12);
    } else {
      EXPECT_EQ(c.slot(cpu), 12) << "on CPU " << cpu;
    }
    EXPECT_EQ(c.load(), 12);
  }
  stress::restrict_to(saved);
}

TEST(CounterTest, ExtremeDeltas) {
  counter c;
  c.add(INT64_MAX / 2);
  c.add(INT64_MAX / 2);
  c.add(-(INT64_MAX / 2));
  EXPECT_EQ(c.load(), INT64_MAX / 2);
}

// A counter used after its destructor, as a static destructor of another
// translation unit might: it must read zero and count again, not write to
// the block the destructor unmapped. Run in a child, so a wild access fails
// the test instead of the binary.
TEST(CounterTest, UseAfterDestructionTouchesNoFreedMemory) {
  const int status = stress::run_in_child(
      [] {
        alignas(counter) unsigned char storage[sizeof(counter)];
        counter* c = new (storage) counter;
        c->add(7);
        if (c->load() != 7) return 1;
        c->~counter();
        if (c->load() != 0) return 2;
        c->add(5);
        if (c->load() != 5) return 3;
        c->~counter();
        return 0;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(status, 0) << "1: bad count before destruction; 2: a destroyed counter does not "
                          "read zero; 3: a late add was lost; 128+n: killed by signal n";
}

#ifdef NDEBUG
TEST(CounterTest, OutOfRangeSlotReadsZeroInReleaseBuilds) {
  counter c;
  c.add(3);
  EXPECT_EQ(c.slot(-1), 0);
  EXPECT_EQ(c.slot(c.slots()), 0);
  EXPECT_EQ(c.slot(1 << 30), 0);
  EXPECT_EQ(c.load(), 3) << "a bad index must not disturb the counter";
}
#else
TEST(CounterDeathTest, OutOfRangeSlotAbortsInDebugBuilds) {
  counter c;
  c.add(3);
  EXPECT_DEATH((void)c.slot(-1), "percpu::counter::slot\\(-1\\): index out of range \\[0, ");
  EXPECT_DEATH((void)c.slot(c.slots()), "index out of range");
  EXPECT_EQ(c.load(), 3);
}
#endif

// ---- stress ------------------------------------------------------------------

constexpr int kSignal = SIGUSR2;
counter* g_signal_counter = nullptr;
std::atomic<long> g_handler_adds{0};

void on_signal(int) {
  if (counter* c = g_signal_counter) {
    c->add(3);
    g_handler_adds.fetch_add(3, std::memory_order_relaxed);
  }
}

struct run_options {
  bool flip_affinity = false;
  bool signals = false;
  std::chrono::milliseconds length{600};
};

// kWorkers threads on 2 CPUs add to `c` until stopped; returns what they
// (and their signal handlers) added.
long hammer(counter& c, const run_options& options) {
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  EXPECT_TRUE(stress::restrict_to(cpus));
  if (options.signals) {
    g_handler_adds.store(0);
    g_signal_counter = &c;
    stress::install_handler(kSignal, on_signal);
  }
  std::atomic<long> added{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      std::unique_ptr<stress::thread_signal_timer> timer;
      if (options.signals) timer.reset(new stress::thread_signal_timer(kSignal, 10000));
      long mine = 0;
      const std::int64_t delta = w % 3 == 0 ? -1 : 2;
      while (!stop) {
        for (int i = 0; i < 64; ++i) c.add(delta);
        mine += 64 * delta;
      }
      added.fetch_add(mine);
    });
    std::unique_ptr<stress::affinity_flipper> flipper;
    if (options.flip_affinity) {
      flipper.reset(new stress::affinity_flipper(workers, cpus, std::chrono::microseconds(300)));
    }
    stress::sleep_scaled(options.length);
    if (flipper) {
      flipper->stop();
      std::printf("affinity flips: %ld\n", flipper->flips());
    }
    workers.stop_and_join();
  }
  long total = added.load();
  if (options.signals) {
    stress::restore_default(kSignal);
    g_signal_counter = nullptr;
    const double seconds = std::chrono::duration<double>(stress::scaled(options.length)).count();
    std::printf("signal handlers ran %ld times, %.0f per second over all workers\n",
                g_handler_adds.load() / 3,
                static_cast<double>(g_handler_adds.load() / 3) / seconds);
    EXPECT_GT(g_handler_adds.load(), 0) << "no timer signal reached a worker";
    total += g_handler_adds.load();
  }
  stress::restrict_to(saved);
  return total;
}

void expect_slots_sum_to_load(const counter& c) {
  std::int64_t sum = 0;
  for (int i = 0; i < c.slots(); ++i) sum += c.slot(i);
  EXPECT_EQ(sum, c.load());
}

TEST(CounterStressTest, Oversubscribed) {
  counter c;
  const long expected = hammer(c, {});
  EXPECT_EQ(c.load(), expected);
  expect_slots_sum_to_load(c);
}

TEST(CounterStressTest, AffinityFlipping) {
  counter c;
  run_options options;
  options.flip_affinity = true;
  const long expected = hammer(c, options);
  EXPECT_EQ(c.load(), expected);
  expect_slots_sum_to_load(c);
}

TEST(CounterStressTest, TimerSignalsAddToo) {
  counter c;
  run_options options;
  options.signals = true;
  const long expected = hammer(c, options);
  EXPECT_EQ(c.load(), expected);
}

TEST(CounterStressTest, SignalsAndAffinityFlippingTogether) {
  counter c;
  run_options options;
  options.signals = true;
  options.flip_affinity = true;
  const long expected = hammer(c, options);
  EXPECT_EQ(c.load(), expected);
}

TEST(CounterStressTest, ThreadChurn) {
  counter c;
  const long threads = stress::scaled(600L);
  stress::churn(threads, kWorkers, [&](long n) {
    for (int i = 0; i < 500; ++i) c.add(n % 2 == 0 ? 1 : 3);
  });
  long expected = 0;
  for (long n = 0; n < threads; ++n) expected += 500 * (n % 2 == 0 ? 1 : 3);
  EXPECT_EQ(c.load(), expected);
}

// A thread whose rseq(2) fails with EPERM (tools/seccomp_deny_rseq.hpp): in
// own-registration mode it cannot register and adds through the atomic word,
// while its neighbours add through rseq sections: the two paths on the same
// slots.
bool deny_rseq_for_this_thread() { return percpu::tools::deny_rseq(EPERM); }

TEST(CounterStressTest, RseqAndFallbackThreadsOnTheSameSlots) {
  // Only percpu's own registration can be refused per thread: glibc
  // registered every thread before it ran, and without rseq there is no mix.
  // Elsewhere this would be one more oversubscribed run, so it says so.
  (void)cpu_id();
  if (rseq_ownership() != rseq_owner::percpu) {
    GTEST_SKIP() << "needs percpu's own registration (the .own variant); rseq owner here: "
                 << to_string(rseq_ownership());
  }
  counter c;
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(cpus));
  std::atomic<long> added{0};
  std::atomic<int> on_rseq{0}, on_fallback{0}, filter_failures{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      // Before this thread's first use of percpu, so it never registers.
      if (w % 2 == 1 && !deny_rseq_for_this_thread()) filter_failures++;
      c.add(1);
      (backend() == cpu_backend::rseq ? on_rseq : on_fallback)++;
      long mine = 1;
      while (!stop) {
        for (int i = 0; i < 64; ++i) c.add(w % 3 == 0 ? -1 : 2);
        mine += 64 * (w % 3 == 0 ? -1 : 2);
      }
      added.fetch_add(mine);
    });
    stress::affinity_flipper flipper(workers, cpus, std::chrono::microseconds(300));
    stress::sleep_scaled(std::chrono::milliseconds(600));
    flipper.stop();
    workers.stop_and_join();
  }
  stress::restrict_to(saved);
  std::printf("workers on rseq: %d, on the fallback: %d\n", on_rseq.load(), on_fallback.load());
  EXPECT_EQ(filter_failures.load(), 0);
  EXPECT_EQ(c.load(), added.load());
  expect_slots_sum_to_load(c);
  EXPECT_EQ(on_rseq.load(), kWorkers / 2);
  EXPECT_EQ(on_fallback.load(), kWorkers / 2);
}

// A gauge: each worker adds +1 then -1, so the true value is always between
// zero and the number of workers. load() is not a snapshot (counter.hpp, "What
// load() returns"): it counts every add that happened before it began and
// any subset of the overlapping ones. The workers publish how many adds of
// each sign they finished; around each load() the reader takes those counts,
// which bound what the documented guarantee allows:
//   ups_before - (downs_after + workers) <= load() <= ups_after + workers - downs_before
// (an add still in flight is not yet in the published counts, at most one per
// worker). Reads outside [0, workers], which the guarantee permits, are
// printed, not required.
TEST(CounterStressTest, GaugeReadsStayWithinTheDocumentedBounds) {
  counter c;
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(cpus));
  constexpr int kGaugeWorkers = 6;
  std::atomic<long> ups{0}, downs{0};
  long samples = 0, outside_range = 0, violations = 0;
  std::int64_t lowest = 0, highest = 0;
  {
    stress::worker_group workers(kGaugeWorkers, [&](int, const stress::stop_flag& stop) {
      while (!stop) {
        c.add(1);
        ups.fetch_add(1);
        c.add(-1);
        downs.fetch_add(1);
      }
    });
    stress::affinity_flipper flipper(workers, cpus, std::chrono::microseconds(300));
    const auto until =
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(400));
    while (std::chrono::steady_clock::now() < until) {
      const long ups_before = ups.load(), downs_before = downs.load();
      const std::int64_t value = c.load();
      const long ups_after = ups.load(), downs_after = downs.load();
      ++samples;
      if (value < ups_before - downs_after - kGaugeWorkers ||
          value > ups_after + kGaugeWorkers - downs_before) {
        if (violations++ == 0) {
          ADD_FAILURE() << "load() " << value << " outside the guarantee: ups " << ups_before
                        << ".." << ups_after << ", downs " << downs_before << ".." << downs_after;
        }
      }
      if (value < 0 || value > kGaugeWorkers) ++outside_range;
      lowest = std::min(lowest, value);
      highest = std::max(highest, value);
    }
    flipper.stop();
    workers.stop_and_join();
  }
  stress::restrict_to(saved);
  std::printf("%ld loads, %ld outside [0, %d] (lowest %lld, highest %lld)\n", samples,
              outside_range, kGaugeWorkers, static_cast<long long>(lowest),
              static_cast<long long>(highest));
  EXPECT_GT(samples, 0);
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(c.load(), 0) << "exact once the workers are joined";
  EXPECT_EQ(ups.load(), downs.load());
}

// The parent's workers keep adding while the main thread forks; the child
// starts its own workers on the copy and must see its own adds exactly.
TEST(CounterStressTest, ForkDuringHeavyUse) {
  counter c;
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(cpus));
  std::atomic<long> added{0};
  int children = 0, good_children = 0;
  {
    stress::worker_group workers(kWorkers, [&](int, const stress::stop_flag& stop) {
      long mine = 0;
      while (!stop) {
        for (int i = 0; i < 64; ++i) c.increment();
        mine += 64;
      }
      added.fetch_add(mine);
    });
    const auto until =
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(600));
    while (std::chrono::steady_clock::now() < until) {
      const int status = stress::run_in_child(
          [&c] {
            const std::int64_t base = c.load();
            std::vector<std::thread> threads;
            for (int t = 0; t < kWorkers; ++t) {
              threads.emplace_back([&c] {
                for (int i = 0; i < 20000; ++i) c.add(2);
              });
            }
            for (std::thread& t : threads) t.join();
            const std::int64_t want = base + std::int64_t{kWorkers} * 20000 * 2;
            if (c.load() != want) {
              std::fprintf(stderr, "child: load %lld, want %lld\n",
                           static_cast<long long>(c.load()), static_cast<long long>(want));
              return 1;
            }
            return 0;
          },
          std::chrono::seconds(60));
      ++children;
      if (status == 0) ++good_children;
      EXPECT_EQ(status, 0) << "child " << children;
    }
    workers.stop_and_join();
  }
  stress::restrict_to(saved);
  std::printf("forked %d children, %d exact\n", children, good_children);
  EXPECT_GT(children, 0);
  EXPECT_EQ(c.load(), added.load()) << "the parent's sum must not be disturbed by fork";
}

}  // namespace
}  // namespace percpu
