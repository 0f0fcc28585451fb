// Tests for percpu::per_cpu<T> and cid_per_cpu<T> (each test runs on both,
// as a typed test, except where one alone is meant): the operations on one thread, where updates
// land in each mode (this CPU's copy with sections, the shared copy without),
// exact sums of several fields with 12 threads on 2 CPUs under affinity
// flipping and timer signals whose handlers update too, compare-and-store
// counting every success exactly once, threads with and without rseq on the
// same object, the first update made in a signal handler, memory per
// instance, and no memory at all; for cid_per_cpu, updates below the
// concurrency limit, its compare-and-store section's exits, and readers
// that walk only the ids used with 4,096 possible CPUs. The mode variants
// (.glibc, .own, .fallback) run all of it on each path.

#include "percpu/per_cpu.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "percpu/cpu.hpp"
#include "percpu/internal/concurrency_limit.hpp"
#include "percpu/internal/fallback.hpp"
#include "tests/stress/stress.hpp"
#include "tests/support/address_limit.hpp"
#include "tests/support/pages.hpp"
#include "tests/support/wide_possible_list.hpp"
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

// The two indexings, as gtest's types: object<Kind, T> is the structure.
struct by_cpu {
  template <typename T>
  using of = per_cpu<T>;
};
struct by_id {
  template <typename T>
  using of = cid_per_cpu<T>;
};
template <typename Kind, typename T>
using object = typename Kind::template of<T>;
using kinds = ::testing::Types<by_cpu, by_id>;
struct kind_names {
  template <typename Kind>
  static std::string GetName(int) {
    return std::is_same<Kind, by_cpu>::value ? "ByCpu" : "ById";
  }
};

template <typename Kind>
class PerCpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(PerCpuTest, kinds, kind_names);
template <typename Kind>
class PerCpuStressTest : public ::testing::Test {};
TYPED_TEST_SUITE(PerCpuStressTest, kinds, kind_names);
template <typename Kind>
class PerCpuDeathTest : public ::testing::Test {};
TYPED_TEST_SUITE(PerCpuDeathTest, kinds, kind_names);

// Whether this thread's updates run sections (else they go to the shared
// copy, or to the CPU copies with atomics where no thread runs sections).
bool sections_here() { return sections_status() == sections::on; }

