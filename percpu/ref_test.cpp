// Tests for percpu::ref: the release function runs exactly once and only
// after the last put, under get/put/try_get/kill races with 12 threads on 2
// CPUs, affinity flips and timer signals whose handlers take references
// too; puts on another CPU than their get; try_get after zero; fork; and the
// debug-build misuse checks (kill twice, more puts than gets, leaks).

#include "percpu/ref.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "tests/stress/stress.hpp"
#include "tests/support/address_limit.hpp"
#include "tests/support/pages.hpp"

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

// After kill() get() and put() add to the count inline: a thread with rseq
// once its CPU's word reads locked, one without (the fallback variant, and
// here a thread forced off its sections) at once. Each moves the count by
// exactly one, on this thread and on another, and the last put releases.
TEST(RefTest, GetAndPutAfterKillMoveTheCountByOne) {
  release_log log;
  ref r(on_release, &log);
  r.get();
  r.kill();
  ASSERT_EQ(r.count(), 1);
  auto gets_and_puts = [&r] {
    for (int i = 0; i < 100; ++i) r.get();
    EXPECT_EQ(r.count(), 101);
    for (int i = 0; i < 100; ++i) r.put();
    EXPECT_EQ(r.count(), 1);
  };
  gets_and_puts();
  std::thread([&] {
    internal::force_locked_path_for_this_thread(true);
    gets_and_puts();
    internal::force_locked_path_for_this_thread(false);
  }).join();
  EXPECT_EQ(log.calls.load(), 0) << "released with a reference outstanding";
  r.put();
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_EQ(r.count(), 0);
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

// Where a ref's per-CPU words and its threads' words are (CPU 0's and
// thread index 0's copies), read without a seam in the library: an explicit
// instantiation may name private members ([temp.spec.general]), and the
// friends it defines hand the pointers out.
const void* cpu_words(const ref& r);
const void* thread_words(const ref& r);
template <auto Slots, auto Threads>
struct expose_ref_words {
  friend const void* cpu_words(const ref& r) { return r.*Slots; }
  friend const void* thread_words(const ref& r) { return r.*Threads; }
};
template struct expose_ref_words<&ref::slots_, &ref::thread_slots_>;

// Memory per instance (ref.hpp, "Memory"): 100,000 refs, each taken and
// dropped once, take 32 bytes per possible CPU, and 32 for each thread
// without rseq that used them, beside the ref itself; not the page and the
// 8 KiB of thread words each took before. Then the first 2,048 are killed
// (each kill fences every CPU, which is slow under emulation), and those
// take no more: kill() writes every CPU's words but no thread's. Counted
// with mincore over every copy, before anything reads them.
struct ref_pages {
  long cpu = -1;     // pages present in the refs' per-CPU words
  long thread = -1;  // and in their thread words
};

ref_pages pages_behind(const ref* refs, long n) {
  const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::set<std::uintptr_t> cpu0, thread0;
  for (long i = 0; i < n; ++i) {
    cpu0.insert(reinterpret_cast<std::uintptr_t>(cpu_words(refs[i])) & ~(page - 1));
    if (const void* t = thread_words(refs[i])) {
      thread0.insert(reinterpret_cast<std::uintptr_t>(t) & ~(page - 1));
    }
  }
  ref_pages p;
  p.cpu = test::present_stride_pages(cpu0, max_cpus());
  p.thread = test::present_stride_pages(thread0, internal::kThreadSlots);
  return p;
}

double bytes_each(const ref_pages& p, long n) {
  return static_cast<double>(p.cpu + p.thread) * static_cast<double>(sysconf(_SC_PAGESIZE)) / n +
         sizeof(ref);
}

TEST(RefTest, AHundredThousandRefsTakeBytesEach) {
  constexpr long kRefs = 100000;
  constexpr long kKilled = 2048;
  release_log log;
  std::unique_ptr<unsigned char[]> storage(new unsigned char[kRefs * sizeof(ref)]);
  ref* refs = reinterpret_cast<ref*>(storage.get());
  for (long i = 0; i < kRefs; ++i) {
    ref* r = new (&refs[i]) ref(on_release, &log);
    r->get();
    r->put();
  }
  for (long i = 0; i < kRefs; ++i) ASSERT_NE(cpu_words(refs[i]), nullptr) << "ref " << i;
  const ref_pages used = pages_behind(refs, kRefs);
  ASSERT_GE(used.cpu, 0);
  ASSERT_GE(used.thread, 0);
  for (long i = 0; i < kKilled; ++i) refs[i].kill();
  EXPECT_EQ(log.calls.load(), kKilled) << "every killed ref released once";
  const ref_pages killed = pages_behind(refs, kKilled);
  ASSERT_GE(killed.cpu, 0);
  ASSERT_GE(killed.thread, 0);

  const int indexes = internal::thread_index_limit();
  std::printf(
      "%ld refs, each used once: %.1f bytes each (%ld pages of per-CPU words, %ld of "
      "thread words, %zu bytes of the ref itself); the first %ld, killed: %.1f bytes "
      "each; %d possible CPUs, %d thread indexes handed out\n",
      kRefs, bytes_each(used, kRefs), used.cpu, used.thread, sizeof(ref), kKilled,
      bytes_each(killed, kKilled), max_cpus(), indexes);
  // 32 bytes per CPU; 32 per thread index (only a thread without rseq that
  // used the refs wrote its copies, but any index handed out may have); the
  // chunks' headers and the last, partly used pages: 16 bytes, or for the
  // killed refs a page of each CPU's region and of up to 4 chunk headers.
  const double bound = sizeof(ref) + 32.0 * max_cpus() + 32.0 * indexes;
  EXPECT_LE(bytes_each(used, kRefs), bound + 16) << "more than the words a ref needs";
  EXPECT_LE(bytes_each(killed, kKilled),
            bound + static_cast<double>(sysconf(_SC_PAGESIZE)) * (max_cpus() + 4) / kKilled)
      << "kill() filled more than the CPUs' words";
  // Qualified: clang warns of a destructor call on a class with virtual
  // functions (the fork hooks), which users never derive from.
  for (long i = 0; i < kRefs; ++i) refs[i].ref::~ref();
}

// "If the slots cannot be mapped, everything goes to the single atomic
// count; still exact": in a child whose address space is limited to what
// it has mapped, refs are made (in memory taken before) until one finds no
// per-CPU memory for its words. That one counts every get and put, kill()
// folds nothing it lacks, and the last put releases it, once.
TEST(RefTest, CountsExactlyWhenNoMemoryCanBeMapped) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  // More than a chunk of the arena's 32-byte class and the objects earlier
  // tests gave back (100,000 of them).
  constexpr int kRefs = 262144;
  std::unique_ptr<unsigned char[]> storage(new unsigned char[kRefs * sizeof(ref)]);
  release_log log;
  // The child's second thread takes the stack glibc keeps from this one:
  // under the limit no new stack could be mapped.
  std::thread([] {}).join();
  const int status = test::run_under_address_limit(0, [&] {
    ref* unmapped = nullptr;
    for (int i = 0; i < kRefs && unmapped == nullptr; ++i) {
      ref* r = new (storage.get() + i * sizeof(ref)) ref(on_release, &log);
      if (cpu_words(*r) == nullptr) unmapped = r;
    }
    if (unmapped == nullptr) return 3;
    if (thread_words(*unmapped) != nullptr) return 4;
    for (int i = 0; i < 1000; ++i) unmapped->get();
    for (int i = 0; i < 999; ++i) unmapped->put();
    std::thread other([unmapped] {
      unmapped->get();
      unmapped->put();
    });
    other.join();
    if (unmapped->count() != 2) return 5;
    unmapped->kill();
    if (unmapped->count() != 1 || log.calls.load() != 0) return 6;
    unmapped->put();
    if (log.calls.load() != 1 || !unmapped->released()) return 7;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  if (WEXITSTATUS(status) == test::kLimitNotEnforced) {
    GTEST_SKIP() << "RLIMIT_AS is not enforced here (qemu-user ignores it)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "98: setrlimit failed, 3: every ref found memory, 4: thread words without CPU words, "
         "5: count() inexact, 6: kill() miscounted or released early, 7: no release at zero";
}

// get()'s and put()'s slow half, called as they call it, without their
// inline read of killed_ first (read without a seam in the library, as
// object_pool_test.cpp reads the pool's lists).
void ref_add_slow(ref& r, std::int64_t delta);
template <auto AddSlow>
struct expose_ref_add_slow {
  friend void ref_add_slow(ref& r, std::int64_t delta) { (r.*AddSlow)(delta, false, nullptr); }
};
template struct expose_ref_add_slow<&ref::add_slow>;
// The inline step before it of a thread without rseq: its own word.
bool ref_add_own(ref& r, std::int64_t delta);
template <auto AddOwn>
struct expose_ref_add_own {
  friend bool ref_add_own(ref& r, std::int64_t delta) { return (r.*AddOwn)(delta); }
};
template struct expose_ref_add_own<&ref::add_own>;

// kill() walks the words of the thread indexes handed out so far, and a
// thread that first takes an index after that walk must not add to its word,
// which nobody folds any more (ref.cpp, add_slow). Run in a fresh process
// (gtest's "threadsafe" style runs the test anew; hence the DeathTest
// suite, which lanes that cannot re-run a binary leave out), where the
// thread below takes an index no earlier thread took: if a get of its
// (the inline one, or the slow half or the own-word step as a get whose
// read of killed_ came before kill()) went to its word, the main thread's put() would release
// the ref while that thread still holds a reference. Threads with rseq
// take the per-CPU path and must hold too.
TEST(RefDeathTest, AThreadNewAfterKillIsCountedExactly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::atomic<long> held{1};
        release_log log;
        log.held = &held;
        ref r(on_release, &log);
        r.get();  // the main thread's reference
        r.kill();
        std::atomic<int> step{0};
        std::thread late([&] {
          r.get();  // a thread new after kill(): the count, inline
          // A get whose inline read of killed_ came just before kill() set
          // it and whose slow path runs after: its own thread word, which
          // kill() has folded for good, must not take it.
          ref_add_slow(r, 1);
          // The same get's inline step on a thread without rseq, whose index
          // is claimed now: it must hand off too (elsewhere it declines).
          if (!ref_add_own(r, 1)) ref_add_slow(r, 1);
          held.fetch_add(3);
          step.store(1);
          while (step.load() != 2) std::this_thread::yield();
          for (int i = 0; i < 3; ++i) {
            held.fetch_sub(1);
            r.put();
          }
        });
        while (step.load() != 1) std::this_thread::yield();
        held.fetch_sub(1);
        r.put();
        const int early = log.calls.load();
        step.store(2);
        late.join();
        std::_Exit(early != 0                        ? 1
                   : log.calls.load() != 1           ? 2
                   : log.held_at_release.load() != 0 ? 3
                                                     : 0);
      },
      ::testing::ExitedWithCode(0), "");
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
