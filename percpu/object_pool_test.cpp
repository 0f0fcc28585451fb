// Tests for percpu::object_pool: argument errors, alignment and ownership,
// bounded caches and batches, trim, the debug misuse checks, and nothing
// lost or handed out twice with 12 threads on 2 CPUs under oversubscription,
// affinity flipping, timer signals whose handlers allocate and free, threads
// forced onto the locked path, concurrent trim, fork during heavy use and
// thread churn. The mode variants (.glibc, .own, .fallback) run all of it on
// each path.

#include "percpu/object_pool.hpp"

#include <gtest/gtest.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "percpu/free_list.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "percpu/internal/fallback.hpp"
#include "tests/stress/stress.hpp"
#include "tests/support/address_limit.hpp"
#include "tests/support/pages.hpp"

namespace percpu {
namespace {

namespace stress = percpu::stress;

constexpr int kWorkers = 12;

object_pool::options checked(std::size_t size) {
  object_pool::options o;
  o.object_size = size;
  o.checks = true;
  return o;
}

// Every object in a cache or a spare.
std::size_t cached_total(const object_pool& pool) {
  std::size_t sum = pool.cached_by_threads();
  for (int cpu = 0; cpu < pool.slot_count(); ++cpu) {
    sum += pool.cached_on(cpu) + pool.spare_on(cpu);
  }
  return sum;
}

// The fullest CPU cache, or half of the fullest CPU's spares (each holds
// at most a cache's capacity).
std::size_t cached_max(const object_pool& pool) {
  std::size_t most = 0;
  for (int cpu = 0; cpu < pool.slot_count(); ++cpu) {
    most = std::max({most, pool.cached_on(cpu), (pool.spare_on(cpu) + 1) / 2});
  }
  return most;
}

// Whether this thread's frees and allocations reach its CPU's spare: it
// runs sections (object_pool.hpp, "What it is for").
bool uses_spares() { return internal::section_area() != nullptr; }

// Whether this process runs rseq sections while membarrier's RSEQ fence is
// missing (Linux 4.18 to 5.9, a kernel without membarrier, a sandbox that
// refuses it: the .no_membarrier variants). object_pool.hpp: trim() then
// leaves the CPU caches alone ("caches that cannot be fenced keep theirs").
// Asked afresh each time: the simulate_missing_membarrier() seam changes it.
bool fence_missing() {
  return backend() == cpu_backend::rseq && sections_status() == sections::on &&
         !internal::slot_fence_available();
}

// trim(), and then, where the fence is missing, the CPU caches trim() must
// leave alone, each emptied through its own CPU: this thread, pinned to that
// CPU, allocates what the cache holds (owner sections, no fence), and frees
// it on the locked path (the seam), whose lock is refused without the
// fence, so each object goes to the depot. No other thread may use the pool
// meanwhile. Returns what trim() moved.
std::size_t send_home(object_pool& pool) {
  const std::size_t moved = pool.trim();
  if (!fence_missing()) return moved;
  const std::vector<int> saved = stress::allowed_cpus();
  std::vector<void*> held;
  for (int cpu : saved) {
    if (!stress::restrict_to({cpu})) continue;
    for (std::size_t n = pool.cached_on(cpu) + pool.spare_on(cpu); n > 0; --n) {
      void* p = pool.allocate();
      if (p == nullptr) break;
      held.push_back(p);
    }
  }
  stress::restrict_to(saved);
  internal::force_locked_path_for_this_thread(true);
  for (void* p : held) pool.deallocate(p);
  internal::force_locked_path_for_this_thread(false);
  return moved;
}

// With nothing allocated: after trim every carved object is in the depot;
// without the fence, after trim and each CPU's own flush (send_home).
void expect_all_home(object_pool& pool) {
  if (fence_missing()) {
    std::printf("expect_all_home: no membarrier RSEQ fence: trim(), then each CPU's cache "
                "emptied on that CPU\n");
  }
  send_home(pool);
  EXPECT_EQ(cached_total(pool), 0u);
  EXPECT_EQ(pool.depot_objects(), pool.carved_objects()) << "objects lost";
}

// The setting of the tests that count what reaches the depot: this thread
// kept on one test CPU, whose cpu_hint() it has used enough that a thread
// without rseq locks that CPU's cache (the ladder's step 3), and a pool of
// small caches (16 objects, batches of 8) whose depot moves are easy to
// count. restore() gives the thread its CPUs back, as the destructor does
// for a test that stops early.
class on_one_cpu {
 public:
  on_one_cpu() : saved_(stress::allowed_cpus()), cpu_(stress::test_cpus(1)[0]) {
    pinned_ = stress::restrict_to({cpu_});
    for (unsigned i = 0; i < internal::kCpuHintUses; ++i) (void)internal::cpu_hint();
  }
  ~on_one_cpu() { restore(); }
  on_one_cpu(const on_one_cpu&) = delete;
  on_one_cpu& operator=(const on_one_cpu&) = delete;
  void restore() const { stress::restrict_to(saved_); }
  bool pinned() const { return pinned_; }
  int cpu() const { return cpu_; }
  static object_pool::options small_caches() {
    object_pool::options o = checked(48);
    o.cache_capacity = 16;
    o.batch = 8;
    return o;
  }