TYPED_TEST(PerCpuTest, FreshObjectIsZeroEverywhere) {
  object<TypeParam, stats> s;
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

TYPED_TEST(PerCpuTest, AddsLandWhereTheHeaderSays) {
  object<TypeParam, stats> s;
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

TYPED_TEST(PerCpuTest, CompareAndStoreLoadAndStoreOnThisCpusCopy) {
  object<TypeParam, stats> s;
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  // A thread without rseq whose fallback is the getcpu system call keeps
  // its CPU answer for up to kCpuHintUses calls (the header's "or ran on
  // lately"): a refresh between two of the calls below moved the store to
  // another CPU's copy once (sum 7 + 42). Asking that often here, after
  // pinning, makes every later answer this CPU.
  for (unsigned i = 0; i < internal::kCpuHintUses; ++i) (void)internal::cpu_hint();
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

TYPED_TEST(PerCpuTest, SnapshotsOfAnOddSizedType) {
  object<TypeParam, odd> s;
  s.add(&odd::n, std::int64_t{5});
  std::int64_t total = s.shared_copy().n;
  for (int c = 0; c < s.cpus(); ++c) total += s.copy(c).n + s.atomic_copy(c).n;
  EXPECT_EQ(total, 5);
  EXPECT_EQ(s.sum(&odd::n), 5);
}

// The header's own example: the field says the type, so plain literals do.
TYPED_TEST(PerCpuTest, LiteralsConvertToTheFieldsType) {
  object<TypeParam, stats> s;
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

TYPED_TEST(PerCpuTest, UnsignedSumsWrapAsTheTypeDoes) {
  object<TypeParam, stats> s;
  s.add(&stats::errors, std::uint64_t{5});
  s.add(&stats::errors, ~std::uint64_t{0});  // -1 modulo 2^64
  EXPECT_EQ(s.sum(&stats::errors), 4u);
}

#ifndef NDEBUG
TYPED_TEST(PerCpuDeathTest, CopyOutOfRangeAbortsInDebugBuilds) {
  object<TypeParam, stats> s;
  EXPECT_DEATH((void)s.copy(-1), "per_cpu<T>::copy\\(-1\\): cpu out of range");
  EXPECT_DEATH((void)s.copy(s.cpus()), "cpu out of range \\[0, ");
}
#endif

// ---- the first update in a signal handler ----------------------------------

template <typename Object>
std::atomic<Object*> g_first_object{nullptr};
std::atomic<long> g_first_handler_adds{0};

template <typename Object>
void add_in_handler(int) {
  const int saved_errno = errno;
  if (Object* s = g_first_object<Object>.load(std::memory_order_relaxed)) {
    s->add(&stats::requests, std::int64_t{1});
    g_first_handler_adds.fetch_add(1, std::memory_order_relaxed);
  }
  errno = saved_errno;
}

// Fresh objects whose first update a timer's handler may make, or interrupt:
// every update counts, exactly.
TYPED_TEST(PerCpuTest, FirstUpdatesInSignalHandlers) {
  using Object = object<TypeParam, stats>;
  stress::install_handler(SIGUSR1, add_in_handler<Object>);
  {
    Object s;
    g_first_object<Object>.store(&s);
    raise(SIGUSR1);
    g_first_object<Object>.store(nullptr);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    EXPECT_EQ(s.sum(&stats::requests), 1) << "the handler's first add";
  }
  long rounds = 0, handled = 0, wrong = 0;
  {
    alignas(Object) unsigned char storage[sizeof(Object)];
    stress::thread_signal_timer timer(SIGUSR1, 20000);
    ASSERT_TRUE(timer.armed());
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + stress::scaled(std::chrono::milliseconds(300));
    // Five seconds whatever the stress scale, as in counter_test.cpp: the
    // scale shortens the run, not the wait for the one signal the check needs.
    const auto limit = start + std::max(stress::scaled(std::chrono::milliseconds(5000)),
                                        std::chrono::milliseconds(5000));
    // Until `until` and 200,000 objects, or while no signal has landed in
    // an update yet, until `limit`: under emulation the window between the
    // stores is a few instructions, which a timer's signal rarely hits.
    for (auto now = start; handled == 0 ? now < limit : (now < until && rounds < 200000);
         now = std::chrono::steady_clock::now()) {
      auto* s = new (storage) Object;
      g_first_handler_adds.store(0, std::memory_order_relaxed);
      g_first_object<Object>.store(s, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      s->add(&stats::requests, std::int64_t{1000});
      std::atomic_signal_fence(std::memory_order_seq_cst);
      g_first_object<Object>.store(nullptr, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      const long by_handlers = g_first_handler_adds.load(std::memory_order_relaxed);
      handled += by_handlers;
      if (s->sum(&stats::requests) != 1000 + by_handlers && wrong++ < 5) {
        ADD_FAILURE() << "round " << rounds << ": sum " << s->sum(&stats::requests)
                      << ", expected " << 1000 + by_handlers;
      }
      s->~Object();
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
template <typename Object>
std::atomic<Object*> g_signal_object{nullptr};
std::atomic<long> g_handler_updates{0};

template <typename Object>
void update_in_handler(int) {
  const int saved_errno = errno;
  if (Object* s = g_signal_object<Object>.load(std::memory_order_relaxed)) {
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
template <typename Object>
totals hammer(Object& s, const run_options& options) {
  const std::vector<int> cpus = stress::test_cpus(2);
  const stress::affinity_guard restore;
  EXPECT_TRUE(stress::restrict_to(cpus));
  if (options.signals) {
    g_handler_updates.store(0);
    g_signal_object<Object> = &s;
    stress::install_handler(kSignal, update_in_handler<Object>);
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
    g_signal_object<Object> = nullptr;
    EXPECT_GT(g_handler_updates.load(), 0) << "no timer signal reached a worker";
    t.requests += g_handler_updates.load();
    t.bytes += 3 * g_handler_updates.load();
  }
  return t;
}

template <typename Object>
void expect_exact(const Object& s, const totals& t) {
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

TYPED_TEST(PerCpuStressTest, Oversubscribed) {
  object<TypeParam, stats> s;
  expect_exact(s, hammer(s, {}));
}

TYPED_TEST(PerCpuStressTest, SignalsAndAffinityFlipping) {
  object<TypeParam, stats> s;
  run_options options;
  options.signals = true;
  options.flip_affinity = true;
  expect_exact(s, hammer(s, options));
}

// Threads whose rseq(2) fails (tools/seccomp_deny_rseq.hpp) next to threads
// on sections, on the same object: in own-registration mode only, where the
// refusal is per thread.
TYPED_TEST(PerCpuStressTest, ThreadsWithAndWithoutRseqOnOneObject) {
  (void)cpu_id();
  if (rseq_ownership() != rseq_owner::percpu) {
    GTEST_SKIP() << "needs percpu's own registration (the .own variant); rseq owner here: "
                 << to_string(rseq_ownership());
  }
  object<TypeParam, stats> s;
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

TYPED_TEST(PerCpuStressTest, ThreadChurn) {
  object<TypeParam, stats> s;
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
// A cid_per_cpu<T> is a per_cpu<T> underneath, its private base, which a
// C-style cast may name.
struct pair16 {
  std::int64_t a, b;
};
const internal::per_cpu_storage& storage_of(const per_cpu<pair16>& p);
const internal::per_cpu_storage& storage_of(const per_cpu<stats>& p);
template <typename T, auto Storage>
struct expose_per_cpu_storage {
  friend const internal::per_cpu_storage& storage_of(const per_cpu<T>& p) { return p.*Storage; }
};
template struct expose_per_cpu_storage<pair16, &per_cpu<pair16>::storage_>;
template struct expose_per_cpu_storage<stats, &per_cpu<stats>::storage_>;
template <typename T>
const internal::per_cpu_storage& storage_of(const cid_per_cpu<T>& p) {
  return storage_of((const per_cpu<T>&)p);
}

// 100,000 objects of a 16-byte T, each updated once: 16 bytes of per-CPU
// memory per CPU the updates ran on. Counted with mincore over every CPU's
// copies of both sets, before anything reads them (a read would map the
// zero page, which costs nothing but shows present); the process's resident
// memory would count a sanitizer's or valgrind's shadow of them too.
TYPED_TEST(PerCpuTest, AHundredThousandObjectsTakeBytesEach) {
  constexpr long kObjects = 100000;
  std::unique_ptr<object<TypeParam, pair16>[]> objects(new object<TypeParam, pair16>[kObjects]);
  for (long i = 0; i < kObjects; ++i) objects[i].add(&pair16::a, std::int64_t{1});
  const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::set<std::uintptr_t> first_pages;
  for (long i = 0; i < kObjects; ++i) {
    const internal::per_cpu_storage& st = storage_of(objects[i]);
    for (const std::atomic<void*>* set : {&st.copies, &st.atomic_copies}) {
      if (void* base = set->load()) first_pages.insert(reinterpret_cast<std::uintptr_t>(base) & ~(page - 1));
    }
  }
  // By concurrency id, only the copies below the limit can be written; the
  // ones above may show present all the same where a by-CPU object that
  // used this memory before read them when it was destroyed (the zero page).
  const int indexes = std::is_same<TypeParam, by_id>::value
                          ? static_cast<int>(internal::concurrency_limit())
                          : max_cpus();
  const long present = test::present_stride_pages(first_pages, indexes);
  ASSERT_GE(present, 0);
  const double per_object = static_cast<double>(present * page) / kObjects;
  std::printf(
      "%ld objects of 16 bytes, each updated once: %.1f bytes of per-CPU memory each "
      "(%ld pages, over %d copies), plus %zu bytes of the object; %d possible CPUs\n",
      kObjects, per_object, present, indexes, sizeof(object<TypeParam, pair16>), max_cpus());
  EXPECT_GT(present, 0) << "the updates took no per-CPU memory";
  EXPECT_LE(per_object, 16.0 * indexes + 8) << "more than 16 bytes per index per object";
  std::int64_t total = 0;
  for (long i = 0; i < kObjects; ++i) total += objects[i].sum(&pair16::a);
  EXPECT_EQ(total, kObjects);
}

// No memory for the copies (an address-space limit in a child): updates go
// to the shared copy and stay exact, and errno is kept.
TYPED_TEST(PerCpuTest, UpdatesStayExactWhenNoMemoryCanBeMapped) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  struct big {
    std::int64_t n;
    char pad[2040];
  };
  // More than the 2048-byte class holds without a new chunk.
  constexpr int kObjects = 4096;
  std::unique_ptr<object<TypeParam, big>[]> objects(new object<TypeParam, big>[kObjects]);
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
    object<TypeParam, big>& s = objects[unmapped];
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

// ---- cid_per_cpu: copies indexed by concurrency id ------------------------

// Every update lands below the concurrency limit, which stays within
// max_cpus(): the copies there hold the whole sum, and every copy at or
// above it reads zero.
TEST(CidPerCpuTest, UpdatesLandBelowTheConcurrencyLimit) {
  cid_per_cpu<stats> s;
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) s.add(&stats::requests, std::int64_t{1});
      });
    }
    for (std::thread& t : threads) t.join();
  }
  const unsigned limit = internal::concurrency_limit();
  ASSERT_GE(limit, 1u);
  ASSERT_LE(limit, static_cast<unsigned>(max_cpus()));
  std::int64_t below = s.shared_copy().requests;
  for (int i = 0; i < s.cpus(); ++i) {
    const std::int64_t here = s.copy(i).requests + s.atomic_copy(i).requests;
    if (static_cast<unsigned>(i) < limit) {
      below += here;
    } else {
      EXPECT_EQ(here, 0) << "an update at id " << i << ", the limit being " << limit;
    }
  }
  EXPECT_EQ(below, 4000);
  EXPECT_EQ(s.sum(&stats::requests), 4000);
}

// With sections, a thread updates the copy of its concurrency id, and
// load() reads it there.
TEST(CidPerCpuTest, AThreadUpdatesTheCopyOfItsId) {
  if (!sections_here()) GTEST_SKIP() << "no sections: updates go to the atomic copies, by CPU";
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  int checked = 0;
  for (int attempt = 0; attempt < 100 && checked == 0; ++attempt) {
    cid_per_cpu<stats> s;
    const int before = concurrency_id();
    s.add(&stats::requests, 5);  // takes the copies
    s.add(&stats::requests, 7);
    const bool stored = s.compare_and_store(&stats::last, 0, 3);
    const std::intptr_t loaded = s.load(&stats::last);
    if (concurrency_id() != before) continue;  // moved: try again
    EXPECT_TRUE(stored);
    EXPECT_EQ(loaded, 3);
    EXPECT_EQ(s.copy(before).requests, 12) << "the adds are not in id " << before << "'s copy";
    EXPECT_EQ(s.copy(before).last, 3) << "the compare-and-store is not in id " << before << "'s";
    EXPECT_EQ(s.sum(&stats::requests), 12);
    ++checked;
  }
  EXPECT_EQ(checked, 1) << "the concurrency id moved on every attempt";
}

// The compare-and-store section's three ways out, run on the section
// itself (internal/rseq_cs.hpp, the concurrency-id form): an id not below
// the limit leaves with 2 and writes nothing, a copy that holds another
// value with 1, a match commits.
TEST(CidPerCpuTest, TheCompareAndStoreSectionLeavesForAnIdNotBelowTheLimit) {
  if (sections_status() != sections::on) GTEST_SKIP() << "no sections in this mode";
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  cid_per_cpu<stats> s;
  s.add(&stats::last, 0);  // takes the copies
  char* base = static_cast<char*>(storage_of(s).copies.load());
  ASSERT_NE(base, nullptr);
  auto* word = reinterpret_cast<std::intptr_t*>(base + offsetof(stats, last));
  int checked = 0;
  for (int attempt = 0; attempt < 1000 && checked < 20; ++attempt) {
    const internal::cid_start start = internal::start_cid_section();
    const int id = internal::started_concurrency_id(start);
    ASSERT_GE(id, 0);
    ASSERT_LT(id, max_cpus());
    const auto at = static_cast<std::uint32_t>(id);
    auto* mine = internal::stride_copy(word, at);
    const std::intptr_t v = __atomic_load_n(mine, __ATOMIC_RELAXED);
    const int beyond = internal::rseq_cmpeqv_storev_cid_started(start, word, at, v, v + 1);
    const int other = internal::rseq_cmpeqv_storev_cid_started(start, word, at + 1, v + 100, v + 1);
    const std::intptr_t untouched = __atomic_load_n(mine, __ATOMIC_RELAXED);
    const int match = internal::rseq_cmpeqv_storev_cid_started(start, word, at + 1, v, v + 1);
    if (internal::started_concurrency_id(start) != id || beyond == -1 || other == -1 ||
        match == -1) {
      continue;  // aborted, or the id moved: again
    }
    EXPECT_EQ(beyond, 2) << "a compare-and-store at id " << id << " with the limit at " << id;
    EXPECT_EQ(other, 1) << "a compare-and-store of a value the copy does not hold";
    EXPECT_EQ(untouched, v) << "a section that left wrote the copy";
    EXPECT_EQ(match, 0);
    EXPECT_EQ(__atomic_load_n(mine, __ATOMIC_RELAXED), v + 1) << "the match did not store";
    ++checked;
  }
  EXPECT_EQ(checked, 20);
}

// ---- cid_per_cpu with 4,096 possible CPUs ---------------------------------
//
// CidPerCpuTest.WithFourThousandPossibleCpus runs this binary again with
// 0-4095 possible CPUs (tests/support/wide_possible_list.hpp) and the
// filter below.

constexpr char kWideFilter[] = "--gtest_filter=CidPerCpuWideTest.*";

TEST(CidPerCpuWideTest, ReadersWalkOnlyTheIdsUsed) {
  const char* real = test::real_max_cpus_in_wide_run();
  if (real == nullptr) GTEST_SKIP() << "runs inside CidPerCpuTest.WithFourThousandPossibleCpus";
  ASSERT_EQ(max_cpus(), 4096) << "the bind-mounted possible list was not read";
  cid_per_cpu<stats> by_id;
  per_cpu<stats> by_cpu;
  // The first updates, which take the copies, from the lowest CPU used;
  // then two threads, each on a CPU of its own, updating at the same time:
  // two ids, one of them a new high the limit must be raised to before an
  // update lands there. First adds alone (a compare-and-store raises the
  // limit out of line, which would cover for an add that did not), then
  // compare-and-stores.
  const std::vector<int> cpus = stress::test_cpus(2);
  {
    const stress::affinity_guard restore;
    ASSERT_TRUE(stress::restrict_to({cpus[0]}));
    by_id.add(&stats::bytes, 1);
    by_cpu.add(&stats::bytes, 1);
  }
  std::atomic<long> stored{0};
  test::run_on_two_cpus_at_once(cpus, [&] {
    for (int i = 0; i < 100000; ++i) {
      by_id.add(&stats::requests, 1);
      by_cpu.add(&stats::requests, 1);
    }
  });
  EXPECT_EQ(by_id.sum(&stats::requests), 200000) << "an add at a new high id is not in the sum";
  EXPECT_EQ(by_cpu.sum(&stats::requests), 200000);
  test::run_on_two_cpus_at_once(cpus, [&] {
    long mine = 0;
    for (int i = 0; i < 100000; ++i) {
      const std::intptr_t seen = by_id.load(&stats::last);
      if (by_id.compare_and_store(&stats::last, seen, seen + 1)) ++mine;
    }
    stored.fetch_add(mine);
  });
  EXPECT_EQ(by_id.sum(&stats::last), stored.load());
  const unsigned limit = internal::concurrency_limit();
  std::printf("possible 0-4095, real max_cpus %s: concurrency limit %u, sections %s\n", real, limit,
              to_string(sections_status()));
  EXPECT_GE(limit, 1u);
  EXPECT_LE(limit, static_cast<unsigned>(std::atoi(real)));
  // What sum() reads: a word written at the limit, where no update can
  // have gone, is not in a cid_per_cpu's sum; at the last possible CPU it
  // is in a per_cpu's (the check that such a write is seen at all).
  auto planted = [](const internal::per_cpu_storage& st, unsigned at) {
    void* set = st.copies.load() != nullptr ? st.copies.load() : st.atomic_copies.load();
    return set == nullptr ? nullptr
                          : reinterpret_cast<std::intptr_t*>(
                                internal::stride_copy(static_cast<char*>(set), at) +
                                offsetof(stats, requests));
  };
  std::intptr_t* id_word = planted(storage_of(by_id), limit);
  std::intptr_t* cpu_word = planted(storage_of(by_cpu), 4095u);
  ASSERT_NE(id_word, nullptr);
  ASSERT_NE(cpu_word, nullptr);
  __atomic_store_n(id_word, 1000, __ATOMIC_RELAXED);
  __atomic_store_n(cpu_word, 1000, __ATOMIC_RELAXED);
  EXPECT_EQ(by_id.sum(&stats::requests), 200000) << "sum() read a copy at or above the limit";
  EXPECT_EQ(by_cpu.sum(&stats::requests), 201000);
  __atomic_store_n(id_word, 0, __ATOMIC_RELAXED);
  __atomic_store_n(cpu_word, 0, __ATOMIC_RELAXED);
}

TEST(CidPerCpuTest, WithFourThousandPossibleCpus) {
  test::run_with_4096_possible_cpus(kWideFilter, max_cpus());
}

}  // namespace
}  // namespace percpu
