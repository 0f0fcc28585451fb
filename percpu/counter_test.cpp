// Tests for percpu::counter: the API, and exact sums with 12 threads on 2
// CPUs under oversubscription, affinity flipping, timer signals whose
// handlers add too, fork during heavy use, and thread churn; nothing mapped
// before the first add(), and first adds made in signal handlers. The mode
// variants (.glibc, .own, .fallback) run all of it on each path.

#include "percpu/counter.hpp"

#include <gtest/gtest.h>
#include <linux/audit.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "percpu/internal/registration.hpp"
#include "tests/stress/stress.hpp"
#include "tests/support/address_limit.hpp"
#include "tests/support/pages.hpp"
#include "tests/support/wide_possible_list.hpp"
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

// ---- memory: mapped on the first add(), which may run in a handler -------------

// Where a counter's slots are mapped (nullptr until the first add()), read
// without a seam in the library: an explicit instantiation may name a
// private member ([temp.spec.general]), and the friend it defines hands the
// pointer out.
const void* mapped_slots(const counter& c);
template <auto Slots>
struct expose_counter_slots {
  friend const void* mapped_slots(const counter& c) {
    return (c.*Slots).load(std::memory_order_acquire);
  }
};
template struct expose_counter_slots<&counter::slots_>;

// C12: construction and every reader leave the counter unmapped; the first
// add() maps it.
TEST(CounterTest, NothingIsMappedBeforeTheFirstAdd) {
  counter c;
  EXPECT_EQ(mapped_slots(c), nullptr) << "construction mapped the slots";
  EXPECT_EQ(c.load(), 0);
  EXPECT_EQ(c.slots(), max_cpus());
  for (int i = 0; i < c.slots(); ++i) EXPECT_EQ(c.slot(i), 0);
  EXPECT_EQ(c.load(), 0);
  EXPECT_EQ(mapped_slots(c), nullptr) << "load(), slot() or slots() mapped the slots";
  c.add(3);
  EXPECT_NE(mapped_slots(c), nullptr) << "the first add() must map the slots";
  EXPECT_EQ(c.load(), 3);
}

// Memory per instance: 100,000 counters, each added to once, take 16 bytes
// per CPU the adds ran on (internal/stride_arena.hpp), not a page each.
// Counted with mincore over every CPU's copies before anything reads them
// (a read would map the zero page, which costs nothing but shows present).
TEST(CounterTest, AHundredThousandCountersTakeBytesEach) {
  constexpr long kCounters = 100000;
  std::unique_ptr<counter[]> counters(new counter[kCounters]);
  for (long i = 0; i < kCounters; ++i) counters[i].add(1);
  const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::set<std::uintptr_t> cpu0_pages;
  for (long i = 0; i < kCounters; ++i) {
    cpu0_pages.insert(reinterpret_cast<std::uintptr_t>(mapped_slots(counters[i])) & ~(page - 1));
  }
  const long present = test::present_stride_pages(cpu0_pages, max_cpus());
  ASSERT_GE(present, 0);
  const double per_counter = static_cast<double>(present * page) / kCounters;
  std::printf("%ld counters, each added to once: %.1f bytes of per-CPU memory each "
              "(%ld pages), plus %zu bytes of the counter itself; %d possible CPUs\n",
              kCounters, per_counter, present, sizeof(counter), max_cpus());
  EXPECT_LE(per_counter, 16.0 * max_cpus() + 8) << "more than 16 bytes per CPU per counter";
  std::int64_t total = 0;
  for (long i = 0; i < kCounters; ++i) total += counters[i].load();
  EXPECT_EQ(total, kCounters);
}