 private:
  std::vector<int> saved_;
  int cpu_;
  bool pinned_ = false;
};

// Allocates into *held until every cache and spare of `pool` is empty and
// at least `at_least` objects are held, so that what the test frees next
// starts from empty caches.
void hold_until_caches_empty(object_pool& pool, std::size_t at_least, std::vector<void*>* held) {
  while (held->size() < at_least || cached_total(pool) != 0) {
    void* p = pool.allocate();
    ASSERT_NE(p, nullptr);
    held->push_back(p);
  }
}

// Where a pool's thread caches are (thread index 0's copy; nullptr where
// thread slots are not usable) and its CPUs' caches' heads (CPU 0's copy),
// read without a seam in the library (see free_list_test.cpp).
const internal::cpu_lists& lists_of(const object_pool& p);
template <auto Lists>
struct expose_object_pool_lists {
  friend const internal::cpu_lists& lists_of(const object_pool& p) { return p.*Lists; }
};
template struct expose_object_pool_lists<&object_pool::lists_>;
const void* thread_words(const object_pool& p) { return lists_of(p).thread_words(); }
// Whether this thread, without rseq, has a cache of its own in `p`
// (object_pool.hpp, "Without rseq"), with two spares, where a CPU's cache
// it locks has none.
bool uses_own_cache(const object_pool& p) {
  return !uses_spares() && lists_of(p).own_thread_slot() != nullptr;
}
const void* cpu_words(const object_pool& p) { return lists_of(p).cpu_words(); }

// Memory per instance (object_pool.hpp, "Memory"): 1,000 pools, each used
// once by this thread, kept on one CPU, take that CPU's slot (32 bytes:
// the cache's and the spare's heads and the lock; only with rseq) of
// per-CPU memory, where each took 64 bytes for
// every possible CPU before, and at most this thread's slot (32 bytes, and
// only without rseq) of thread-slot memory each, not the 8 KiB of slots
// for every thread index each took before. Counted with mincore over every
// copy, before anything reads them.
TEST(ObjectPoolTest, AThousandPoolsTakeBytesOfCpuAndThreadSlotsEach) {
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  constexpr long kPools = 1000;
  std::vector<std::unique_ptr<object_pool>> pools;
  for (long i = 0; i < kPools; ++i) {
    pools.push_back(std::make_unique<object_pool>(64));
    void* p = pools.back()->allocate();
    ASSERT_NE(p, nullptr);
    pools.back()->deallocate(p);
  }
  std::vector<const void*> cpus, threads;
  for (const auto& pool : pools) {
    cpus.push_back(cpu_words(*pool));
    threads.push_back(thread_words(*pool));
  }
  const long cpu_present = test::present_stride_pages(test::pages_holding(cpus), max_cpus());
  const long thread_present =
      test::present_stride_pages(test::pages_holding(threads), internal::kThreadSlots);
  ASSERT_GE(cpu_present, 0);
  ASSERT_GE(thread_present, 0);
  const long page = sysconf(_SC_PAGESIZE);
  const double per_pool_cpus = static_cast<double>(cpu_present * page) / kPools;
  const double per_pool_threads = static_cast<double>(thread_present * page) / kPools;
  std::printf(
      "%ld pools, each used once by one thread on one CPU: %.1f bytes of CPU heads and %.1f of "
      "thread slots each (%d possible CPUs), plus %zu bytes of the pool\n",
      kPools, per_pool_cpus, per_pool_threads, max_cpus(), sizeof(object_pool));
  // One slot each; the first and last pages of the run, which other
  // structures' slots share, and each chunk's header page (CPU 0's): 3
  // pages over 1,000 pools.
  const double slack = 3.0 * static_cast<double>(page) / kPools;
  EXPECT_EQ(lists_of(*pools.front()).slot_bytes(), 32u);
  EXPECT_LE(per_pool_cpus, 32.0 + slack) << "more than one CPU's slot per pool";
  EXPECT_LE(per_pool_threads, 32.0 + slack) << "more than one thread's slot per pool";
}

// "std::bad_alloc when no memory can be mapped for its per-CPU heads":
// pools are made, in a child whose address space is limited to what it has
// mapped, until one throws; it throws std::bad_alloc, and the pool made
// before it still hands out objects (or nullptr, "when memory is
// exhausted", which its first chunk may well be).
TEST(ObjectPoolTest, TheConstructorThrowsBadAllocWhenNoMemoryCanBeMapped) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  const int status = test::run_until_bad_alloc<object_pool>(
      262144, [](void* where) { return new (where) object_pool(64); },
      [](object_pool* last) {
        if (last == nullptr) return 0;  // the first one found no memory
        void* p = last->allocate();
        if (p != nullptr && !last->owns(p)) return 5;
        last->deallocate(p);
        return 0;
      });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  if (WEXITSTATUS(status) == test::kLimitNotEnforced) {
    GTEST_SKIP() << "RLIMIT_AS is not enforced here (qemu-user ignores it)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0) << "98: setrlimit failed, 3: no constructor threw, 4: one "
                                       "threw something else, 5: an object it does not own";
}

// "allocate() returns nullptr when memory is exhausted": a pool made
// before, in a child whose address space is limited to what it has mapped
// plus 2 MiB, allocates 4 KiB objects until one is nullptr; every object
// before it is its own, and once they are all freed as many allocations
// succeed again from them, with no new memory.
TEST(ObjectPoolTest, AllocateReturnsNullptrWhenMemoryIsExhausted) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  object_pool pool(4096);
  constexpr std::size_t kMost = 4096;  // 16 MiB of objects: far past the limit
  std::unique_ptr<void*[]> held(new void*[kMost]);
  const int status = test::run_under_address_limit(std::size_t{2} << 20, [&] {
    std::size_t got = 0;
    while (got < kMost && (held[got] = pool.allocate()) != nullptr) ++got;
    if (got == kMost) return 3;
    if (got == 0) return 7;  // the room holds a chunk or more
    std::set<void*> distinct(held.get(), held.get() + got);
    if (distinct.size() != got) return 4;
    for (std::size_t i = 0; i < got; ++i) {
      if (!pool.owns(held[i])) return 5;
    }
    for (std::size_t i = 0; i < got; ++i) pool.deallocate(held[i]);
    for (std::size_t i = 0; i < got; ++i) {
      if ((held[i] = pool.allocate()) == nullptr) return 6;
    }
    for (std::size_t i = 0; i < got; ++i) pool.deallocate(held[i]);
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  if (WEXITSTATUS(status) == test::kLimitNotEnforced) {
    GTEST_SKIP() << "RLIMIT_AS is not enforced here (qemu-user ignores it)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "98: setrlimit failed, 3: never nullptr, 4: an object handed out twice, 5: an object "
         "not its own, 6: nullptr again after every object was freed, 7: no object at all";
}

TEST(ObjectPoolTest, BadArgumentsThrowWithAClearMessage) {
  EXPECT_THROW(object_pool(0), std::invalid_argument);
  EXPECT_THROW(object_pool(std::size_t{1} << 30), std::invalid_argument);
  EXPECT_THROW(object_pool(64, 3), std::invalid_argument);
  EXPECT_THROW(object_pool(64, 0), std::invalid_argument);
  EXPECT_THROW(object_pool(64, std::size_t{1} << 20), std::invalid_argument);
  try {
    object_pool pool(64, 24);
    ADD_FAILURE() << "alignment 24 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::strstr(e.what(), "alignment 24"), nullptr) << e.what();
  }
}

// options::cache_capacity = 0 and batch = 0 pick defaults (the header says
// so, and the constructor agrees); a capacity the depth arithmetic cannot
// hold is refused with a clear message; a batch above the capacity is
// lowered to it.
TEST(ObjectPoolTest, CacheCapacityZeroPicksADefaultAndTooLargeThrows) {
  object_pool::options o;
  o.object_size = 64;
  o.cache_capacity = 0;
  o.batch = 0;
  object_pool by_default(o);
  EXPECT_GT(by_default.cache_capacity(), 0u);
  EXPECT_GT(by_default.batch(), 0u);
  EXPECT_LE(by_default.batch(), by_default.cache_capacity());
  void* p = by_default.allocate();
  ASSERT_NE(p, nullptr);
  by_default.deallocate(p);

  o.cache_capacity = 8;
  o.batch = 100;
  object_pool lowered(o);
  EXPECT_EQ(lowered.cache_capacity(), 8u);
  EXPECT_EQ(lowered.batch(), 8u);

  o.batch = 0;
  o.cache_capacity = object_pool::max_cache_capacity;
  EXPECT_NO_THROW(object_pool{o});
  for (std::size_t bad : {object_pool::max_cache_capacity + 1, std::size_t{SIZE_MAX}}) {
    o.cache_capacity = bad;
    try {
      object_pool pool(o);
      ADD_FAILURE() << "cache capacity " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::strstr(e.what(), "cache capacity"), nullptr) << e.what();
    }
  }
}

TEST(ObjectPoolTest, ObjectsAreDistinctAlignedAndOwned) {
  for (std::size_t size : {1, 8, 24, 100, 4096}) {
    for (std::size_t align : {8, 64, 256}) {
      object_pool pool(size, align);
      std::set<std::uintptr_t> seen;
      std::vector<void*> objects;
      for (int i = 0; i < 500; ++i) {
        void* p = pool.allocate();
        ASSERT_NE(p, nullptr);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0u) << size << "/" << align;
        EXPECT_TRUE(pool.owns(p));
        std::memset(p, 0xab, size);
        EXPECT_TRUE(seen.insert(reinterpret_cast<std::uintptr_t>(p)).second);
        objects.push_back(p);
      }
      int local = 0;
      EXPECT_FALSE(pool.owns(&local));
      EXPECT_FALSE(pool.owns(static_cast<char*>(objects[0]) + 1));
      for (void* p : objects) pool.deallocate(p);
      pool.deallocate(nullptr);
      expect_all_home(pool);
    }
  }
}

TEST(ObjectPoolTest, CachesAreBoundedAndReuseIsLocal) {
  const std::vector<int> saved = stress::allowed_cpus();
  const int cpu = stress::test_cpus(1)[0];
  ASSERT_TRUE(stress::restrict_to({cpu}));
  object_pool::options o = checked(48);
  o.cache_capacity = 16;
  o.batch = 8;
  object_pool pool(o);
  EXPECT_EQ(pool.cache_capacity(), 16u);
  EXPECT_EQ(pool.batch(), 8u);
  std::vector<void*> objects;
  for (int i = 0; i < 1000; ++i) objects.push_back(pool.allocate());
  for (void* p : objects) {
    pool.deallocate(p);
    // One thread: at most its own cache (without rseq) or its CPU's caches,
    // each bounded; a thread whose fallback is the getcpu system call asks
    // for its CPU only every so many operations, so two CPU caches may hold
    // objects for a moment.
    ASSERT_LE(cached_max(pool), 16u) << "a cache grew past its capacity";
    ASSERT_LE(pool.cached_by_threads(), 48u) << "a thread's cache grew past three capacities";
  }
  if (backend() == cpu_backend::rseq) {
    EXPECT_GT(pool.cached_on(cpu), 0u);
  } else {
    EXPECT_GT(cached_total(pool), 0u);
  }
  EXPECT_EQ(pool.depot_objects() + cached_total(pool), pool.carved_objects());
  // The most recently freed object comes back first (LIFO cache), on rseq
  // and on the locked path alike: one CPU, one cache.
  void* last = objects.back();
  void* again = pool.allocate();
  EXPECT_EQ(again, last) << "backend " << to_string(backend());
  pool.deallocate(again);
  // Nothing is allocated, so trim() moves every object that is not in the
  // depot yet, and says how many.
  const std::size_t outside_depot = pool.carved_objects() - pool.depot_objects();
  EXPECT_GT(outside_depot, 0u);
  if (fence_missing()) {
    std::printf("CachesAreBoundedAndReuseIsLocal: checked the case without the membarrier "
                "RSEQ fence (trim() keeps the CPU caches)\n");
    EXPECT_EQ(pool.trim(), 0u) << "without the fence, trim() must leave the CPU caches alone";
    EXPECT_EQ(pool.cached_on(cpu) + pool.spare_on(cpu), outside_depot);
    stress::restrict_to(saved);
    expect_all_home(pool);
    return;
  }
  std::printf("CachesAreBoundedAndReuseIsLocal: checked the case with remote access\n");
  EXPECT_EQ(pool.trim(), outside_depot);
  EXPECT_EQ(pool.trim(), 0u) << "a second trim finds nothing to move";
  EXPECT_EQ(cached_total(pool), 0u);
  EXPECT_EQ(pool.depot_objects(), pool.carved_objects());
  stress::restrict_to(saved);
}

// A free onto a full cache keeps the freed object on the cache, where the
// next allocation finds it, and makes room: with rseq, by setting the whole
// cache aside as its CPU's newer spare (the newer becoming the older), and
// once both spares are in use by giving the depot the older one whole;
// and the same on a thread's own cache without rseq, which has two spares
// too; on a CPU's cache locked by a thread without rseq (no spares), by
// giving the depot exactly one batch, the cache's top one. In every mode,
// whether the cache is the CPU's (locked from a section with rseq, or under
// its lock without) or the thread's own.
TEST(ObjectPoolTest, AFreeOntoAFullCacheSetsItAsideOrGivesTheDepotABatch) {
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  // A thread whose fallback is the getcpu system call keeps its CPU answer
  // for a few calls: make every later answer the pinned CPU.
  for (unsigned i = 0; i < internal::kCpuHintUses; ++i) (void)internal::cpu_hint();
  object_pool::options o = checked(40);
  o.cache_capacity = 16;
  o.batch = 6;
  object_pool pool(o);
  std::vector<void*> objects;
  for (int i = 0; i < 64; ++i) objects.push_back(pool.allocate());
  void* last = objects.back();
  objects.pop_back();
  std::size_t frees = 0;
  while (cached_total(pool) < 16 && frees < objects.size()) pool.deallocate(objects[frees++]);
  ASSERT_EQ(cached_total(pool), 16u) << "the cache never filled: backend " << to_string(backend());
  std::size_t full = 16;
  std::size_t room = 6;  // what the free onto a full cache and full spares gives the depot
  if (uses_spares()) {
    const int cpu = stress::test_cpus(1)[0];
    ASSERT_EQ(pool.spare_on(cpu), 0u);
    const std::size_t depot = pool.depot_objects();
    void* next = objects[frees++];
    pool.deallocate(next);
    EXPECT_EQ(pool.depot_objects(), depot) << "a full cache with no spare in use reached the depot";
    EXPECT_EQ(pool.spare_on(cpu), 16u) << "the full cache was not set aside whole";
    EXPECT_EQ(pool.cached_on(cpu), 1u);
    void* again = pool.allocate();
    EXPECT_EQ(again, next) << "the freed object did not stay on the cache";
    pool.deallocate(again);
    while (cached_total(pool) < 48 && frees < objects.size()) pool.deallocate(objects[frees++]);
    ASSERT_EQ(pool.cached_on(cpu), 16u);
    ASSERT_EQ(pool.spare_on(cpu), 32u) << "the second full cache was not set aside whole";
    EXPECT_EQ(pool.depot_objects(), depot) << "a cache set aside beside a spare reached the depot";
    full = 48;
    room = 16;
  } else if (uses_own_cache(pool)) {
    // A thread's own cache sets itself aside as a CPU's does, beside the
    // head in its slot's spare word, and holds three capacities, its two
    // spares full, before the older spare goes to the depot whole.
    const std::size_t depot = pool.depot_objects();
    void* next = objects[frees++];
    pool.deallocate(next);
    EXPECT_EQ(pool.depot_objects(), depot) << "a full own cache with no spare reached the depot";
    EXPECT_EQ(pool.cached_by_threads(), 17u);
    EXPECT_NE(lists_of(pool).thread_spare_of(internal::thread_index()), 0)
        << "the full own cache was not set aside";
    void* again = pool.allocate();
    EXPECT_EQ(again, next) << "the freed object did not stay on the own cache";
    pool.deallocate(again);
    while (cached_total(pool) < 48 && frees < objects.size()) pool.deallocate(objects[frees++]);
    ASSERT_EQ(pool.cached_by_threads(), 48u) << "the thread's own cache did not fill";
    EXPECT_EQ(pool.depot_objects(), depot) << "the thread's own cache shed before three capacities";
    full = 48;
    room = 16;
  }
  const std::size_t depot = pool.depot_objects();
  pool.deallocate(last);
  EXPECT_EQ(pool.depot_objects(), depot + room)
      << "not the older spare whole (rseq) or one batch: backend " << to_string(backend());
  EXPECT_EQ(cached_total(pool), full - room + 1u);
  void* again = pool.allocate();
  EXPECT_EQ(again, last) << "the freed object did not stay on the cache";
  pool.deallocate(again);
  while (frees < objects.size()) pool.deallocate(objects[frees++]);
  stress::restrict_to(saved);
  expect_all_home(pool);
}

// With rseq, a CPU's cache and its two spares hold three times the capacity
// between them, and so does a thread's own cache without rseq, so bursts of
// that many allocations, then as many frees, move nothing through the depot
// and carve nothing, round after round, and the objects come back
// last-freed first; a CPU's cache locked by a thread without rseq (no
// spares) gives the depot what it cannot hold.
// lock_refused: whether a CPU's lock is refused here (fence_missing(), asked
// before the seam below makes this thread's backend the fallback's).
void bursts_of_three_capacities(bool lock_refused) {
  const on_one_cpu one;
  ASSERT_TRUE(one.pinned());
  const int cpu = one.cpu();
  object_pool pool(on_one_cpu::small_caches());
  constexpr std::size_t kBurst = 48;
  std::vector<void*> held;
  ASSERT_NO_FATAL_FAILURE(hold_until_caches_empty(pool, kBurst, &held));
  std::vector<void*> burst(held.end() - kBurst, held.end());
  held.resize(held.size() - kBurst);
  const bool spares = uses_spares();
  const bool own = uses_own_cache(pool);
  const char* where = spares ? "a CPU's cache and spares (rseq)"
                      : own  ? "a thread's own cache (no rseq)"
                             : "a CPU's cache under its lock (no rseq)";
  SCOPED_TRACE(std::string("backend ") + to_string(backend()) + ", " + where);
  const std::size_t depot = pool.depot_objects();
  for (void* p : burst) pool.deallocate(p);
  std::printf("BurstsOfThreeTimesTheCapacityStayWhereTheyWereFreed: checked %s\n", where);
  if (!spares && !own) {
    // The CPU's cache keeps one capacity, or nothing where its lock is
    // refused (no membarrier fence while sections run).
    const std::size_t kept = lock_refused ? 0 : 16;
    EXPECT_EQ(pool.depot_objects(), depot + kBurst - kept)
        << "one cache kept more than its capacity";
  } else {
    EXPECT_EQ(pool.depot_objects(), depot);
    if (spares) {
      EXPECT_EQ(pool.cached_on(cpu), 16u);
      EXPECT_EQ(pool.spare_on(cpu), 32u);
    } else {
      EXPECT_EQ(pool.cached_by_threads(), kBurst);
    }
    const std::size_t carved = pool.carved_objects();
    for (int round = 0; round < 10; ++round) {
      // LIFO, through the spares too: the last freed comes back first.
      for (std::size_t i = kBurst; i-- > 0;) {
        void* p = pool.allocate();
        ASSERT_EQ(p, burst[i]) << "round " << round << ", object " << i << " out of order";
      }
      ASSERT_EQ(cached_total(pool), 0u) << "round " << round;
      for (void* p : burst) pool.deallocate(p);
      ASSERT_EQ(pool.depot_objects(), depot) << "round " << round << " reached the depot";
      ASSERT_EQ(pool.carved_objects(), carved) << "round " << round << " carved";
    }
    if (!spares) {
      EXPECT_EQ(pool.trim(), kBurst) << "trim() left the thread's own cache";
      EXPECT_EQ(pool.cached_by_threads(), 0u);
    } else {
      // An empty cache beside two spares in use: trim() takes both.
      for (std::size_t i = 0; i < 16; ++i) held.push_back(pool.allocate());
      ASSERT_EQ(pool.cached_on(cpu), 0u);
      ASSERT_EQ(pool.spare_on(cpu), 32u);
      if (!fence_missing()) {
        EXPECT_EQ(pool.trim(), 32u);
        EXPECT_EQ(pool.spare_on(cpu), 0u);
        EXPECT_EQ(pool.depot_objects(), depot + 32);
      }
    }
  }
  for (void* p : held) pool.deallocate(p);
  one.restore();
  expect_all_home(pool);
}

TEST(ObjectPoolTest, BurstsOfThreeTimesTheCapacityStayWhereTheyWereFreed) {
  const bool lock_refused = fence_missing();
  bursts_of_three_capacities(lock_refused);
  // And where this mode has neither spares nor an own cache: the locked
  // path, as a thread beyond the thread slots takes it.
  internal::force_locked_path_for_this_thread(true);
  bursts_of_three_capacities(lock_refused);
  internal::force_locked_path_for_this_thread(false);
}

// Beyond what a cache and its spares hold, a thread trades whole caches
// with the depot, never batches or single objects: frees past three
// capacities give the depot one cache per capacity freed, the older spare
// whole, and allocations past them take one back per capacity, a chain the
// depot keeps as it came, carving nothing. With rseq on the CPU's cache and
// spares, without it on the thread's own; a CPU's cache locked without
// rseq has no spares (its batches: BurstsOfThreeTimesTheCapacity...).
TEST(ObjectPoolTest, BeyondTheSparesWholeCachesGoToTheDepotAndComeBack) {
  const on_one_cpu one;
  ASSERT_TRUE(one.pinned());
  object_pool pool(on_one_cpu::small_caches());
  const bool spares = uses_spares();
  const bool own = uses_own_cache(pool);
  if (!spares && !own) {
    GTEST_SKIP() << "this thread locks a CPU's cache, which has no spares here: batches";
  }
  std::printf("BeyondTheSparesWholeCachesGoToTheDepotAndComeBack: checked %s\n",
              spares ? "a CPU's cache and spares (rseq)" : "a thread's own cache (no rseq)");
  constexpr std::size_t kObjects = 10 * 16;
  std::vector<void*> held;
  ASSERT_NO_FATAL_FAILURE(hold_until_caches_empty(pool, kObjects, &held));
  std::vector<void*> burst(held.end() - kObjects, held.end());
  held.resize(held.size() - kObjects);
  const std::size_t carved = pool.carved_objects();
  std::vector<long> steps;  // each change of depot_objects(), in order
  auto note = [&](std::size_t before) {
    const long change = static_cast<long>(pool.depot_objects()) - static_cast<long>(before);
    if (change != 0) steps.push_back(change);
  };
  for (void* p : burst) {
    const std::size_t before = pool.depot_objects();
    pool.deallocate(p);
    note(before);
  }
  EXPECT_EQ(steps, std::vector<long>((kObjects - 48) / 16, 16))
      << "frees past a cache and two spares did not give the depot whole caches";
  EXPECT_EQ(cached_total(pool), 48u);
  steps.clear();
  for (std::size_t i = kObjects; i-- > 0;) {
    const std::size_t before = pool.depot_objects();
    void* p = pool.allocate();
    note(before);
    ASSERT_EQ(p, burst[i]) << "object " << i << " out of order";
  }
  EXPECT_EQ(steps, std::vector<long>((kObjects - 48) / 16, -16))
      << "allocations past the spares did not take whole caches back";
  EXPECT_EQ(pool.carved_objects(), carved);
  for (void* p : burst) pool.deallocate(p);
  for (void* p : held) pool.deallocate(p);
  one.restore();
  expect_all_home(pool);
}

// trim() gives the depot chains no longer than a cache, whatever it takes
// them from (a CPU's cache and spares, a thread's own cache and its spare
// stack, a CPU's cache a thread locked): a refill then takes one whole, as a
// CPU's cache can hold it. A longer chain would come back from every refill
// but one object, two depot locks per allocation until it was used up.
TEST(ObjectPoolTest, TrimGivesTheDepotChainsARefillTakesWhole) {
  const on_one_cpu one;
  ASSERT_TRUE(one.pinned());
  object_pool pool(on_one_cpu::small_caches());
  constexpr std::size_t kBurst = 48;
  std::vector<void*> held;
  ASSERT_NO_FATAL_FAILURE(hold_until_caches_empty(pool, kBurst, &held));
  for (std::size_t i = 0; i < kBurst; ++i) {
    pool.deallocate(held.back());
    held.pop_back();
  }
  const std::size_t cached = cached_total(pool);
  ASSERT_GT(cached, 0u);
  if (fence_missing()) {
    std::printf(
        "TrimGivesTheDepotChainsARefillTakesWhole: checked that trim() leaves CPU "
        "caches it cannot fence\n");
    EXPECT_EQ(pool.trim(), 0u);
  } else {
    std::printf("TrimGivesTheDepotChainsARefillTakesWhole: checked %zu cached objects\n", cached);
    EXPECT_EQ(pool.trim(), cached);
    ASSERT_EQ(cached_total(pool), 0u);
    const std::size_t depot = pool.depot_objects();
    held.push_back(pool.allocate());
    EXPECT_EQ(pool.depot_objects(), depot - 16)
        << "the first refill after trim() did not take one cache's worth whole";
    EXPECT_EQ(cached_total(pool), 15u);
  }
  for (void* p : held) pool.deallocate(p);
  one.restore();
  expect_all_home(pool);
}

TEST(ObjectPoolTest, TrimRefusesCachesItCannotFence) {
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  // Without rseq the pool is made while membarrier is missing, as it would be
  // on such a kernel: its threads then keep to the locked CPU caches, since
  // their own caches could not be revoked.
  const bool rseq = backend() == cpu_backend::rseq;
  if (!rseq) internal::simulate_missing_membarrier(true);
  object_pool pool(32);
  void* p = pool.allocate();
  pool.deallocate(p);
  internal::simulate_missing_membarrier(true);
  const std::size_t outside_depot = pool.carved_objects() - pool.depot_objects();
  EXPECT_GT(outside_depot, 0u);
  const std::size_t moved = pool.trim();
  // Which of the two this variant checks depends on its mode; both are
  // exact, and the trace names the mode.
  SCOPED_TRACE(std::string("backend ") + to_string(backend()));
  if (backend() == cpu_backend::rseq) {
    EXPECT_EQ(moved, 0u) << "without membarrier, caches of rseq threads must stay put";
    EXPECT_EQ(cached_total(pool), outside_depot);
  } else {
    EXPECT_EQ(moved, outside_depot) << "with no rseq in the process, trim needs no fence";
  }
  internal::simulate_missing_membarrier(false);
  expect_all_home(pool);
  stress::restrict_to(saved);
}

// Asks, before main and before any structure exists, for the fence that
// trim() and steals use, without registering: the kernel refuses it with
// EPERM unless the process is already registered. 0 means it was.
long membarrier(int command, unsigned flags, int cpu) {
  return syscall(__NR_membarrier, command, flags, cpu);
}
const int g_fence_errno_before_main = [] {
  const int cpu = sched_getcpu();
  const long rc =
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu < 0 ? 0 : cpu);
  return rc == 0 ? 0 : errno;
}();

// The registration the fence needs waits for an RCU grace period once the
// process has threads; percpu does it at load, while the program still has
// one, so no later trim() or steal pays for it.
TEST(ObjectPoolTest, RemoteFencesAreRegisteredAtLoad) {
  if (g_fence_errno_before_main == 0) return;  // registered before main: what we want
  const long mask = membarrier(MEMBARRIER_CMD_QUERY, 0, 0);
  if (mask < 0 || (mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ) == 0) {
    GTEST_SKIP() << "this kernel (or emulator) has no membarrier RSEQ fence";
  }
  if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0) != 0) {
    GTEST_SKIP() << "the membarrier RSEQ registration is refused here (errno " << errno << ")";
  }
  ADD_FAILURE() << "the process was not registered for the membarrier RSEQ fence at load "
                   "(the fence failed with errno "
                << g_fence_errno_before_main
                << "): the first trim() or steal in a threaded program waits for a grace period";
}

