// Tests for percpu::ref: the release function runs exactly once and only
// after the last put, under get/put/try_get/kill races with 12 threads on 2
// CPUs, affinity flips and timer signals whose handlers take references
// too; puts on another CPU than their get; try_get after zero; fork; and the
// debug-build misuse checks (kill twice, more puts than gets, leaks).

#include "percpu/ref.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "tests/stress/stress.hpp"

namespace percpu {
namespace {

namespace stress = percpu::stress;

constexpr int kWorkers = 12;

struct release_log {
  std::atomic<int> calls{0};
  std::atomic<long>* held = nullptr;  // references the test believes are out
  std::atomic<long> held_at_release{-1};
};

void on_release(void* context) {
  release_log* log = static_cast<release_log*>(context);
  log->calls.fetch_add(1);
  if (log->held != nullptr) log->held_at_release.store(log->held->load());
}

TEST(RefTest, ReleaseRunsAfterTheLastPutOnly) {
  release_log log;
  ref r(on_release, &log);
  EXPECT_EQ(r.count(), 1);
  r.get();
  r.get();
  EXPECT_EQ(r.count(), 3);
  r.put();
  EXPECT_FALSE(r.killed());
  r.kill();
  EXPECT_TRUE(r.killed());
  EXPECT_EQ(r.count(), 1);
  EXPECT_EQ(log.calls.load(), 0) << "released with a reference outstanding";
  EXPECT_TRUE(r.try_get());
  r.put();
  EXPECT_EQ(log.calls.load(), 0);
  r.put();
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_TRUE(r.released());
  EXPECT_FALSE(r.try_get()) << "try_get after the count reached zero";
  EXPECT_EQ(log.calls.load(), 1);
}

TEST(RefTest, KillWithNoOtherReferenceReleasesAtOnce) {
  release_log log;
  ref r(on_release, &log);
  for (int i = 0; i < 100; ++i) r.get();
  for (int i = 0; i < 100; ++i) r.put();
  r.kill();
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_FALSE(r.try_get());
}

TEST(RefTest, PutOnAnotherCpuThanItsGet) {
  const std::vector<int> cpus = stress::test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs to migrate between; this run allows one";
  const std::vector<int> saved = stress::allowed_cpus();
  release_log log;
  ref r(on_release, &log);
  const long rounds = stress::scaled(300);
  for (long i = 0; i < rounds; ++i) {
    ASSERT_TRUE(stress::restrict_to({cpus[i % 2]}));
    r.get();
    r.get();
    ASSERT_TRUE(stress::restrict_to({cpus[(i + 1) % 2]}));
    r.put();
  }
  stress::restrict_to(saved);
  EXPECT_EQ(r.count(), 1 + rounds);
  r.kill();
  EXPECT_EQ(r.count(), rounds);
  for (long i = 0; i < rounds; ++i) {
    EXPECT_EQ(log.calls.load(), 0);
    r.put();
  }
  EXPECT_EQ(log.calls.load(), 1);
}

// ---- races ---------------------------------------------------------------------

constexpr int kSignal = SIGUSR2;
std::atomic<ref*> g_signal_ref{nullptr};
std::atomic<long> g_signal_gets{0};

void on_signal(int) {
  ref* r = g_signal_ref.load();
  if (r != nullptr && r->try_get()) {
    g_signal_gets.fetch_add(1, std::memory_order_relaxed);
    r->put();
  }
}

struct round_options {
  bool flip_affinity = false;
  bool signals = false;
};

// One ref per round: workers take and drop references (some hold several
// across migrations) while the main thread kills it part way. The release
// must come once, after every reference the workers held was put.
void race_rounds(const round_options& options) {
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(cpus));
  if (options.signals) stress::install_handler(kSignal, on_signal);
  const long rounds = stress::scaled(30);
  long refused_total = 0;
  for (long round = 0; round < rounds; ++round) {
    std::atomic<long> held{0};
    release_log log;
    log.held = &held;
    std::atomic<long> refused{0};
    ref r(on_release, &log);
    if (options.signals) g_signal_ref.store(&r);
    {
      stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
        std::unique_ptr<stress::thread_signal_timer> timer;
        if (options.signals) timer.reset(new stress::thread_signal_timer(kSignal, 5000));
        const int depth = 1 + w % 3;
        while (!stop) {
          int got = 0;
          for (int i = 0; i < depth; ++i) {
            if (!r.try_get()) break;
            held.fetch_add(1);
            ++got;
          }
          if (got == 0) {
            refused.fetch_add(1);
            std::this_thread::yield();
            continue;
          }
          for (int i = 0; i < got; ++i) {
            held.fetch_sub(1);
            r.put();
          }
        }
      });
      std::unique_ptr<stress::affinity_flipper> flipper;
      if (options.flip_affinity) {
        flipper.reset(new stress::affinity_flipper(workers, cpus, std::chrono::microseconds(300)));
      }
      std::this_thread::sleep_for(stress::scaled(std::chrono::milliseconds(5)));
      r.kill();
      std::this_thread::sleep_for(stress::scaled(std::chrono::milliseconds(5)));
      if (flipper) flipper->stop();
      workers.stop_and_join();
    }
    if (options.signals) g_signal_ref.store(nullptr);
    EXPECT_EQ(log.calls.load(), 1) << "round " << round;
    EXPECT_EQ(log.held_at_release.load(), 0)
        << "released while references were held, round " << round;
    EXPECT_FALSE(r.try_get()) << "round " << round;
    refused_total += refused.load();
  }
  stress::restrict_to(saved);
  std::printf("%ld rounds, %ld refused try_gets after release\n", rounds, refused_total);
}

