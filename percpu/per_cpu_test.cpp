// Tests for percpu::per_cpu<T>: the operations on one thread, where updates
// land in each mode (this CPU's copy with sections, the shared copy without),
// exact sums of several fields with 12 threads on 2 CPUs under affinity
// flipping and timer signals whose handlers update too, compare-and-store
// counting every success exactly once, threads with and without rseq on the
// same object, the first update made in a signal handler, memory per
// instance, and no memory at all. The mode variants (.glibc, .own,
// .fallback) run all of it on each path.

#include "percpu/per_cpu.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "tests/stress/stress.hpp"
#include "tests/support/address_limit.hpp"
#include "tests/support/pages.hpp"
#include "tools/seccomp_deny_rseq.hpp"

namespace percpu {
namespace {

namespace stress = percpu::stress;

struct stats {
  std::int64_t requests;
  std::int64_t bytes;
  std::uint64_t errors;
  std::intptr_t last;  // compare-and-store / store target
};

// A T that is not a multiple of 8 bytes, to check copy() and the size class.
struct odd {
  std::int64_t n;
  char tag[5];
};

// Whether this thread's updates run sections (else they go to the shared
// copy, or to the CPU copies with atomics where no thread runs sections).
bool sections_here() { return sections_status() == sections::on; }

TEST(PerCpuTest, FreshObjectIsZeroEverywhere) {
  per_cpu<stats> s;
  EXPECT_EQ(s.cpus(), max_cpus());
  EXPECT_EQ(s.sum(&stats::requests), 0);
  EXPECT_EQ(s.load(&stats::bytes), 0);
  for (int c = 0; c < s.cpus(); ++c) {
    const stats copy = s.copy(c);
    EXPECT_EQ(copy.requests, 0);
    EXPECT_EQ(copy.bytes, 0);
    EXPECT_EQ(copy.errors, 0u);
    EXPECT_EQ(copy.last, 0);
  }
  EXPECT_EQ(s.shared_copy().requests, 0);
}

TEST(PerCpuTest, AddsLandWhereTheHeaderSays) {
  per_cpu<stats> s;
  for (int i = 0; i < 100; ++i) {
    s.add(&stats::requests, std::int64_t{1});
    s.add(&stats::bytes, std::int64_t{10});
  }
  s.add(&stats::errors, std::uint64_t{3});
  EXPECT_EQ(s.sum(&stats::requests), 100);
  EXPECT_EQ(s.sum(&stats::bytes), 1000);
  EXPECT_EQ(s.sum(&stats::errors), 3u);
  std::int64_t in_copies = 0, in_atomic_copies = 0;
  for (int c = 0; c < s.cpus(); ++c) {
    in_copies += s.copy(c).requests;
    in_atomic_copies += s.atomic_copy(c).requests;
  }
  const std::int64_t in_shared = s.shared_copy().requests;
  EXPECT_EQ(in_copies + in_atomic_copies + in_shared, 100);
  EXPECT_EQ(in_shared, 0) << "memory could be mapped: nothing belongs in the shared copy";
  if (sections_here()) {
    std::printf("sections on: checked every add is in the copies sections write\n");
    EXPECT_EQ(in_copies, 100);
  } else {
    std::printf("no sections on this thread: checked every add is in the atomic copies\n");
    EXPECT_EQ(in_atomic_copies, 100) << "a thread without sections wrote the copies sections write";
  }
}

TEST(PerCpuTest, CompareAndStoreLoadAndStoreOnThisCpusCopy) {
  per_cpu<stats> s;
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  EXPECT_TRUE(s.compare_and_store(&stats::last, std::intptr_t{0}, std::intptr_t{7}));
  EXPECT_EQ(s.load(&stats::last), 7);
  EXPECT_FALSE(s.compare_and_store(&stats::last, std::intptr_t{0}, std::intptr_t{9}))
      << "the field holds 7, not 0";
  EXPECT_EQ(s.load(&stats::last), 7);
  s.store(&stats::last, std::intptr_t{42});
  EXPECT_EQ(s.load(&stats::last), 42);
  EXPECT_EQ(s.sum(&stats::last), 42);
  s.add(&stats::last, std::intptr_t{-2});
  EXPECT_EQ(s.load(&stats::last), 40);
}

TEST(PerCpuTest, SnapshotsOfAnOddSizedType) {
  per_cpu<odd> s;
  s.add(&odd::n, std::int64_t{5});
  std::int64_t total = s.shared_copy().n;
  for (int c = 0; c < s.cpus(); ++c) total += s.copy(c).n + s.atomic_copy(c).n;
  EXPECT_EQ(total, 5);
  EXPECT_EQ(s.sum(&odd::n), 5);
}

// The header's own example: the field says the type, so plain literals do.
TEST(PerCpuTest, LiteralsConvertToTheFieldsType) {
  per_cpu<stats> s;
  const stress::affinity_guard restore;  // load() reads this CPU's copy
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  s.add(&stats::requests, 1);
  s.add(&stats::errors, 2);
  EXPECT_TRUE(s.compare_and_store(&stats::last, s.load(&stats::last), 5));
  s.store(&stats::bytes, 9);
  EXPECT_EQ(s.sum(&stats::requests), 1);
  EXPECT_EQ(s.sum(&stats::errors), 2u);
  EXPECT_EQ(s.load(&stats::last), 5);
  EXPECT_EQ(s.load(&stats::bytes), 9);
}

TEST(PerCpuTest, UnsignedSumsWrapAsTheTypeDoes) {
  per_cpu<stats> s;
  s.add(&stats::errors, std::uint64_t{5});
  s.add(&stats::errors, ~std::uint64_t{0});  // -1 modulo 2^64
  EXPECT_EQ(s.sum(&stats::errors), 4u);
}

#ifndef NDEBUG
TEST(PerCpuDeathTest, CopyOutOfRangeAbortsInDebugBuilds) {
  per_cpu<stats> s;
  EXPECT_DEATH((void)s.copy(-1), "per_cpu<T>::copy\\(-1\\): cpu out of range");
  EXPECT_DEATH((void)s.copy(s.cpus()), "cpu out of range \\[0, ");
}
#endif

// ---- the first update in a signal handler ----------------------------------

std::atomic<per_cpu<stats>*> g_first_object{nullptr};
std::atomic<long> g_first_handler_adds{0};

void add_in_handler(int) {
  const int saved_errno = errno;
  if (per_cpu<stats>* s = g_first_object.load(std::memory_order_relaxed)) {
    s->add(&stats::requests, std::int64_t{1});
    g_first_handler_adds.fetch_add(1, std::memory_order_relaxed);
  }
  errno = saved_errno;
}

// Fresh objects whose first update a timer's handler may make, or interrupt:
// every update counts, exactly.
TEST(PerCpuTest, FirstUpdatesInSignalHandlers) {
  stress::install_handler(SIGUSR1, add_in_handler);
  {
    per_cpu<stats> s;
    g_first_object.store(&s);
    raise(SIGUSR1);
    g_first_object.store(nullptr);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    EXPECT_EQ(s.sum(&stats::requests), 1) << "the handler's first add";
  }
  long rounds = 0, handled = 0, wrong = 0;
  {
    alignas(per_cpu<stats>) unsigned char storage[sizeof(per_cpu<stats>)];
    stress::thread_signal_timer timer(SIGUSR1, 20000);
    ASSERT_TRUE(timer.armed());
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + stress::scaled(std::chrono::milliseconds(300));
    const auto limit = start + stress::scaled(std::chrono::milliseconds(5000));
    for (auto now = start; (now < until || (handled == 0 && now < limit)) && rounds < 200000;
         now = std::chrono::steady_clock::now()) {
      auto* s = new (storage) per_cpu<stats>;
      g_first_handler_adds.store(0, std::memory_order_relaxed);
      g_first_object.store(s, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      s->add(&stats::requests, std::int64_t{1000});
      std::atomic_signal_fence(std::memory_order_seq_cst);
      g_first_object.store(nullptr, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      const long by_handlers = g_first_handler_adds.load(std::memory_order_relaxed);
      handled += by_handlers;
      if (s->sum(&stats::requests) != 1000 + by_handlers && wrong++ < 5) {
        ADD_FAILURE() << "round " << rounds << ": sum " << s->sum(&stats::requests)
                      << ", expected " << 1000 + by_handlers;
      }
      s->~per_cpu();
      ++rounds;
    }
  }
  std::printf("%ld fresh objects, %ld handler adds\n", rounds, handled);
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(handled, 0) << "no timer signal arrived";
}

// ---- stress ------------------------------------------------------------------

constexpr int kWorkers = 12;
constexpr int kSignal = SIGUSR2;
std::atomic<per_cpu<stats>*> g_signal_object{nullptr};
std::atomic<long> g_handler_updates{0};

void update_in_handler(int) {
  const int saved_errno = errno;
  if (per_cpu<stats>* s = g_signal_object.load(std::memory_order_relaxed)) {
    s->add(&stats::requests, std::int64_t{1});
    s->add(&stats::bytes, std::int64_t{3});
    g_handler_updates.fetch_add(1, std::memory_order_relaxed);
  }
  errno = saved_errno;
}

struct run_options {
  bool flip_affinity = false;
  bool signals = false;
  bool deny_rseq_to_odd_workers = false;
};

struct totals {
  long requests = 0;
  long bytes = 0;
  long stored = 0;  // successful compare-and-stores
};

// kWorkers threads on 2 CPUs: each loop adds to two fields, and bumps
// `last` by compare-and-store, counting its successes.
totals hammer(per_cpu<stats>& s, const run_options& options) {
  const std::vector<int> cpus = stress::test_cpus(2);
  const stress::affinity_guard restore;
  EXPECT_TRUE(stress::restrict_to(cpus));
  if (options.signals) {
    g_handler_updates.store(0);
    g_signal_object = &s;
    stress::install_handler(kSignal, update_in_handler);
  }
  std::atomic<long> requests{0}, bytes{0}, stored{0};
  std::atomic<int> filter_failures{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      if (options.deny_rseq_to_odd_workers && w % 2 == 1 && !tools::deny_rseq(EPERM)) {
        filter_failures++;
      }
      std::unique_ptr<stress::thread_signal_timer> timer;
      if (options.signals) timer.reset(new stress::thread_signal_timer(kSignal, 10000));
      long r = 0, b = 0, st = 0;
      const std::int64_t delta = w % 3 == 0 ? -1 : 2;
      while (!stop) {
        for (int i = 0; i < 32; ++i) {
          s.add(&stats::requests, delta);
          s.add(&stats::bytes, std::int64_t{7});
          const std::intptr_t seen = s.load(&stats::last);
          if (s.compare_and_store(&stats::last, seen, seen + 1)) ++st;
        }
        r += 32 * delta;
        b += 32 * 7;
      }
      requests.fetch_add(r);
      bytes.fetch_add(b);
      stored.fetch_add(st);
    });
    std::unique_ptr<stress::affinity_flipper> flipper;
    if (options.flip_affinity) {
      flipper.reset(new stress::affinity_flipper(workers, cpus, std::chrono::microseconds(300)));
    }
    stress::sleep_scaled(std::chrono::milliseconds(400));
    if (flipper) {
      flipper->stop();
      std::printf("affinity flips: %ld\n", flipper->flips());
    }
    workers.stop_and_join();
  }
  EXPECT_EQ(filter_failures.load(), 0);
  totals t{requests.load(), bytes.load(), stored.load()};
  if (options.signals) {
    stress::restore_default(kSignal);
    g_signal_object = nullptr;
    EXPECT_GT(g_handler_updates.load(), 0) << "no timer signal reached a worker";
    t.requests += g_handler_updates.load();
    t.bytes += 3 * g_handler_updates.load();
  }
  return t;
}

void expect_exact(const per_cpu<stats>& s, const totals& t) {
  EXPECT_EQ(s.sum(&stats::requests), t.requests);
  EXPECT_EQ(s.sum(&stats::bytes), t.bytes);
  // Every successful compare-and-store raised `last` by one on some copy,
  // and nothing else wrote it: the copies sum to the successes.
  EXPECT_EQ(s.sum(&stats::last), t.stored) << "a compare-and-store was lost or doubled";
  EXPECT_GT(t.stored, 0);
  std::int64_t by_copies = s.shared_copy().requests;
  for (int c = 0; c < s.cpus(); ++c) by_copies += s.copy(c).requests + s.atomic_copy(c).requests;
  EXPECT_EQ(by_copies, t.requests) << "copy() and sum() disagree once updates stopped";
}

TEST(PerCpuStressTest, Oversubscribed) {
  per_cpu<stats> s;
  expect_exact(s, hammer(s, {}));
}

TEST(PerCpuStressTest, SignalsAndAffinityFlipping) {
  per_cpu<stats> s;
  run_options options;
  options.signals = true;
  options.flip_affinity = true;
  expect_exact(s, hammer(s, options));
}

// Threads whose rseq(2) fails (tools/seccomp_deny_rseq.hpp) next to threads
// on sections, on the same object: in own-registration mode only, where the
// refusal is per thread.
TEST(PerCpuStressTest, ThreadsWithAndWithoutRseqOnOneObject) {
  (void)cpu_id();
  if (rseq_ownership() != rseq_owner::percpu) {
    GTEST_SKIP() << "needs percpu's own registration (the .own variant); rseq owner here: "
                 << to_string(rseq_ownership());
  }
  per_cpu<stats> s;
  run_options options;
  options.flip_affinity = true;
  options.deny_rseq_to_odd_workers = true;
  const totals t = hammer(s, options);
  expect_exact(s, t);
  std::int64_t with = 0, without = 0;
  for (int c = 0; c < s.cpus(); ++c) {
    with += s.copy(c).bytes;
    without += s.atomic_copy(c).bytes;
  }
  std::printf("bytes added by sections: %lld, by atomics: %lld\n", static_cast<long long>(with),
              static_cast<long long>(without));
  EXPECT_GT(with, 0) << "the workers with rseq ran sections";
  EXPECT_GT(without, 0) << "the workers without rseq used the atomic copies";
}

TEST(PerCpuStressTest, ThreadChurn) {
  per_cpu<stats> s;
  const long threads = stress::scaled(400L);
  stress::churn(threads, kWorkers, [&](long n) {
    for (int i = 0; i < 300; ++i) s.add(&stats::requests, std::int64_t{n % 2 == 0 ? 1 : 3});
  });
  long expected = 0;
  for (long n = 0; n < threads; ++n) expected += 300 * (n % 2 == 0 ? 1 : 3);
  EXPECT_EQ(s.sum(&stats::requests), expected);
}

// ---- memory --------------------------------------------------------------------

// Where an object's copies are (nullptr until taken), read without a seam
// in the library: an explicit instantiation may name a private member
// ([temp.spec.general]), and the friend it defines hands the storage out.
struct pair16 {
  std::int64_t a, b;
};
const internal::per_cpu_storage& storage_of(const per_cpu<pair16>& p);
template <auto Storage>
struct expose_per_cpu_storage {
  friend const internal::per_cpu_storage& storage_of(const per_cpu<pair16>& p) {
    return p.*Storage;
  }
};
template struct expose_per_cpu_storage<&per_cpu<pair16>::storage_>;

// 100,000 objects of a 16-byte T, each updated once: 16 bytes of per-CPU
// memory per CPU the updates ran on. Counted with mincore over every CPU's
// copies of both sets, before anything reads them (a read would map the
// zero page, which costs nothing but shows present); the process's resident
// memory would count a sanitizer's or valgrind's shadow of them too.
TEST(PerCpuTest, AHundredThousandObjectsTakeBytesEach) {
  constexpr long kObjects = 100000;
  std::unique_ptr<per_cpu<pair16>[]> objects(new per_cpu<pair16>[kObjects]);
  for (long i = 0; i < kObjects; ++i) objects[i].add(&pair16::a, std::int64_t{1});
  const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::set<std::uintptr_t> first_pages;
  for (long i = 0; i < kObjects; ++i) {
    const internal::per_cpu_storage& st = storage_of(objects[i]);
    for (const std::atomic<void*>* set : {&st.copies, &st.atomic_copies}) {
      if (void* base = set->load()) first_pages.insert(reinterpret_cast<std::uintptr_t>(base) & ~(page - 1));
    }
  }
  const long present = test::present_stride_pages(first_pages, max_cpus());
  ASSERT_GE(present, 0);
  const double per_object = static_cast<double>(present * page) / kObjects;
  std::printf("%ld objects of 16 bytes, each updated once: %.1f bytes of per-CPU memory each "
              "(%ld pages), plus %zu bytes of the object; %d possible CPUs\n",
              kObjects, per_object, present, sizeof(per_cpu<pair16>), max_cpus());
  EXPECT_GT(present, 0) << "the updates took no per-CPU memory";
  EXPECT_LE(per_object, 16.0 * max_cpus() + 8) << "more than 16 bytes per CPU per object";
  std::int64_t total = 0;
  for (long i = 0; i < kObjects; ++i) total += objects[i].sum(&pair16::a);
  EXPECT_EQ(total, kObjects);
}

// No memory for the copies (an address-space limit in a child): updates go
// to the shared copy and stay exact, and errno is kept.
TEST(PerCpuTest, UpdatesStayExactWhenNoMemoryCanBeMapped) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  struct big {
    std::int64_t n;
    char pad[2040];
  };
  // More than the 2048-byte class holds without a new chunk.
  constexpr int kObjects = 4096;
  std::unique_ptr<per_cpu<big>[]> objects(new per_cpu<big>[kObjects]);
  const int status = test::run_under_address_limit(0, [&] {
    errno = 4321;
    int unmapped = -1;
    for (int i = 0; i < kObjects && unmapped < 0; ++i) {
      objects[i].add(&big::n, std::int64_t{1});
      bool any_copy = false;
      for (int c = 0; c < objects[i].cpus(); ++c) {
        any_copy = any_copy || objects[i].copy(c).n != 0 || objects[i].atomic_copy(c).n != 0;
      }
      if (!any_copy && objects[i].shared_copy().n == 1) unmapped = i;
    }
    if (unmapped < 0) return 3;
    per_cpu<big>& s = objects[unmapped];
    for (int i = 0; i < 999; ++i) s.add(&big::n, std::int64_t{2});
    if (s.sum(&big::n) != 1 + 999 * 2) return 4;
    if (s.shared_copy().n != s.sum(&big::n)) return 5;
    if (errno != 4321) return 7;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  if (WEXITSTATUS(status) == test::kLimitNotEnforced) {
    GTEST_SKIP() << "RLIMIT_AS is not enforced here (qemu-user ignores it)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "98: setrlimit failed, 3: every object found memory, 4: sum inexact, "
         "5: not all in the shared copy, 7: errno changed";
}

}  // namespace
}  // namespace percpu