TEST(ObjectPoolDeathTest, MisuseIsReportedClearly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  object_pool pool(checked(40));
  void* p = pool.allocate();
  int foreign = 0;
  EXPECT_DEATH(pool.deallocate(&foreign),
               "deallocate of a pointer that this pool did not allocate");
  EXPECT_DEATH(pool.deallocate(static_cast<char*>(p) + 8), "into the middle of an object");
  EXPECT_DEATH(
      {
        pool.deallocate(p);
        pool.deallocate(p);
      },
      "double free");
  pool.deallocate(p);
}

// ---- stress ------------------------------------------------------------------

constexpr int kSignal = SIGUSR2;
constexpr std::size_t kObjectSize = 40;
object_pool* g_signal_pool = nullptr;
std::atomic<long> g_handler_runs{0};
std::atomic<long> g_corrupt{0};

// Each holder stamps the whole object with its own value and checks it
// before freeing: a second holder of the same object would overwrite it.
void stamp(void* p, std::uint64_t value) {
  auto* words = static_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < kObjectSize / 8; ++i) words[i] = value;
}

void check_and_free(object_pool& pool, void* p, std::uint64_t value) {
  const auto* words = static_cast<const std::uint64_t*>(p);
  for (std::size_t i = 0; i < kObjectSize / 8; ++i) {
    if (words[i] != value) g_corrupt.fetch_add(1, std::memory_order_relaxed);
  }
  pool.deallocate(p);
}

