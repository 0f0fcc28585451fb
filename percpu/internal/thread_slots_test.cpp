// Tests for the thread indexes and the thread-group memory
// (thread_slots.hpp): an exited thread's index is handed out again before a
// new one, so the indexes in use stay below the most threads alive at once;
// threads alive together never share one; a group's lines sit side by side
// and no two indexes share a line; copies come back zeroed.

#include "percpu/internal/thread_slots.hpp"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace percpu {
namespace internal {
namespace {

// A new thread's index, once the thread has exited: joined, and gone as
// far as tgkill can tell (join returns when the kernel clears the thread's
// id word, a moment before the thread stops existing for tgkill, which is
// what decides whether its index is free).
int index_of_a_new_thread() {
  int index = -2;
  int tid = 0;
  std::thread([&] {
    index = thread_index();
    tid = static_cast<int>(syscall(SYS_gettid));
  }).join();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(syscall(SYS_tgkill, getpid(), tid, 0) != 0 && errno == ESRCH) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  return index;
}

// A pool of worker threads made anew for each job: 200 threads, one after
// another. Each takes an index that an exited thread left, so the limit
// that every walk over the threads' words stops at grows by one at most.
TEST(ThreadIndexTest, AnExitedThreadsIndexIsHandedOutAgain) {
  (void)thread_index();
  const int limit_before = thread_index_limit();
  for (int i = 0; i < 200; ++i) {
    const int index = index_of_a_new_thread();
    ASSERT_GE(index, 0);
    ASSERT_LE(index, limit_before)
        << "thread " << i << " took a new index though exited threads' were free";
  }
  EXPECT_LE(thread_index_limit(), limit_before + 1);
}

// Threads alive at once hold distinct indexes, however many have come and
// gone before them.
TEST(ThreadIndexTest, ThreadsAliveTogetherNeverShareAnIndex) {
  for (int i = 0; i < 20; ++i) (void)index_of_a_new_thread();
  constexpr int kThreads = 24;
  std::vector<int> index(kThreads, -2);
  std::atomic<int> claimed{0};
  std::atomic<bool> may_exit{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      index[t] = thread_index();
      claimed.fetch_add(1);
      while (!may_exit.load()) std::this_thread::yield();
    });
  }
  while (claimed.load() != kThreads) std::this_thread::yield();
  const int mine = thread_index();
  std::set<int> seen = {mine};
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_GE(index[t], 0);
    EXPECT_TRUE(seen.insert(index[t]).second) << "index " << index[t] << " held twice";
    EXPECT_LT(index[t], thread_index_limit());
  }
  may_exit = true;
  for (std::thread& t : threads) t.join();
}

// The layout: a group's lines one after another, a group's copy kStride
// after the previous group's, so no two indexes' lines overlap or share a
// cache line; and the thread's own offset as the hot paths read it.
TEST(ThreadGroupTest, EveryIndexHasALineOfItsOwn) {
  std::set<std::uintptr_t> lines;
  for (int i = 0; i < kThreadSlots; ++i) {
    const std::uintptr_t offset = thread_group_offset(i);
    EXPECT_EQ(offset % kThreadGroupLine, 0u) << "index " << i;
    EXPECT_TRUE(lines.insert(offset / kThreadGroupLine).second) << "index " << i;
    if (i % kThreadGroup != 0) {
      EXPECT_EQ(offset, thread_group_offset(i - 1) + kThreadGroupLine) << "index " << i;
    } else {
      EXPECT_EQ(offset, static_cast<std::uintptr_t>(i / kThreadGroup) * kStride) << "index " << i;
    }
  }
  const int mine = thread_index();
  ASSERT_GE(mine, 0);
  EXPECT_EQ(t_thread_group_offset_plus_one, static_cast<int>(thread_group_offset(mine)) + 1);
}

// Every line of a new object is zero, also when it reuses one whose lines
// were written, in every group.
TEST(ThreadGroupTest, CopiesComeBackZeroed) {
  std::vector<std::thread> threads;
  // Enough indexes handed out that the last group is among those zeroed.
  std::atomic<bool> may_exit{false};
  std::atomic<int> claimed{0};
  for (int t = 0; t < 2 * kThreadGroup + 1; ++t) {
    threads.emplace_back([&] {
      (void)thread_index();
      claimed.fetch_add(1);
      while (!may_exit.load()) std::this_thread::yield();
    });
  }
  while (claimed.load() != 2 * kThreadGroup + 1) std::this_thread::yield();
  const int limit = thread_index_limit();
  std::set<void*> written;
  for (int round = 0; round < 64; ++round) {
    char* object = static_cast<char*>(new_thread_group_copies());
    ASSERT_NE(object, nullptr);
    for (int i = 0; i < limit; ++i) {
      char* line = object + thread_group_offset(i);
      for (std::size_t b = 0; b < kThreadGroupLine; ++b) {
        ASSERT_EQ(line[b], 0) << "round " << round << ", index " << i << ", byte " << b
                              << (written.count(object) != 0 ? " (a reused object)" : "");
      }
      std::memset(line, 0x5a, kThreadGroupLine);
    }
    written.insert(object);
    delete_thread_group_copies(object);
  }
  EXPECT_LT(written.size(), 64u) << "no object was reused: the zeroing went untested";
  may_exit = true;
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace internal
}  // namespace percpu