TEST(RefStressTest, ExactlyOneReleaseUnderRaces) { race_rounds({}); }

TEST(RefStressTest, ExactlyOneReleaseUnderFlipsAndSignals) {
  round_options options;
  options.flip_affinity = true;
  options.signals = true;
  race_rounds(options);
}

// The parent's workers keep taking references while the main thread forks.
// The child's copy has the count of the fork instant; its own threads must
// leave it where it was, and its kill must fold exactly.
TEST(RefStressTest, ForkDuringHeavyUse) {
  release_log log;
  ref r(on_release, &log);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(stress::test_cpus(2)));
  int children = 0;
  {
    stress::worker_group workers(4, [&](int, const stress::stop_flag& stop) {
      while (!stop) {
        r.get();
        r.get();
        r.put();
        r.put();
      }
    });
    const auto until =
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(300));
    while (std::chrono::steady_clock::now() < until) {
      const int status = stress::run_in_child(
          [&r, &log] {
            const std::int64_t base = r.count();
            if (base < 1) return 1;
            std::vector<std::thread> threads;
            for (int t = 0; t < 4; ++t) {
              threads.emplace_back([&r] {
                for (int i = 0; i < 5000; ++i) {
                  r.get();
                  r.put();
                }
              });
            }
            for (std::thread& t : threads) t.join();
            if (r.count() != base) return 2;
            r.kill();
            // The parent's threads' references are the child's to drop now.
            for (std::int64_t i = 1; i < base; ++i) {
              if (log.calls.load() != 0) return 3;
              r.put();
            }
            return log.calls.load() == 1 ? 0 : 4;
          },
          std::chrono::seconds(60));
      ++children;
      EXPECT_EQ(status, 0) << "child " << children;
    }
    workers.stop_and_join();
  }
  stress::restrict_to(saved);
  EXPECT_GT(children, 0);
  EXPECT_EQ(r.count(), 1);
  r.kill();
  EXPECT_EQ(log.calls.load(), 1);
}

// ---- misuse ------------------------------------------------------------------

#ifndef NDEBUG
TEST(RefDeathTest, KillTwiceAborts) {
  EXPECT_DEATH(
      {
        ref r(nullptr);
        r.get();
        r.kill();
        r.kill();
      },
      "percpu::ref::kill: called twice");
}

TEST(RefDeathTest, MorePutsThanGetsAborts) {
  EXPECT_DEATH(
      {
        ref r(nullptr);
        r.put();  // takes the owner's reference: slots now sum to zero
        r.put();  // one too many, caught when kill folds the slots
        r.kill();
      },
      "more puts than gets");
  EXPECT_DEATH(
      {
        ref r(nullptr);
        r.get();
        r.kill();
        r.put();
        r.put();
      },
      "count reached zero twice|more puts than gets");
}

TEST(RefDeathTest, LeakedReferenceAbortsAtDestruction) {
  EXPECT_DEATH(
      {
        ref r(nullptr);
        r.get();
      },
      "destroyed with references taken by get\\(\\) and not put");
  EXPECT_DEATH(
      {
        ref r(nullptr);
        r.get();
        r.kill();
      },
      "destroyed after kill\\(\\) with references outstanding");
}

TEST(RefDeathTest, GetAfterReleaseAborts) {
  EXPECT_DEATH(
      {
        ref r(nullptr);
        r.kill();
        r.get();
      },
      "already released");
}
#else
TEST(RefTest, MisuseChecksNeedDebugBuilds) {
  GTEST_SKIP() << "NDEBUG is defined: the misuse checks are compiled out";
}
#endif

}  // namespace
}  // namespace percpu