void on_signal(int) {
  if (object_pool* pool = g_signal_pool) {
    const long n = g_handler_runs.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t value = 0xfeed000000000000ull | static_cast<std::uint64_t>(n);
    void* a = pool->allocate();
    void* b = pool->allocate();
    if (a != nullptr) stamp(a, value);
    if (b != nullptr) stamp(b, value + 1);
    if (b != nullptr) check_and_free(*pool, b, value + 1);
    if (a != nullptr) check_and_free(*pool, a, value);
  }
}

struct run_options {
  bool flip_affinity = false;
  bool signals = false;
  bool mixed = false;
  bool trim = false;
  std::chrono::milliseconds length{500};
};

void hammer(const run_options& options) {
  g_corrupt.store(0);
  object_pool::options o = checked(kObjectSize);  // catches an object handed out twice
  o.cache_capacity = 32;
  object_pool pool(o);
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(cpus));
  if (options.signals) {
    g_handler_runs.store(0);
    g_signal_pool = &pool;
    stress::install_handler(kSignal, on_signal);
  }
  std::atomic<long> cycles{0};
  std::atomic<long> trims{0};
  std::atomic<long> failed{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      if (options.mixed && w % 3 == 0) internal::force_locked_path_for_this_thread(true);
      std::unique_ptr<stress::thread_signal_timer> timer;
      if (options.signals) timer.reset(new stress::thread_signal_timer(kSignal, 10000));
      void* held[48];
      long mine = 0;
      while (!stop) {
        const int n = 1 + static_cast<int>((w * 7 + mine) % 48);
        const std::uint64_t base = (static_cast<std::uint64_t>(w) << 48) | (mine << 8);
        for (int i = 0; i < n; ++i) {
          held[i] = pool.allocate();
          if (held[i] == nullptr) {
            failed.fetch_add(1);
          } else {
            stamp(held[i], base + i);
          }
        }
        for (int i = n - 1; i >= 0; --i) {
          if (held[i] != nullptr) check_and_free(pool, held[i], base + i);
        }
        ++mine;
      }
      internal::force_locked_path_for_this_thread(false);
      cycles.fetch_add(mine);
    });
    std::unique_ptr<stress::affinity_flipper> flipper;
    if (options.flip_affinity) {
      flipper.reset(new stress::affinity_flipper(workers, cpus, std::chrono::microseconds(300)));
    }
    std::atomic<bool> stop_trim{false};
    std::thread trimmer;
    if (options.trim) {
      trimmer = std::thread([&] {
        while (!stop_trim.load()) {
          pool.trim();
          trims.fetch_add(1);
          std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
      });
    }
    stress::sleep_scaled(options.length);
    if (flipper) {
      flipper->stop();
      std::printf("affinity flips: %ld\n", flipper->flips());
    }
    if (trimmer.joinable()) {
      // A starved trimmer (valgrind runs one thread at a time) gets until
      // the deadline to trim at least once while the workers still run.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (trims.load() == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      stop_trim.store(true);
      trimmer.join();
      std::printf("trims: %ld\n", trims.load());
      EXPECT_GT(trims.load(), 0);
    }
    workers.stop_and_join();
  }
  if (options.signals) {
    g_signal_pool = nullptr;
    std::printf("signal handlers ran %ld times\n", g_handler_runs.load());
    EXPECT_GT(g_handler_runs.load(), 0);
  }
  std::printf("worker cycles: %ld, objects carved: %zu\n", cycles.load(), pool.carved_objects());
  EXPECT_GT(cycles.load(), 0);
  EXPECT_EQ(failed.load(), 0) << "allocate failed outside a signal handler";
  EXPECT_EQ(g_corrupt.load(), 0) << "an object was used by two holders at once";
  stress::restrict_to(saved);
  expect_all_home(pool);
  if (options.signals) stress::restore_default(kSignal);
}

