// Tests for the per-CPU memory (stride_arena.hpp): the layout, zeroed and
// reused objects, memory only for the CPUs that touch an object, and
// allocate/deallocate racing on threads and in signal handlers that
// interrupt them.

#include "percpu/internal/stride_arena.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
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
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "tests/stress/stress.hpp"
#include "tests/support/address_limit.hpp"
#include "tests/support/pages.hpp"

namespace percpu {
namespace internal {
namespace {

namespace stress = percpu::stress;

unsigned cpus() { return static_cast<unsigned>(max_cpus()); }

// Every word of every copy of `object`.
bool all_copies_zero(void* object, std::size_t size) {
  for (unsigned cpu = 0; cpu < cpus(); ++cpu) {
    const auto* copy = stride_copy(static_cast<const std::uintptr_t*>(object), cpu);
    for (std::size_t i = 0; i < size / sizeof(std::uintptr_t); ++i) {
      if (__atomic_load_n(&copy[i], __ATOMIC_RELAXED) != 0) return false;
    }
  }
  return true;
}

void fill_every_copy(void* object, std::size_t size, std::uintptr_t value) {
  for (unsigned cpu = 0; cpu < cpus(); ++cpu) {
    auto* copy = stride_copy(static_cast<std::uintptr_t*>(object), cpu);
    for (std::size_t i = 0; i < size / sizeof(std::uintptr_t); ++i) {
      __atomic_store_n(&copy[i], value + cpu, __ATOMIC_RELAXED);
    }
  }
}

bool every_copy_holds(void* object, std::size_t size, std::uintptr_t value) {
  for (unsigned cpu = 0; cpu < cpus(); ++cpu) {
    const auto* copy = stride_copy(static_cast<const std::uintptr_t*>(object), cpu);
    for (std::size_t i = 0; i < size / sizeof(std::uintptr_t); ++i) {
      if (__atomic_load_n(&copy[i], __ATOMIC_RELAXED) != value + cpu) return false;
    }
  }
  return true;
}

TEST(StrideArenaTest, SizeClassesHoldTheSizeAsked) {
  EXPECT_EQ(stride_arena_for(1).object_size(), 16u);
  EXPECT_EQ(stride_arena_for(16).object_size(), 16u);
  EXPECT_EQ(stride_arena_for(17).object_size(), 32u);
  EXPECT_EQ(stride_arena_for(100).object_size(), 128u);
  EXPECT_EQ(stride_arena_for(4096).object_size(), 4096u);
  EXPECT_EQ(stride_arena_for(16).objects_per_chunk(), (kStride - kStrideHeader) / 16);
}

// Objects are distinct and never overlap on any CPU; every copy is zero when
// handed out; CPU c's copy is c * kStride after CPU 0's.
TEST(StrideArenaTest, ObjectsAreDisjointZeroAndStrided) {
  stride_arena arena(48);  // not a power of two
  const std::size_t n = arena.objects_per_chunk() * 2 + 5;  // three chunks
  std::vector<char*> objects;
  for (std::size_t i = 0; i < n; ++i) {
    char* o = static_cast<char*>(arena.allocate());
    ASSERT_NE(o, nullptr);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(o) % 16, 0u);
    EXPECT_TRUE(all_copies_zero(o, arena.object_size())) << "object " << i;
    EXPECT_EQ(stride_copy(o, 1) - o, static_cast<std::ptrdiff_t>(kStride));
    objects.push_back(o);
  }
  // Disjoint: sorted CPU 0 copies are at least a size apart (copies of other
  // CPUs are the same offsets in other regions of the same chunk).
  std::set<char*> sorted(objects.begin(), objects.end());
  ASSERT_EQ(sorted.size(), objects.size());
  char* previous = nullptr;
  for (char* o : sorted) {
    if (previous != nullptr) {
      EXPECT_GE(static_cast<std::size_t>(o - previous), arena.object_size());
    }
    previous = o;
  }
  for (std::size_t i = 0; i < objects.size(); ++i) {
    fill_every_copy(objects[i], arena.object_size(), i * 1000 + 1);
  }
  for (std::size_t i = 0; i < objects.size(); ++i) {
    EXPECT_TRUE(every_copy_holds(objects[i], arena.object_size(), i * 1000 + 1))
        << "object " << i << " was overwritten through another";
  }
  for (char* o : objects) arena.deallocate(o);
}

// A freed object comes back, with every copy zero again.
TEST(StrideArenaTest, FreedObjectsAreReusedZeroed) {
  stride_arena arena(32);
  void* a = arena.allocate();
  void* b = arena.allocate();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  fill_every_copy(a, 32, 7);
  fill_every_copy(b, 32, 9);
  arena.deallocate(a);
  arena.deallocate(b);
  void* c = arena.allocate();
  void* d = arena.allocate();
  EXPECT_TRUE((c == a && d == b) || (c == b && d == a)) << "freed objects were not reused";
  EXPECT_TRUE(all_copies_zero(c, 32));
  EXPECT_TRUE(all_copies_zero(d, 32));
  arena.deallocate(c);
  arena.deallocate(d);
}

// Memory only where CPUs touch: objects written on CPU 0's copies leave the
// other CPUs' regions without a page (mincore, before anything reads them:
// on a kernel without the zero page, as some VM platforms run, a read
// populates a page too), and freeing them never writes there: with those
// regions made read-only, the frees must not fault.
TEST(StrideArenaTest, UntouchedCpusCostNoMemory) {
  if (cpus() < 2) GTEST_SKIP() << "one possible CPU: no other region to leave untouched";
  stride_arena arena(16);
  std::vector<void*> objects;
  for (std::size_t i = 0; i < arena.objects_per_chunk(); ++i) objects.push_back(arena.allocate());
  ASSERT_NE(objects.front(), nullptr);
  char* chunk = static_cast<char*>(objects.front()) - kStrideHeader;
  for (void* o : objects) *static_cast<std::uintptr_t*>(o) = 1;
  EXPECT_GT(test::present_pages(chunk, kStride), 0);
  for (unsigned cpu = 1; cpu < cpus(); ++cpu) {
    ASSERT_EQ(test::present_pages(stride_copy(chunk, cpu), kStride), 0)
        << "CPU " << cpu << "'s region has pages, though nothing ran there";
  }
  EXPECT_EXIT(
      {
        ASSERT_EQ(mprotect(stride_copy(chunk, 1), kStride * (cpus() - 1), PROT_READ), 0);
        for (void* o : objects) arena.deallocate(o);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "")
      << "deallocate() wrote into the region of a CPU that never touched the object";
  for (void* o : objects) arena.deallocate(o);
}

// An arena of a fixed number of regions (the thread arenas): each object has
// that many copies, CPU count aside; a deallocate told that only the first
// copies were written reads and zeroes only those, and the rest of the
// chunk stays unpopulated (a read would populate a page on a kernel without
// a zero page).
TEST(StrideArenaTest, FixedRegionsAndDeallocatingTheWrittenCopiesOnly) {
  constexpr unsigned kRegions = 40;
  stride_arena arena(16, kRegions);
  EXPECT_EQ(arena.regions(), kRegions);
  void* o = arena.allocate();
  ASSERT_NE(o, nullptr);
  char* chunk = static_cast<char*>(o) - kStrideHeader;
  for (unsigned c = 0; c < 3; ++c) *stride_copy(static_cast<std::uintptr_t*>(o), c) = c + 1;
  *stride_copy(static_cast<std::uintptr_t*>(o), kRegions - 1) = 9;  // the last copy is mapped
  EXPECT_EXIT(
      {
        ASSERT_EQ(mprotect(stride_copy(chunk, 3), kStride * (kRegions - 4), PROT_NONE), 0);
        arena.deallocate(o, 3);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "")
      << "deallocate(o, 3) read a copy above the third";
  arena.deallocate(o, 3);
  for (unsigned c = 0; c < 3; ++c) EXPECT_EQ(*stride_copy(static_cast<std::uintptr_t*>(o), c), 0u);
  EXPECT_EQ(test::present_pages(stride_copy(chunk, 3), kStride * (kRegions - 4)), 0);
  *stride_copy(static_cast<std::uintptr_t*>(o), kRegions - 1) = 0;  // as its writer would have left it
}

// Threads allocate, mark every copy with their own value, check it, and
// free, all at once: an object handed to two owners shows as a changed mark.
TEST(StrideArenaTest, ThreadsNeverShareAnObject) {
  static stride_arena arena(64);
  constexpr int kThreads = 6;
  std::atomic<long> wrong{0};
  const auto until = std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(500));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> held;
      std::uintptr_t mark = static_cast<std::uintptr_t>(t + 1) << 32;
      while (std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 64; ++i) {
          void* o = arena.allocate();
          if (o == nullptr || !all_copies_zero(o, 64)) wrong.fetch_add(1);
          fill_every_copy(o, 64, mark + static_cast<std::uintptr_t>(i) * 4096);
          held.push_back(o);
        }
        for (std::size_t i = 0; i < held.size(); ++i) {
          if (!every_copy_holds(held[i], 64, mark + i * 4096)) wrong.fetch_add(1);
          arena.deallocate(held[i]);
        }
        held.clear();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Handlers that allocate and free interrupt the same calls on their thread:
// nothing waits (the pop try-lock is taken by the interrupted frame at
// times), nothing is handed out twice.
stride_arena g_signal_arena(16);
std::atomic<long> g_handler_objects{0};
std::atomic<long> g_handler_wrong{0};

void allocate_in_handler(int) {
  const int saved_errno = errno;
  void* o = g_signal_arena.allocate();
  if (o == nullptr || !all_copies_zero(o, 16)) g_handler_wrong.fetch_add(1);
  fill_every_copy(o, 16, 0xabc);
  if (!every_copy_holds(o, 16, 0xabc)) g_handler_wrong.fetch_add(1);
  g_signal_arena.deallocate(o);
  g_handler_objects.fetch_add(1, std::memory_order_relaxed);
  errno = saved_errno;
}

TEST(StrideArenaTest, HandlersInterruptingAllocateAndDeallocate) {
  stress::install_handler(SIGUSR1, allocate_in_handler);
  long wrong = 0;
  {
    stress::thread_signal_timer timer(SIGUSR1, 20000);
    ASSERT_TRUE(timer.armed());
    const auto until =
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(500));
    std::uintptr_t mark = 1;
    while (std::chrono::steady_clock::now() < until || g_handler_objects.load() == 0) {
      void* held[8];
      for (void*& o : held) {
        o = g_signal_arena.allocate();
        if (o == nullptr || !all_copies_zero(o, 16)) ++wrong;
        fill_every_copy(o, 16, mark << 20);
      }
      for (void* o : held) {
        if (!every_copy_holds(o, 16, mark << 20)) ++wrong;
        g_signal_arena.deallocate(o);
      }
      ++mark;
    }
  }
  std::printf("%ld objects allocated and freed by handlers\n", g_handler_objects.load());
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(g_handler_wrong.load(), 0);
}


// A child of fork() keeps the parent's objects, with their copies as they
// were, frees them and gets them back zeroed; the parent's arena is not
// affected. A fork while another thread holds the pop try-lock leaves it
// held in the child, whose arena then still allocates (unused memory),
// neither waiting nor handing an object out twice.
TEST(StrideArenaTest, AChildOfForkUsesAndFreesTheParentsObjects) {
  static stride_arena arena(32);
  std::vector<void*> objects;
  for (int i = 0; i < 20; ++i) {
    objects.push_back(arena.allocate());
    ASSERT_NE(objects.back(), nullptr);
    fill_every_copy(objects.back(), 32, 100 + i);
  }
  arena.deallocate(objects[0]);  // one on the free list at the fork
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int bad = 0;
    for (int i = 1; i < 20; ++i) bad += !every_copy_holds(objects[i], 32, 100 + i);
    void* reused = arena.allocate();
    bad += reused != objects[0] ? 10 : 0;
    bad += !all_copies_zero(reused, 32) ? 100 : 0;
    for (int i = 1; i < 20; ++i) arena.deallocate(objects[i]);
    for (int i = 1; i < 20; ++i) bad += !all_copies_zero(arena.allocate(), 32) ? 1000 : 0;
    _exit(bad == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  for (int i = 1; i < 20; ++i) {
    EXPECT_TRUE(every_copy_holds(objects[i], 32, 100 + i)) << "the child's frees reached the parent";
  }
  for (int i = 1; i < 20; ++i) arena.deallocate(objects[i]);
}

stride_arena g_fork_arena(16);
std::atomic<bool> g_fork_churn_stop{false};

void* churn_fork_arena(void*) {
  while (!g_fork_churn_stop.load(std::memory_order_relaxed)) {
    void* o = g_fork_arena.allocate();
    if (o != nullptr) g_fork_arena.deallocate(o);
  }
  return nullptr;
}

// The churning thread is a plain pthread and the child allocates nothing of
// its own: the child leaves by _exit, and valgrind's leak check (in the
// valgrind lane) would count a std::thread's state there as lost.
TEST(StrideArenaTest, ForkWhileAnotherThreadPopsLeavesTheChildAllocating) {
  pthread_t churn;
  ASSERT_EQ(pthread_create(&churn, nullptr, churn_fork_arena, nullptr), 0);
  int failures = 0;
  for (long round = 0; round < stress::scaled(100); ++round) {
    const pid_t child = fork();
    if (child == 0) {
      // Whatever state the other thread left behind: allocations succeed,
      // are zero, and are distinct.
      void* got[64];
      for (int i = 0; i < 64; ++i) {
        got[i] = g_fork_arena.allocate();
        if (got[i] == nullptr || !all_copies_zero(got[i], 16)) _exit(1);
        for (int j = 0; j < i; ++j) {
          if (got[j] == got[i]) _exit(2);
        }
        *static_cast<std::uintptr_t*>(got[i]) = 1;
      }
      for (void* o : got) g_fork_arena.deallocate(o);
      _exit(0);
    }
    if (child < 0) {
      ++failures;
      break;
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
    }
  }
  g_fork_churn_stop.store(true);
  pthread_join(churn, nullptr);
  EXPECT_EQ(failures, 0);
}

// When no chunk can be mapped (here: an address-space limit in a child),
// allocate() returns nullptr and keeps errno; freed objects are still
// reused, and once memory is back it allocates again.
TEST(StrideArenaTest, ExhaustionReturnsNullAndKeepsErrno) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  static stride_arena arena(4096);  // 15 objects a chunk: chunks run out quickly
  static std::vector<void*> held;
  held.reserve(4096);  // no allocation of the test's own under the limit
  // Room for three chunks more than the process has mapped.
  const int status = test::run_under_address_limit(kStride * cpus() * 3, [] {
    rlimit original{};
    getrlimit(RLIMIT_AS, &original);
    errno = 1234;
    void* o = nullptr;
    while ((o = arena.allocate()) != nullptr) {
      *static_cast<std::uintptr_t*>(o) = 5;
      held.push_back(o);
      if (held.size() >= 4096) return 3;  // the limit did not bite
    }
    if (errno != 1234) return 4;
    if (held.empty()) return 5;
    arena.deallocate(held.back());
    void* again = arena.allocate();
    if (again != held.back() || !all_copies_zero(again, 4096)) return 6;
    original.rlim_cur = original.rlim_max;
    setrlimit(RLIMIT_AS, &original);
    if (arena.allocate() == nullptr) return 7;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  if (WEXITSTATUS(status) == test::kLimitNotEnforced) {
    GTEST_SKIP() << "RLIMIT_AS is not enforced here (qemu-user ignores it)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "98: setrlimit failed, 3: never exhausted, 4: errno changed, 5: nothing allocated, "
         "6: a freed object was not reused zeroed, 7: no allocation once memory was back";
}

}  // namespace
}  // namespace internal
}  // namespace percpu