// "If no memory can be mapped, adds go to a single shared atomic and stay
// exact": in a child whose address space is limited to what it has mapped,
// counters are added to until one finds no memory for its slots; that one
// still counts exactly, in load() and in no slot(), and no member changed
// errno.
TEST(CounterTest, AddsStayExactWhenNoMemoryCanBeMapped) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  // More than the arena can hold without a new chunk: a chunk of the 16-byte
  // class and the objects earlier tests gave back (100,000 of them).
  constexpr int kCounters = 262144;
  std::unique_ptr<counter[]> counters(new counter[kCounters]);
  const int status = test::run_under_address_limit(0, [&] {
    errno = 4321;
    int first_unmapped = -1;
    for (int i = 0; i < kCounters && first_unmapped < 0; ++i) {
      counters[i].add(1);
      if (mapped_slots(counters[i]) == nullptr) first_unmapped = i;
    }
    if (first_unmapped < 0) return 3;
    counter& c = counters[first_unmapped];
    for (int i = 0; i < 1000; ++i) c.add(i % 2 == 0 ? 3 : -1);
    c.increment();
    if (c.load() != 1 + 500 * 3 - 500 + 1) return 4;
    std::int64_t by_slots = 0;
    for (int i = 0; i < c.slots(); ++i) by_slots += c.slot(i);
    if (by_slots != 0) return 5;  // no slot: the shared atomic holds them
    if (mapped_slots(c) != nullptr) return 6;
    if (errno != 4321) return 7;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  if (WEXITSTATUS(status) == test::kLimitNotEnforced) {
    GTEST_SKIP() << "RLIMIT_AS is not enforced here (qemu-user ignores it)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "98: setrlimit failed, 3: every counter found memory, 4: load() inexact, "
         "5: a slot holds adds made without memory, 6: slots mapped later, 7: errno changed";
}

constexpr int kFirstAddSignal = SIGUSR1;
std::atomic<counter*> g_first_add_counter{nullptr};
std::atomic<long> g_first_add_handler_adds{0};
std::atomic<long> g_first_adds_raced{0};  // handlers that found the counter unmapped
std::atomic<bool> g_first_add_running{false};

void add_first_in_handler(int) {
  const int saved_errno = errno;
  if (counter* c = g_first_add_counter.load(std::memory_order_relaxed)) {
    if (g_first_add_running.load(std::memory_order_relaxed) && mapped_slots(*c) == nullptr) {
      g_first_adds_raced.fetch_add(1, std::memory_order_relaxed);
    }
    c->add(1);
    g_first_add_handler_adds.fetch_add(1, std::memory_order_relaxed);
  }
  errno = saved_errno;
}

// C13: a fresh counter's first add() (its mmap) made by a signal handler,
// and first adds interrupted by handlers whose add() is the counter's first
// too (the timer's signals pend across the mmap and arrive as it returns,
// before the block is installed). Every add counts, exactly.
TEST(CounterTest, FirstAddInASignalHandler) {
  stress::install_handler(kFirstAddSignal, add_first_in_handler);
  {
    counter c;
    g_first_add_handler_adds.store(0);
    g_first_add_counter.store(&c);
    raise(kFirstAddSignal);
    g_first_add_counter.store(nullptr);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    EXPECT_EQ(g_first_add_handler_adds.load(), 1);
    EXPECT_NE(mapped_slots(c), nullptr) << "the handler's first add() must map the slots";
    EXPECT_EQ(c.load(), 1);
    c.add(2);
    EXPECT_EQ(c.load(), 3);
  }
  g_first_adds_raced.store(0);
  long rounds = 0, handled = 0, wrong = 0;
  {
    alignas(counter) unsigned char storage[sizeof(counter)];
    stress::thread_signal_timer timer(kFirstAddSignal, 20000);
    ASSERT_TRUE(timer.armed());
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + stress::scaled(std::chrono::milliseconds(400));
    // Longer only if no signal came at all (valgrind delivers them seldom,
    // and under an emulated CPU most land as the ctor's or dtor's system
    // calls return, outside the window): five seconds whatever the stress
    // scale, which shortens the run, not the wait for the one signal the
    // check needs.
    const auto limit = start + std::max(stress::scaled(std::chrono::milliseconds(5000)),
                                        std::chrono::milliseconds(5000));
    // Until `until` and 200,000 objects, or while no signal has landed in
    // an update yet, until `limit`: under emulation the window between the
    // stores is a few instructions, which a timer's signal rarely hits.
    for (auto now = start; handled == 0 ? now < limit : (now < until && rounds < 200000);
         now = std::chrono::steady_clock::now()) {
      counter* c = new (storage) counter;
      g_first_add_handler_adds.store(0, std::memory_order_relaxed);
      g_first_add_counter.store(c, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      g_first_add_running.store(true, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      c->add(1000);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      g_first_add_running.store(false, std::memory_order_relaxed);
      g_first_add_counter.store(nullptr, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      const long by_handlers = g_first_add_handler_adds.load(std::memory_order_relaxed);
      handled += by_handlers;
      if (c->load() != 1000 + by_handlers) {
        if (wrong++ < 5) {
          ADD_FAILURE() << "round " << rounds << ": load() " << c->load() << ", expected "
                        << 1000 + by_handlers;
        }
      }
      c->~counter();
      ++rounds;
    }
  }
  // The handler stays installed: a signal may still arrive after the timer
  // is gone, and it finds no counter then.
  std::printf("%ld fresh counters, %ld handler adds, %ld of them first adds interrupting one\n",
              rounds, handled, g_first_adds_raced.load());
  EXPECT_EQ(wrong, 0) << "adds lost or doubled around a first add()";
  EXPECT_GT(handled, 0) << "no timer signal arrived";
}

// ---- stress ------------------------------------------------------------------

constexpr int kSignal = SIGUSR2;
// The counter the handler adds to (a counter or a cid_counter) and how.
void* g_signal_counter = nullptr;
void (*g_signal_add)(void*) = nullptr;
std::atomic<long> g_handler_adds{0};

template <class C>
void add_three(void* c) {
  static_cast<C*>(c)->add(3);
}

void on_signal(int) {
  if (void* c = g_signal_counter) {
    g_signal_add(c);
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
template <class C>
long hammer(C& c, const run_options& options) {
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  EXPECT_TRUE(stress::restrict_to(cpus));
  if (options.signals) {
    g_handler_adds.store(0);
    g_signal_add = add_three<C>;
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

template <class C>
void expect_slots_sum_to_load(const C& c) {
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

// ---- C18: load(), slot() and slots() from a signal handler ----------------

constexpr int kReadSignal = SIGPROF;
std::atomic<const counter*> g_read_counter{nullptr};
// Phase 1 (adders running, every delta +1): the handler's readings must lie
// within [g_read_low, what has been added by then]; g_read_added_bound is
// an upper bound the adders raise before each add. Phase 2 (adders joined):
// g_read_exact >= 0 and every reading must equal it.
std::atomic<long> g_read_added_bound{0};
std::atomic<long> g_read_exact{-1};
std::atomic<long> g_read_handled{0};
std::atomic<long> g_read_bad{0};
std::atomic<long> g_read_first_bad_value{0};

// Reads `c` every way: load(), the sum of slot(i), slots(). Returns false if
// a reading is below `low` or above `high` (an exact total when given, else
// the adders' announced bound, read after the readings), or the two sums
// disagree when exact.
bool read_within(const counter& c, long low, long exact) {
  if (c.slots() != max_cpus()) return false;
  const std::int64_t loaded = c.load();
  std::int64_t sum = 0;
  for (int i = 0; i < c.slots(); ++i) sum += c.slot(i);
  const long high = exact >= 0 ? exact : g_read_added_bound.load(std::memory_order_seq_cst);
  if (loaded < low || loaded > high || sum < low || sum > high) {
    g_read_first_bad_value.store(loaded < low || loaded > high ? loaded : sum,
                                 std::memory_order_relaxed);
    return false;
  }
  return exact < 0 || loaded == sum;
}

void read_in_handler(int) {
  const int saved_errno = errno;
  if (const counter* c = g_read_counter.load(std::memory_order_relaxed)) {
    const long exact = g_read_exact.load(std::memory_order_relaxed);
    // Every add is +1, so a reading is at least 0 and at most what the
    // adders had announced by the time it returned.
    if (!read_within(*c, exact >= 0 ? exact : 0, exact)) {
      g_read_bad.fetch_add(1, std::memory_order_relaxed);
    }
    g_read_handled.fetch_add(1, std::memory_order_relaxed);
  }
  errno = saved_errno;
}

// C18: a timer handler calls load(), slot() and slots() on the thread that
// is itself inside those calls, while other threads add +1 (readings lie
// between 0 and what was added; the handler's and the interrupted ones), and
// then once the adders are joined (every reading, interrupted or not, is the
// exact total).
TEST(CounterTest, ReadsFromASignalHandlerInterruptingReads) {
  counter c;
  c.add(0);  // map the slots
  g_read_added_bound.store(0);
  g_read_exact.store(-1);
  g_read_handled.store(0);
  g_read_bad.store(0);
  stress::install_handler(kReadSignal, read_in_handler);
  g_read_counter.store(&c);
  long interrupted_bad = 0, reads = 0;
  long total = 0;
  {
    std::atomic<long> added{0};
    {
      stress::worker_group adders(2, [&](int, const stress::stop_flag& stop) {
        long mine = 0;
        while (!stop) {
          for (int i = 0; i < 16; ++i) {
            g_read_added_bound.fetch_add(1, std::memory_order_seq_cst);
            c.increment();
          }
          mine += 16;
        }
        added.fetch_add(mine);
      });
      stress::thread_signal_timer timer(kReadSignal, 20000);
      ASSERT_TRUE(timer.armed());
      const auto start = std::chrono::steady_clock::now();
      const auto until = start + stress::scaled(std::chrono::milliseconds(300));
      const auto limit = start + stress::scaled(std::chrono::milliseconds(5000));
      for (auto now = start;
           now < until || (g_read_handled.load(std::memory_order_relaxed) == 0 && now < limit);
           now = std::chrono::steady_clock::now()) {
        for (int i = 0; i < 64; ++i, ++reads) {
          if (!read_within(c, 0, -1)) {
            ++interrupted_bad;
          }
        }
      }
      adders.stop_and_join();
    }
    total = added.load();
    EXPECT_EQ(c.load(), total);
    const long handled_while_adding = g_read_handled.load();
    std::printf("phase 1: %ld reads, %ld handler reads while adding\n", reads, handled_while_adding);
    EXPECT_GT(handled_while_adding, 0) << "no timer signal arrived";

    // Phase 2: the adders are done; every reading must be exact.
    g_read_exact.store(total);
    stress::thread_signal_timer timer(kReadSignal, 20000);
    ASSERT_TRUE(timer.armed());
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + stress::scaled(std::chrono::milliseconds(200));
    const auto limit = start + stress::scaled(std::chrono::milliseconds(5000));
    for (auto now = start;
         now < until || (g_read_handled.load(std::memory_order_relaxed) == handled_while_adding &&
                         now < limit);
         now = std::chrono::steady_clock::now()) {
      for (int i = 0; i < 64; ++i, ++reads) {
        if (!read_within(c, total, total)) ++interrupted_bad;
      }
    }
    std::printf("phase 2: %ld handler reads in all\n", g_read_handled.load());
    EXPECT_GT(g_read_handled.load(), handled_while_adding) << "no timer signal arrived";
  }
  // The handler stays installed (a late signal finds no counter).
  g_read_counter.store(nullptr);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  EXPECT_EQ(g_read_bad.load(), 0) << "a handler's reading was wrong, e.g. "
                                  << g_read_first_bad_value.load();
  EXPECT_EQ(interrupted_bad, 0) << "an interrupted reading was wrong, e.g. "
                                << g_read_first_bad_value.load();
  EXPECT_EQ(c.load(), total);
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

// ---- cid_counter: slots indexed by concurrency id --------------------------

cid_counter g_cid_global;  // constant-initialised, as a counter

// The layout of a counter's words at one index (counter::slot_words), for
// the tests that read or plant a word where no add can go.
struct counter_words_view {
  std::intptr_t by_rseq;
  std::atomic<std::int64_t> by_atomic;
};

const void* mapped_slots(const cid_counter& c);
template <auto Slots>
struct expose_cid_counter_slots {
  friend const void* mapped_slots(const cid_counter& c) {
    return (c.*Slots).load(std::memory_order_acquire);
  }
};
template struct expose_cid_counter_slots<&cid_counter::slots_>;

// What the sections have committed to a counter's rseq words, all of them.
std::int64_t rseq_words_sum(counter_words_view* words) {
  std::int64_t sum = 0;
  for (int i = 0; i < max_cpus(); ++i) {
    sum += __atomic_load_n(&internal::stride_copy(words, static_cast<unsigned>(i))->by_rseq,
                           __ATOMIC_RELAXED);
  }
  return sum;
}

TEST(CidCounterTest, GlobalStartsAtZeroAndCounts) {
  EXPECT_EQ(g_cid_global.load(), 0);
  EXPECT_EQ(mapped_slots(g_cid_global), nullptr);
  g_cid_global.increment();
  g_cid_global.increment();
  g_cid_global.decrement();
  g_cid_global.add(41);
  g_cid_global.add(-2);
  EXPECT_EQ(g_cid_global.load(), 40);
  EXPECT_NE(mapped_slots(g_cid_global), nullptr);
}

// Every add lands below the concurrency limit, which stays within
// max_cpus(); the slots at or above it read zero and all of them sum to
// load().
TEST(CidCounterTest, SlotsBelowTheLimitSumToLoad) {
  cid_counter c;
  EXPECT_EQ(c.slots(), max_cpus());
  for (int i = 0; i < 1000; ++i) c.add(i % 7 - 3);
  std::int64_t expected = 0;
  for (int i = 0; i < 1000; ++i) expected += i % 7 - 3;
  EXPECT_EQ(c.load(), expected);
  const unsigned limit = internal::concurrency_limit();
  ASSERT_GE(limit, 1u);
  ASSERT_LE(limit, static_cast<unsigned>(max_cpus()));
  std::int64_t sum = 0;
  for (int i = 0; i < c.slots(); ++i) {
    sum += c.slot(i);
    if (static_cast<unsigned>(i) >= limit) {
      EXPECT_EQ(c.slot(i), 0) << "slot " << i;
    }
  }
  EXPECT_EQ(sum, expected);
}

// "slot(i) is what adds made under concurrency id i": an add bracketed by
// two equal answers of concurrency_id() lands in that id's slot, where the
// structures run sections. Without them it lands, by CPU, in a slot below
// the limit.
TEST(CidCounterTest, AddsLandInTheSlotOfTheConcurrencyId) {
  cid_counter c;
  c.add(0);
  if (sections_status() != sections::on) {
    c.add(12);
    std::int64_t below = 0;
    for (unsigned i = 0; i < internal::concurrency_limit(); ++i)
      below += c.slot(static_cast<int>(i));
    EXPECT_EQ(below, 12) << "sections: " << to_string(sections_status());
    return;
  }
  int landed = 0;
  for (int attempt = 0; attempt < 1000 && landed < 20; ++attempt) {
    const int before = concurrency_id();
    const std::int64_t slot_before = c.slot(before);
    c.add(7);
    const int after = concurrency_id();
    if (before != after) continue;
    EXPECT_EQ(c.slot(before), slot_before + 7) << "concurrency id " << before;
    ++landed;
  }
  EXPECT_EQ(landed, 20) << "the concurrency id kept changing around adds";
}

TEST(CidCounterTest, ExtremeDeltas) {
  cid_counter c;
  c.add(INT64_MAX / 2);
  c.add(INT64_MAX / 2);
  c.add(-(INT64_MAX / 2));
  EXPECT_EQ(c.load(), INT64_MAX / 2);
}

// The destructor zeroes only the slots below the limit; a cid_counter made
// on the reused words must still start at zero, and a late use of a
// destroyed one must read zero and count again.
TEST(CidCounterTest, DestroyedCountersReadZeroAndTheirWordsComeBackZero) {
  for (int round = 0; round < 100; ++round) {
    auto c = std::make_unique<cid_counter>();
    EXPECT_EQ(c->load(), 0) << "round " << round;
    for (int i = 0; i < 10; ++i) c->add(round + 1);
    EXPECT_EQ(c->load(), 10 * (round + 1));
  }
  const int status = stress::run_in_child(
      [] {
        alignas(cid_counter) unsigned char storage[sizeof(cid_counter)];
        cid_counter* c = new (storage) cid_counter;
        c->add(7);
        if (c->load() != 7) return 1;
        c->~cid_counter();
        if (c->load() != 0) return 2;
        c->add(5);
        if (c->load() != 5) return 3;
        c->~cid_counter();
        return 0;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(status, 0) << "1: bad count before destruction; 2: a destroyed cid_counter does "
                          "not read zero; 3: a late add was lost; 128+n: killed by signal n";
}

// "the destructor reads [and zeroes] only those": every slot below the
// limit, the highest included. A word is put in the highest slot below the
// limit directly (no thread may have that id now), the counter destroyed,
// and the next cid_counter, which the arena hands the same words, must read
// zero there.
TEST(CidCounterTest, TheDestructorZeroesEverySlotBelowTheLimit) {
  auto first = std::make_unique<cid_counter>();
  first->add(1);
  const unsigned limit = internal::concurrency_limit();
  ASSERT_GE(limit, 1u);
  auto* words = static_cast<counter_words_view*>(const_cast<void*>(mapped_slots(*first)));
  ASSERT_NE(words, nullptr);
  internal::stride_copy(words, limit - 1)->by_atomic.fetch_add(1000);
  EXPECT_EQ(first->load(), 1001);
  first.reset();
  auto second = std::make_unique<cid_counter>();
  second->add(0);
  EXPECT_EQ(mapped_slots(*second), words) << "the arena did not hand the same words back";
  EXPECT_EQ(second->load(), 0) << "a slot below the limit was not zeroed";
  EXPECT_EQ(second->slot(static_cast<int>(limit - 1)), 0);
}

// The section's test of the area's cpu_id: a thread whose area is not
// registered (here unregistered on purpose; the kernel then shows cpu_id -1
// and mm_cid 0, as glibc's area does for a thread whose registration
// failed) must not commit at id 0's rseq word, where a registered thread
// may be adding at the same time; its adds go to the atomic words.
TEST(CidCounterTest, AThreadWithoutARegistrationAddsWithAtomics) {
  cid_counter c;
  c.add(0);
  auto* words = static_cast<counter_words_view*>(const_cast<void*>(mapped_slots(c)));
  ASSERT_NE(words, nullptr);
  std::int64_t by_rseq = -1;
  std::thread paused([&] {
    c.add(0);  // registers the thread where that is percpu's job
    ASSERT_TRUE(internal::pause_rseq_for_this_thread()) << "the thread's sections still commit";
    for (int i = 0; i < 100; ++i) c.add(1);
    by_rseq = rseq_words_sum(words);
    internal::resume_rseq_for_this_thread();
  });
  paused.join();
  EXPECT_EQ(by_rseq, 0) << "a thread without a registration committed a section";
  EXPECT_EQ(c.load(), 100);
}

// The section's limit test (internal/rseq_cs.hpp, the concurrency-id
// form): an id not below the limit leaves with 1 and writes nothing; one
// below commits. Run on the section itself, with the limit set to the id
// the thread shows, so it needs no thread to reach a new high by chance.
TEST(CidCounterTest, TheSectionLeavesForAnIdNotBelowTheLimit) {
  cid_counter c;
  c.add(0);
  auto* words = static_cast<counter_words_view*>(const_cast<void*>(mapped_slots(c)));
  ASSERT_NE(words, nullptr);
  const std::int64_t before = rseq_words_sum(words);
  int checked = 0;
  for (int attempt = 0; attempt < 1000 && checked < 20; ++attempt) {
    const internal::cid_start start = internal::start_cid_section();
    const int id = internal::started_concurrency_id(start);
    if (id < 0 || id >= max_cpus()) break;  // no registration here: nothing to check
    const int beyond = internal::rseq_addv_cid_started(start, &words->by_rseq,
                                                       static_cast<std::uint32_t>(id), 5);
    if (internal::started_concurrency_id(start) != id || beyond == -1) continue;
    EXPECT_EQ(beyond, 1) << "an add at id " << id << " with the limit at " << id;
    EXPECT_EQ(rseq_words_sum(words), before) << "the section wrote at or above the limit";
    ++checked;
  }
  if (sections_status() == sections::on) {
    EXPECT_EQ(checked, 20);
  }
}

#ifdef NDEBUG
TEST(CidCounterTest, OutOfRangeSlotReadsZeroInReleaseBuilds) {
  cid_counter c;
  c.add(3);
  EXPECT_EQ(c.slot(-1), 0);
  EXPECT_EQ(c.slot(c.slots()), 0);
  EXPECT_EQ(c.load(), 3);
}
#else
TEST(CidCounterDeathTest, OutOfRangeSlotAbortsInDebugBuilds) {
  cid_counter c;
  c.add(3);
  EXPECT_DEATH((void)c.slot(-1), "percpu::cid_counter::slot\\(-1\\): index out of range \\[0, ");
  EXPECT_DEATH((void)c.slot(c.slots()), "index out of range");
  EXPECT_EQ(c.load(), 3);
}
#endif

TEST(CidCounterStressTest, Oversubscribed) {
  cid_counter c;
  const long expected = hammer(c, {});
  EXPECT_EQ(c.load(), expected);
  expect_slots_sum_to_load(c);
}

TEST(CidCounterStressTest, SignalsAndAffinityFlippingTogether) {
  cid_counter c;
  run_options options;
  options.signals = true;
  options.flip_affinity = true;
  const long expected = hammer(c, options);
  EXPECT_EQ(c.load(), expected);
  expect_slots_sum_to_load(c);
}

// Threads come and go, so concurrency ids are handed out again and again.
TEST(CidCounterStressTest, ThreadChurn) {
  cid_counter c;
  const long threads = stress::scaled(600L);
  stress::churn(threads, kWorkers, [&](long n) {
    for (int i = 0; i < 500; ++i) c.add(n % 2 == 0 ? 1 : 3);
  });
  long expected = 0;
  for (long n = 0; n < threads; ++n) expected += 500 * (n % 2 == 0 ? 1 : 3);
  EXPECT_EQ(c.load(), expected);
}

// Threads whose rseq(2) fails (percpu's own registration refused) add by
// CPU with atomics, beside threads adding by concurrency id in sections.
TEST(CidCounterStressTest, RseqAndFallbackThreadsOnTheSameSlots) {
  (void)cpu_id();
  if (rseq_ownership() != rseq_owner::percpu) {
    GTEST_SKIP() << "needs percpu's own registration (the .own variant); rseq owner here: "
                 << to_string(rseq_ownership());
  }
  cid_counter c;
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(cpus));
  std::atomic<long> added{0};
  std::atomic<int> on_fallback{0}, filter_failures{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      if (w % 2 == 1 && !deny_rseq_for_this_thread()) filter_failures++;
      c.add(1);
      if (backend() != cpu_backend::rseq) on_fallback++;
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
  EXPECT_EQ(filter_failures.load(), 0);
  EXPECT_EQ(on_fallback.load(), kWorkers / 2);
  EXPECT_EQ(c.load(), added.load());
  expect_slots_sum_to_load(c);
}

// The parent's workers keep adding while the main thread forks; the child's
// threads take concurrency ids of their own process.
TEST(CidCounterStressTest, ForkDuringHeavyUse) {
  cid_counter c;
  std::atomic<long> added{0};
  int children = 0;
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
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(300));
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
            return c.load() == base + std::int64_t{kWorkers} * 20000 * 2 ? 0 : 1;
          },
          std::chrono::seconds(60));
      ++children;
      EXPECT_EQ(status, 0) << "child " << children;
    }
    workers.stop_and_join();
  }
  EXPECT_GT(children, 0);
  EXPECT_EQ(c.load(), added.load());
}

// ---- cid_counter with 4,096 possible CPUs ---------------------------------
//
// The case the type is for: a host whose possible list is far longer than
// what the process uses. CidCounterTest.WithFourThousandPossibleCpus runs
// this binary again, in a mount namespace of its own where
// /sys/devices/system/cpu/possible says 0-4095 (root only), with the filter
// below (tests/support/wide_possible_list.hpp).

constexpr char kWideFilter[] = "--gtest_filter=CidCounterWideTest.*";

TEST(CidCounterWideTest, ReadersWalkOnlyTheIdsUsed) {
  const char* real = test::real_max_cpus_in_wide_run();
  if (real == nullptr) GTEST_SKIP() << "runs inside CidCounterTest.WithFourThousandPossibleCpus";
  ASSERT_EQ(max_cpus(), 4096) << "the bind-mounted possible list was not read";
  cid_counter by_id;
  counter by_cpu;
  // This process's first concurrency ids: two threads, each on a CPU of its
  // own and adding at the same time, hold two ids, one of them a new high
  // the limit must be raised to before the add there (the first add, which
  // takes the slots, raises it only to its own thread's id).
  const std::vector<int> cpus = stress::test_cpus(2);
  test::run_on_two_cpus_at_once(cpus, [&] {
    for (int i = 0; i < 100000; ++i) {
      by_id.add(1);
      by_cpu.add(1);
    }
  });
  EXPECT_EQ(by_id.load(), 200000);
  EXPECT_EQ(by_cpu.load(), 200000);
  // Concurrency ids and CPUs are both below the kernel's real bound, so the
  // limit is too, far below the 4,096 a counter's load() walks.
  const unsigned limit = internal::concurrency_limit();
  std::printf(
      "possible 0-4095, real max_cpus %s: concurrency limit %u, sections %s, "
      "feature size %u\n",
      real, limit, to_string(sections_status()), rseq_feature_size());
  EXPECT_GE(limit, 1u);
  EXPECT_LE(limit, static_cast<unsigned>(std::atoi(real)));
  // What load() reads: a word written at the limit, where no add can have
  // gone, is not in a cid_counter's sum; at the last possible CPU it is in
  // a counter's (the check that such a write is seen at all).
  auto* id_words = static_cast<counter_words_view*>(const_cast<void*>(mapped_slots(by_id)));
  auto* cpu_words = static_cast<counter_words_view*>(const_cast<void*>(mapped_slots(by_cpu)));
  ASSERT_NE(id_words, nullptr);
  ASSERT_NE(cpu_words, nullptr);
  internal::stride_copy(id_words, limit)->by_atomic.store(1000);
  internal::stride_copy(cpu_words, 4095u)->by_atomic.store(1000);
  EXPECT_EQ(by_id.load(), 200000) << "load() read a slot at or above the concurrency limit";
  EXPECT_EQ(by_cpu.load(), 201000);
  internal::stride_copy(id_words, limit)->by_atomic.store(0);
  internal::stride_copy(cpu_words, 4095u)->by_atomic.store(0);
}

TEST(CidCounterTest, WithFourThousandPossibleCpus) {
  test::run_with_4096_possible_cpus(kWideFilter, max_cpus());
}

}  // namespace
}  // namespace percpu