TEST(ObjectPoolStressTest, Oversubscribed) { hammer({}); }

TEST(ObjectPoolStressTest, AffinityFlipping) {
  run_options options;
  options.flip_affinity = true;
  hammer(options);
}

TEST(ObjectPoolStressTest, TimerSignalsAllocateAndFreeToo) {
  run_options options;
  options.signals = true;
  hammer(options);
}

TEST(ObjectPoolStressTest, LockedPathThreadsNextToRseqThreads) {
  run_options options;
  options.mixed = true;
  options.flip_affinity = true;
  hammer(options);
}

TEST(ObjectPoolStressTest, TrimWhileInUse) {
  run_options options;
  options.trim = true;
  options.flip_affinity = true;
  hammer(options);
}

TEST(ObjectPoolStressTest, EverythingAtOnce) {
  run_options options;
  options.trim = true;
  options.flip_affinity = true;
  options.signals = true;
  options.mixed = true;
  hammer(options);
}

TEST(ObjectPoolStressTest, ThreadChurn) {
  g_corrupt.store(0);
  std::atomic<long> failed{0};
  object_pool pool(checked(kObjectSize));
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(stress::test_cpus(2)));
  stress::churn(stress::scaled(600L), kWorkers, [&](long n) {
    void* held[20];
    for (int round = 0; round < 100; ++round) {
      const int count = 1 + static_cast<int>((n + round) % 20);
      for (int i = 0; i < count; ++i) {
        held[i] = pool.allocate();
        if (held[i] == nullptr) {
          failed.fetch_add(1);
        } else {
          stamp(held[i], static_cast<std::uint64_t>(n) << 16 | i);
        }
      }
      for (int i = 0; i < count; ++i) {
        if (held[i] != nullptr)
          check_and_free(pool, held[i], static_cast<std::uint64_t>(n) << 16 | i);
      }
    }
  });
  stress::restrict_to(saved);
  EXPECT_EQ(failed.load(), 0) << "allocate failed outside a signal handler";
  EXPECT_EQ(g_corrupt.load(), 0);
  expect_all_home(pool);
}

// The parent's workers keep allocating and freeing while the main thread
// forks. Each child trims its copy, runs its own threads on it, and must end
// with exactly the depot it started with.
TEST(ObjectPoolStressTest, ForkDuringHeavyUse) {
  object_pool pool(checked(kObjectSize));
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(stress::test_cpus(2)));
  int children = 0;
  std::atomic<long> failed{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      void* held[16];
      while (!stop) {
        for (int i = 0; i < 1 + w; ++i) {
          held[i] = pool.allocate();
          if (held[i] == nullptr) failed.fetch_add(1);
        }
        for (int i = 0; i < 1 + w; ++i) pool.deallocate(held[i]);
      }
    });
    const auto until =
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(500));
    while (std::chrono::steady_clock::now() < until) {
      const int status = stress::run_in_child(
          [&pool] {
            send_home(pool);  // trim(), and each CPU's flush where the fence is missing
            const std::size_t depot = pool.depot_objects();
            const std::size_t carved_before = pool.carved_objects();
            std::atomic<long> child_failed{0};
            std::vector<std::thread> threads;
            for (int t = 0; t < 4; ++t) {
              threads.emplace_back([&pool, &child_failed, t] {
                void* held[64];
                for (int round = 0; round < 2000; ++round) {
                  const int n = 1 + (round + t) % 64;
                  for (int i = 0; i < n; ++i) {
                    held[i] = pool.allocate();
                    if (held[i] == nullptr) child_failed.fetch_add(1);
                  }
                  for (int i = 0; i < n; ++i) pool.deallocate(held[i]);
                }
              });
            }
            for (std::thread& t : threads) t.join();
            if (child_failed.load() != 0) {
              std::fprintf(stderr, "child: %ld allocations failed\n", child_failed.load());
              return 2;
            }
            send_home(pool);
            const std::size_t added = pool.carved_objects() - carved_before;
            if (pool.depot_objects() != depot + added || cached_total(pool) != 0) {
              std::fprintf(stderr, "child: depot %zu, want %zu\n", pool.depot_objects(),
                           depot + added);
              return 1;
            }
            return 0;
          },
          std::chrono::seconds(60));
      ++children;
      EXPECT_EQ(status, 0) << "child " << children;
    }
    workers.stop_and_join();
  }
  stress::restrict_to(saved);
  std::printf("forked %d children\n", children);
  EXPECT_GT(children, 0);
  EXPECT_EQ(failed.load(), 0) << "allocate failed in the parent's workers";
  expect_all_home(pool);
}

// ---- fork against signal handlers on the locked path ---------------------------

// Ends the whole binary with a clear message when `progress` stops moving for
// `limit`, so a deadlock fails the test instead of hanging ctest until its
// timeout. (A deadlocked fork cannot be unwound; _exit is the only way out.)
class watchdog {
 public:
  watchdog(const std::atomic<long>& progress, std::chrono::seconds limit, const char* what)
      : thread_([this, &progress, limit, what] {
          long seen = progress.load();
          auto last_move = std::chrono::steady_clock::now();
          std::unique_lock<std::mutex> lock(mutex_);
          while (!done_) {
            cv_.wait_for(lock, std::chrono::milliseconds(100));
            if (progress.load() != seen) {
              seen = progress.load();
              last_move = std::chrono::steady_clock::now();
            } else if (std::chrono::steady_clock::now() - last_move > limit) {
              std::fprintf(stderr, "watchdog: no progress for %lld s: %s\n",
                           static_cast<long long>(limit.count()), what);
              std::fflush(stderr);
              _exit(3);
            }
          }
        }) {}
  ~watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Threads without rseq (the seam makes every worker take the locked path, as
// under seccomp) hold cache or list lockers all the time; timer signals
// interrupt them, and the handlers allocate and free on the pool. Meanwhile
// the main thread forks in a loop, and its fork handler takes every flag of
// every structure. A handler that spins on a lock the fork handler holds,
// while its own thread holds a flag the fork handler waits for, deadlocks
// the fork: the watchdog then fails the test.
void fork_while_locked_path_handlers_allocate(bool workers_use_free_list) {
  free_list list;  // registered before the pool, so fork prepares the pool first
  object_pool pool(checked(kObjectSize));
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(stress::test_cpus(2)));
  g_corrupt.store(0);
  g_handler_runs.store(0);
  g_signal_pool = &pool;
  stress::install_handler(kSignal, on_signal);
  std::atomic<long> forks{0};
  int failed_children = 0;
  std::vector<free_list_node> nodes(4 * 4);
  {
    watchdog dog(forks, std::chrono::seconds(20),
                 "fork() never returned: a fork handler and a signal handler wait for each other");
    stress::worker_group workers(4, [&](int w, const stress::stop_flag& stop) {
      internal::force_locked_path_for_this_thread(true);
      stress::thread_signal_timer timer(kSignal, 10000);
      // Each worker keeps four nodes in circulation; which four it holds
      // changes as pops take whatever the lists offer. The nodes outlive
      // every worker, since any of them may still be listed when one exits.
      free_list_node* own = &nodes[4 * w];
      free_list_node* held[4] = {&own[0], &own[1], &own[2], &own[3]};
      int holding = 4;
      long round = 0;
      while (!stop) {
        if (workers_use_free_list) {
          for (int i = 0; i < holding; ++i) list.push(held[i]);
          holding = 0;
          while (holding < 4 && !stop) {
            if (free_list_node* n = list.pop()) held[holding++] = n;
          }
        } else {
          const std::uint64_t value = (static_cast<std::uint64_t>(w) << 40) | round;
          void* p = pool.allocate();
          if (p != nullptr) {
            stamp(p, value);
            check_and_free(pool, p, value);
          }
        }
        ++round;
      }
      internal::force_locked_path_for_this_thread(false);
    });
    const auto until =
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(400));
    while (std::chrono::steady_clock::now() < until) {
      const int status = stress::run_in_child(
          [&pool] {
            void* p = pool.allocate();
            if (p == nullptr) return 1;
            pool.deallocate(p);
            return 0;
          },
          std::chrono::seconds(30));
      if (status != 0) ++failed_children;
      forks.fetch_add(1);
    }
    workers.stop_and_join();
  }
  g_signal_pool = nullptr;
  stress::restore_default(kSignal);
  stress::restrict_to(saved);
  std::printf("forked %ld children; signal handlers ran %ld times\n", forks.load(),
              g_handler_runs.load());
  EXPECT_GT(forks.load(), 0);
  EXPECT_GT(g_handler_runs.load(), 0) << "no timer signal reached a worker";
  EXPECT_EQ(failed_children, 0);
  EXPECT_EQ(g_corrupt.load(), 0) << "an object was used by two holders at once";
  expect_all_home(pool);
}

TEST(ObjectPoolStressTest, ForkWhileHandlersAllocateOnTheLockedPath) {
  fork_while_locked_path_handlers_allocate(false);
}

// The same across structures: the workers hold free_list lockers, their
// handlers use the pool.
TEST(ObjectPoolStressTest, ForkWhileFreeListHoldersHandlersAllocate) {
  fork_while_locked_path_handlers_allocate(true);
}

}  // namespace
}  // namespace percpu
