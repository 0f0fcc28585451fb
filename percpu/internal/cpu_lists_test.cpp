// Tests for the per-CPU list (cpu_lists.hpp): new lists are empty; the
// ladder's steps in order (the thread's own list, then its hint CPU's under
// the lock, then nothing), without waiting for a lock another frame holds
// and without touching a list it may not fence; remote takes cut exactly a
// batch; drain empties every list it can lock and leaves a busy one whole;
// the overflow stack; and fork, in the child and with a lock the forking
// thread's own frame holds. The mode variants (.glibc, .own, .fallback) run
// it with and without rseq. The started hot paths: a thread the test seam
// sends to the locked path never commits one, and in a fresh process none
// commits before the section users count says so.

#include "percpu/internal/cpu_lists.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <set>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "tests/stress/stress.hpp"

namespace percpu {
namespace internal {
namespace {

namespace stress = percpu::stress;

struct node {
  node* next;
  int id;
};

std::intptr_t word(node* n) { return reinterpret_cast<std::intptr_t>(n); }
node* as_node(std::intptr_t w) { return reinterpret_cast<node*>(w); }

// A failing section, for the steps of a thread without rseq (area nullptr
// never runs it: a call here is a test failure).
bool no_section(rseq_area*) {
  ADD_FAILURE() << "at_home ran the section step for a thread without an area";
  return false;
}

// Links nodes[0..n) into one chain, nodes[0] on top.
void link(std::vector<node>& nodes) {
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].id = static_cast<int>(i);
    nodes[i].next = i + 1 < nodes.size() ? &nodes[i + 1] : nullptr;
  }
}

std::vector<int> ids_of(std::intptr_t head) {
  std::vector<int> ids;
  for (node* n = as_node(head); n != nullptr; n = n->next) ids.push_back(n->id);
  return ids;
}

// Puts per_cpu[c], linked, on CPU c's list, as a remote thread does: under
// the lock. False when a lock was not acquired.
bool fill_every_cpu_list(cpu_lists& lists, std::vector<std::vector<node>>& per_cpu) {
  for (int cpu = 0; cpu < lists.count(); ++cpu) {
    link(per_cpu[cpu]);
    std::intptr_t head = 0;
    if (lock_slot(lists.slot_of(cpu), cpu, &head) != lock_result::acquired) return false;
    unlock_slot(lists.slot_of(cpu), word(&per_cpu[cpu][0]));
  }
  return true;
}

bool fence_missing() { return sections_status() == sections::on && !slot_fence_available(); }

// Every list of a new instance is empty, and stays so where nothing was
// pushed: nothing pops from nowhere.
TEST(CpuListsTest, NewListsAreEmpty) {
  cpu_lists lists;
  EXPECT_EQ(lists.count(), max_cpus());
  for (int cpu = 0; cpu < lists.count(); ++cpu) EXPECT_EQ(lists.head_of(cpu), 0) << cpu;
  for (int i = 0; i < lists.thread_limit(); ++i) EXPECT_EQ(lists.thread_head_of(i), 0) << i;
  EXPECT_EQ(lists.pop_home(section_area()), 0);
  EXPECT_EQ(lists.overflow_pop(), 0);
  int handed = 0;
  lists.drain(
      kListLockTries, [&](std::intptr_t) { ++handed; }, [&](std::intptr_t) { ++handed; });
  EXPECT_EQ(handed, 0);
}

// On one CPU, whatever the mode, the ladder's push and pop are one LIFO
// list: a chain pushed comes back top first, then what was under it.
TEST(CpuListsTest, PushHomeAndPopHomeAreOneStackOnOneCpu) {
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  cpu_lists lists;
  std::vector<node> nodes(5);
  link(nodes);
  rseq_area* area = section_area();
  ASSERT_TRUE(lists.push_home(area, word(&nodes[3]), word(&nodes[4])));
  nodes[2].next = nullptr;
  ASSERT_TRUE(lists.push_home(area, word(&nodes[0]), word(&nodes[2])));
  std::vector<int> popped;
  while (const std::intptr_t n = lists.pop_home(area)) popped.push_back(as_node(n)->id);
  EXPECT_EQ(popped, (std::vector<int>{0, 1, 2, 3, 4}));
}

// A thread without rseq (area nullptr): step 2 is its own list, so what
// `exclusive` leaves in the head is that list, and no CPU's list changes.
TEST(CpuListsTest, WithoutAnAreaTheOwnListComesFirst) {
  if (!thread_slots_usable()) GTEST_SKIP() << "no thread slots in this process: step 2 is absent";
  cpu_lists lists;
  ASSERT_NE(lists.own_thread_slot(), nullptr);
  node n{nullptr, 7};
  int calls = 0;
  EXPECT_TRUE(lists.at_home(nullptr, no_section, [&](std::intptr_t* head) {
    ++calls;
    EXPECT_EQ(*head, 0);
    *head = word(&n);
    return true;
  }));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(lists.thread_head_of(thread_index()), word(&n));
  for (int cpu = 0; cpu < lists.count(); ++cpu) EXPECT_EQ(lists.head_of(cpu), 0) << cpu;
}

// pop_own() is step 2 alone: the thread's own list, top first, then 0 while
// every CPU's list still holds nodes; and 0 from inside the thread's own
// step (a signal handler that interrupted it), which it must not touch.
TEST(CpuListsTest, PopOwnTakesOnlyTheThreadsOwnList) {
  if (!thread_slots_usable()) GTEST_SKIP() << "no thread slots in this process: step 2 is absent";
  if (fence_missing()) GTEST_SKIP() << "sections run and membarrier cannot fence: no lock";
  cpu_lists lists;
  ASSERT_NE(lists.own_thread_slot(), nullptr);
  std::vector<std::vector<node>> per_cpu(lists.count(), std::vector<node>(2));
  ASSERT_TRUE(fill_every_cpu_list(lists, per_cpu));
  std::vector<node> own(3);
  link(own);
  ASSERT_TRUE(lists.at_home(nullptr, no_section, [&](std::intptr_t* head) {
    *head = word(&own[0]);
    return true;
  }));

  std::intptr_t inside = -1;
  ASSERT_TRUE(lists.on_own_list([&](std::intptr_t*) {
    inside = lists.pop_own();
    return true;
  }));
  EXPECT_EQ(inside, 0) << "popped from the own list while this thread's own step held it";

  std::vector<int> popped;  // -1: nothing popped
  for (int i = 0; i < 5; ++i) {
    const std::intptr_t n = lists.pop_own();
    popped.push_back(n != 0 ? as_node(n)->id : -1);
  }
  EXPECT_EQ(popped, (std::vector<int>{0, 1, 2, -1, -1}));
  EXPECT_EQ(lists.thread_head_of(thread_index()), 0);
  for (int cpu = 0; cpu < lists.count(); ++cpu) {
    EXPECT_EQ(lists.head_of(cpu), word(&per_cpu[cpu][0]))
        << "pop_own() changed CPU " << cpu << "'s list";
  }
}

// Step 2 declined (its `exclusive` answered false), the ladder goes on to
// the hint CPU's list under the lock, and a second false ends it. The
// locked step's head change is what that CPU's list holds afterwards.
TEST(CpuListsTest, DeclinedOwnListGoesOnToTheHintCpuUnderTheLock) {
  if (fence_missing()) GTEST_SKIP() << "sections run and membarrier cannot fence: no lock";
  cpu_lists lists;
  node n{nullptr, 9};
  std::vector<bool> own_step;
  const bool has_own = lists.own_thread_slot() != nullptr;
  EXPECT_TRUE(lists.at_home(nullptr, no_section, [&](std::intptr_t* head) {
    own_step.push_back(own_step.empty() && has_own);
    if (own_step.back()) return false;  // decline the own list
    *head = word(&n);
    return true;
  }));
  EXPECT_EQ(own_step.size(), has_own ? 2u : 1u);
  // The hint CPU's list (which CPU that is may change with a migration):
  // exactly one list holds n.
  int hint = -1;
  for (int cpu = 0; cpu < lists.count(); ++cpu) {
    if (lists.head_of(cpu) == 0) continue;
    EXPECT_EQ(hint, -1) << "two CPUs' lists changed";
    EXPECT_EQ(lists.head_of(cpu), word(&n));
    hint = cpu;
  }
  ASSERT_NE(hint, -1) << "the locked step wrote no list";
  if (has_own) {
    EXPECT_EQ(lists.thread_head_of(thread_index()), 0);
  }

  int calls = 0;
  EXPECT_FALSE(lists.at_home(nullptr, no_section, [&](std::intptr_t*) {
    ++calls;
    return false;
  }));
  EXPECT_EQ(calls, has_own ? 2 : 1);
  EXPECT_EQ(lists.head_of(hint), word(&n)) << "a declined step changed the list";
}

// The hint CPU's list locked by a frame of this very thread (a signal
// handler that interrupted a locker is this case): the ladder must not wait
// for it, and must not run `exclusive` on it. Every CPU's list is locked,
// so whichever the hint names is.
TEST(CpuListsTest, ALockThisThreadHoldsIsNotWaitedFor) {
  if (fence_missing()) GTEST_SKIP() << "sections run and membarrier cannot fence: no lock";
  cpu_lists lists;
  force_locked_path_for_this_thread(true);  // no own list: straight to step 3
  std::vector<std::intptr_t> held(lists.count());
  for (int cpu = 0; cpu < lists.count(); ++cpu) {
    ASSERT_EQ(lock_slot(lists.slot_of(cpu), cpu, &held[cpu]), lock_result::acquired);
  }
  int calls = 0;
  EXPECT_FALSE(lists.at_home(nullptr, no_section, [&](std::intptr_t*) {
    ++calls;
    return true;
  }));
  EXPECT_EQ(calls, 0);
  for (int cpu = 0; cpu < lists.count(); ++cpu) unlock_slot(lists.slot_of(cpu), held[cpu]);
  EXPECT_TRUE(lists.at_home(nullptr, no_section, [&](std::intptr_t*) {
    ++calls;
    return true;
  }));
  EXPECT_EQ(calls, 1);
  force_locked_path_for_this_thread(false);
}

// Sections may run and there is no fence: the locked step is refused, so a
// thread on the locked path never touches a CPU's list (cpu_slots.hpp).
TEST(CpuListsTest, NoFenceNoLockedStep) {
  if (sections_status() != sections::on) GTEST_SKIP() << "no sections in this process";
  cpu_lists lists;
  (void)mark_section_user();
  simulate_missing_membarrier(true);
  force_locked_path_for_this_thread(true);
  int calls = 0;
  const bool done = lists.at_home(nullptr, no_section, [&](std::intptr_t*) {
    ++calls;
    return true;
  });
  force_locked_path_for_this_thread(false);
  simulate_missing_membarrier(false);
  EXPECT_FALSE(done);
  EXPECT_EQ(calls, 0);
}

// take_from_cpu and take_from_thread cut exactly `batch` nodes from the top
// (or the whole list when shorter), end the batch in 0, and leave the rest.
TEST(CpuListsTest, RemoteTakesCutABatchFromTheTop) {
  if (fence_missing()) GTEST_SKIP() << "sections run and membarrier cannot fence: no lock";
  cpu_lists lists;
  std::vector<node> nodes(6);
  link(nodes);
  const int cpu = lists.count() - 1;
  std::intptr_t head = 0;
  ASSERT_EQ(lock_slot(lists.slot_of(cpu), cpu, &head), lock_result::acquired);
  unlock_slot(lists.slot_of(cpu), word(&nodes[0]));
  std::intptr_t last = 0;
  const std::intptr_t first = lists.take_from_cpu(cpu, 4, &last);
  EXPECT_EQ(ids_of(first), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(last, word(&nodes[3]));
  EXPECT_EQ(ids_of(lists.head_of(cpu)), (std::vector<int>{4, 5}));
  EXPECT_EQ(ids_of(lists.take_from_cpu(cpu, 16, &last)), (std::vector<int>{4, 5}));
  EXPECT_EQ(lists.head_of(cpu), 0);
  EXPECT_EQ(lists.take_from_cpu(cpu, 16, &last), 0) << "an empty list gave a node";

  if (!thread_slots_usable()) return;
  link(nodes);
  ASSERT_TRUE(lists.at_home(nullptr, no_section, [&](std::intptr_t* h) {
    *h = word(&nodes[0]);
    return true;
  }));
  const int self = thread_index();
  ASSERT_EQ(lists.thread_head_of(self), word(&nodes[0]));
  EXPECT_EQ(ids_of(lists.take_from_thread(self, 5, &last)), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ids_of(lists.thread_head_of(self)), (std::vector<int>{5}));
  // Taken from, the slot was revoked and given back: its owner uses it again.
  EXPECT_TRUE(lists.at_home(nullptr, no_section, [&](std::intptr_t* h) {
    EXPECT_EQ(*h, word(&nodes[5]));
    return true;
  }));
}

// drain hands over every non-empty list once, whole, and leaves it empty,
// and a thread's spare word as it is, to its own callback, leaving 0; a
// list locked meanwhile (by this thread's frame here) keeps its nodes.
TEST(CpuListsTest, DrainEmptiesEveryListItCanLock) {
  if (fence_missing()) GTEST_SKIP() << "sections run and membarrier cannot fence: no lock";
  cpu_lists lists;
  const int count = lists.count();
  std::vector<std::vector<node>> per_cpu(count, std::vector<node>(3));
  ASSERT_TRUE(fill_every_cpu_list(lists, per_cpu));
  std::vector<node> own(2);
  link(own);
  const bool has_own = lists.own_thread_slot() != nullptr;
  node spare_word{};  // only its address matters: drain must not read it
  if (has_own) {
    ASSERT_TRUE(lists.at_home(nullptr, no_section, [&](std::intptr_t* h) {
      *h = word(&own[0]);
      return true;
    }));
    ASSERT_TRUE(lists.on_own_slot([&](thread_slot* slot) {
      EXPECT_EQ(thread_slot_head(slot), word(&own[0]));
      set_thread_slot_spare(slot, word(&spare_word));
      return true;
    }));
    EXPECT_EQ(lists.thread_spare_of(thread_index()), word(&spare_word));
  }
  const int busy = 0;
  std::intptr_t held = 0;
  ASSERT_EQ(lock_slot(lists.slot_of(busy), busy, &held), lock_result::acquired);
  std::set<std::intptr_t> handed;
  int lists_handed = 0;
  std::vector<std::intptr_t> spares_handed;
  lists.drain(
      kListLockTries,
      [&](std::intptr_t head) {
        ++lists_handed;
        for (node* n = as_node(head); n != nullptr; n = n->next) {
          EXPECT_TRUE(handed.insert(word(n)).second) << "node " << n->id << " handed twice";
        }
      },
      [&](std::intptr_t spare) { spares_handed.push_back(spare); });
  EXPECT_EQ(lists_handed, count - 1 + (has_own ? 1 : 0));
  EXPECT_EQ(spares_handed,
            has_own ? std::vector<std::intptr_t>{word(&spare_word)} : std::vector<std::intptr_t>{});
  if (has_own) {
    EXPECT_EQ(lists.thread_spare_of(thread_index()), 0);
  }
  EXPECT_EQ(handed.size(), static_cast<std::size_t>(3 * (count - 1) + (has_own ? 2 : 0)));
  for (int cpu = 1; cpu < count; ++cpu) EXPECT_EQ(lists.head_of(cpu), 0) << cpu;
  for (int i = 0; i < lists.thread_limit(); ++i) EXPECT_EQ(lists.thread_head_of(i), 0) << i;
  unlock_slot(lists.slot_of(busy), held);
  EXPECT_EQ(ids_of(lists.head_of(busy)), (std::vector<int>{0, 1, 2})) << "the busy list lost nodes";
}

// While a fork handler on another thread holds the flags (between
// begin_fork_flags and end_fork_flags), a remote take finds the list busy
// and leaves it whole, its locker free: the handler waits only for the
// lockers of that moment, and a fork never copies a list half moved.
TEST(CpuListsTest, ARemoteTakeDuringAForksHoldLeavesTheListWhole) {
  if (fence_missing()) GTEST_SKIP() << "sections run and membarrier cannot fence: no lock";
  cpu_lists lists;
  std::vector<std::vector<node>> per_cpu(lists.count(), std::vector<node>(3));
  ASSERT_TRUE(fill_every_cpu_list(lists, per_cpu));
  std::atomic<int> phase{0};
  std::thread forker([&] {
    begin_fork_flags();
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
    end_fork_flags();
  });
  while (phase.load() != 1) std::this_thread::yield();
  std::intptr_t last = 0;
  EXPECT_EQ(lists.take_from_cpu(0, 16, &last), 0) << "a take went on during a fork's hold";
  int calls = 0;
  force_locked_path_for_this_thread(true);
  EXPECT_FALSE(lists.at_home(nullptr, no_section, [&](std::intptr_t*) {
    ++calls;
    return true;
  }));
  force_locked_path_for_this_thread(false);
  EXPECT_EQ(calls, 0) << "the ladder's locked step ran during a fork's hold";
  EXPECT_EQ(__atomic_load_n(&lists.slot_of(0)->locker, __ATOMIC_RELAXED), kFlagFree);
  phase.store(2);
  forker.join();
  EXPECT_EQ(ids_of(lists.head_of(0)), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ids_of(lists.take_from_cpu(0, 16, &last)), (std::vector<int>{0, 1, 2}));
}

TEST(CpuListsTest, OverflowStackIsLifoAndTakeAllEmptiesIt) {
  cpu_lists lists;
  std::vector<node> nodes(4);
  link(nodes);
  nodes[1].next = nullptr;
  lists.to_overflow(word(&nodes[2]), word(&nodes[3]));
  lists.to_overflow(word(&nodes[0]), word(&nodes[1]));
  EXPECT_EQ(as_node(lists.overflow_pop())->id, 0);
  EXPECT_EQ(ids_of(lists.overflow_take_all()), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(lists.overflow_pop(), 0);
}

// The lists' part of fork: in the child every list the parent had is there
// and usable (its lockers free), and a lock the forking thread's own frame
// held stays held in both processes, with its list untouched.
TEST(CpuListsTest, ForkKeepsEveryListAndTheForkingFramesLock) {
  if (fence_missing()) GTEST_SKIP() << "sections run and membarrier cannot fence: no lock";
  cpu_lists lists;
  const int count = lists.count();
  std::vector<std::vector<node>> per_cpu(count, std::vector<node>(2));
  ASSERT_TRUE(fill_every_cpu_list(lists, per_cpu));
  const int held_cpu = count - 1;
  std::intptr_t held = 0;
  ASSERT_EQ(lock_slot(lists.slot_of(held_cpu), held_cpu, &held), lock_result::acquired);
  lists.before_fork();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    lists.after_fork(true);
    int nodes = 0;
    lists.drain(
        kListLockTries, [&](std::intptr_t head) { nodes += ids_of(head).size(); },
        [](std::intptr_t) {});
    const bool held_kept = lists.head_of(held_cpu) == kSlotLocked;
    unlock_slot(lists.slot_of(held_cpu), held);
    lists.drain(
        kListLockTries, [&](std::intptr_t head) { nodes += ids_of(head).size(); },
        [](std::intptr_t) {});
    _exit(nodes == 2 * count && held_kept ? 0 : 1);
  }
  lists.after_fork(false);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child lost nodes, or the forking frame's lock";
  EXPECT_EQ(lists.head_of(held_cpu), kSlotLocked);
  unlock_slot(lists.slot_of(held_cpu), held);
  EXPECT_EQ(ids_of(lists.head_of(held_cpu)), (std::vector<int>{0, 1}));
}

// The started hot paths test only the started area's cpu_id before their
// section (cpu_slots.hpp, "The started form"), so the test seam that sends a thread to the locked
// path must make the thread's sections abort: while it is on, a started push
// never commits, whatever the mode, and cpu_id() still answers right; once it
// is off again, the thread's sections run as before.
TEST(CpuListsTest, AThreadSentToTheLockedPathNeverCommitsAStartedSection) {
  const std::vector<int> cpus = stress::test_cpus(1);
  ASSERT_FALSE(cpus.empty());
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({cpus[0]}));
  cpu_lists lists;
  node n{nullptr, 7};
  const bool had_sections = sections_status() == sections::on;
  force_locked_path_for_this_thread(true);
  EXPECT_FALSE(lists.push_started(&n, &n)) << "a started push committed on the locked path";
  std::intptr_t popped = 0;
  EXPECT_FALSE(lists.pop_started(&popped));
  EXPECT_EQ(lists.head_of(cpus[0] % lists.count()), 0) << "the seam left a section able to commit";
  EXPECT_EQ(cpu_id(), cpus[0]) << "cpu_id() with the registration paused";
  force_locked_path_for_this_thread(false);
  EXPECT_EQ(cpu_id(), cpus[0]);
  if (!had_sections) return;
  // The registration is back: the first try may abort (the kernel fills the
  // area on the way back from the system call), a few cannot all.
  bool pushed = false;
  for (int tries = 0; tries < 100 && !pushed; ++tries) pushed = lists.push_started(&n, &n);
  ASSERT_TRUE(pushed) << "sections did not come back after the seam";
  EXPECT_EQ(lists.head_of(cpus[0] % lists.count()), word(&n));
  bool popped_back = false;
  for (int tries = 0; tries < 100 && !popped_back; ++tries) {
    popped_back = lists.pop_started(&popped);
  }
  ASSERT_TRUE(popped_back);
  EXPECT_EQ(popped, word(&n));
}

// A pop section that aborts after it read the head (the x86-64 and aarch64
// pops store it to *load before their commit) and whose retry then finds
// the list locked did not pop: pop_home() must hand back nothing, since the
// node is still on the list, now the locker's. The abort comes exactly
// there: the node sits on a PROT_NONE page, so the section's load of its
// link faults, and the SIGSEGV's delivery aborts the section; the handler
// opens the page and locks the slot, as a remote locker whose fence aborted
// the section would.
cpu_lists* g_probe_lists = nullptr;
char* g_probe_page = nullptr;
long g_probe_page_size = 0;
int g_probe_cpu = -1;
std::intptr_t g_probe_taken = 0;
volatile sig_atomic_t g_probe_faults = 0;
volatile sig_atomic_t g_probe_locked = 0;

void on_probe_fault(int, siginfo_t* info, void*) {
  char* at = static_cast<char*>(info->si_addr);
  if (at < g_probe_page || at >= g_probe_page + g_probe_page_size) {
    signal(SIGSEGV, SIG_DFL);  // not the probe's: fault again, and die of it
    return;
  }
  g_probe_faults = g_probe_faults + 1;
  mprotect(g_probe_page, g_probe_page_size, PROT_READ | PROT_WRITE);
  g_probe_locked = lock_slot(g_probe_lists->slot_of(g_probe_cpu), g_probe_cpu, &g_probe_taken) ==
                   lock_result::acquired;
}

TEST(CpuListsTest, APopSectionAbortedAfterItReadTheHeadPopsNothing) {
  if (sections_status() != sections::on) GTEST_SKIP() << "no sections in this mode";
  if (fence_missing()) GTEST_SKIP() << "no fence: nobody may lock an owner's list";
  const std::vector<int> cpus = stress::test_cpus(1);
  ASSERT_FALSE(cpus.empty());
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({cpus[0]}));
  cpu_lists lists;
  rseq_area* area = section_area();
  ASSERT_NE(area, nullptr);
  g_probe_page_size = sysconf(_SC_PAGESIZE);
  void* mem = mmap(nullptr, static_cast<std::size_t>(g_probe_page_size), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  g_probe_page = static_cast<char*>(mem);
  node* n = static_cast<node*>(mem);
  n->next = nullptr;
  n->id = 1;
  ASSERT_TRUE(lists.push_home(area, word(n), word(n)));
  g_probe_cpu = cpus[0] % lists.count();
  ASSERT_EQ(lists.head_of(g_probe_cpu), word(n));
  g_probe_lists = &lists;
  g_probe_faults = 0;
  g_probe_locked = 0;
  g_probe_taken = 0;
  struct sigaction action = {};
  struct sigaction saved = {};
  action.sa_sigaction = on_probe_fault;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGSEGV, &action, &saved), 0);
  ASSERT_EQ(mprotect(mem, static_cast<std::size_t>(g_probe_page_size), PROT_NONE), 0);
  const std::intptr_t popped = lists.pop_home(area);
  sigaction(SIGSEGV, &saved, nullptr);
  mprotect(mem, static_cast<std::size_t>(g_probe_page_size), PROT_READ | PROT_WRITE);
  EXPECT_EQ(g_probe_faults, 1) << "the section's load of the link did not fault once";
  ASSERT_TRUE(g_probe_locked) << "the handler could not lock the slot";
  EXPECT_EQ(g_probe_taken, word(n)) << "the locker took the list with the node on it";
  EXPECT_EQ(popped, 0) << "pop_home() handed back the node the locker holds";
  unlock_slot(lists.slot_of(g_probe_cpu), 0);
  munmap(mem, static_cast<std::size_t>(g_probe_page_size));
}

// The lockers' Dekker without a mark by the thread (registration.hpp,
// g_section_users): in a fresh process, by the time a started section can
// commit, the section users count is already above zero. The probe below
// runs first thing in a new image of this binary (so that no earlier test
// has counted anything), in the mode this run was started in.
TEST(CpuListsFreshProcess, DISABLED_SectionUsersAreCountedBeforeAStartedSectionCommits) {
  // cpu_id() registers the thread where that is percpu's job, as a
  // program's first call would.
  (void)cpu_id();
  cpu_lists lists;
  node n{nullptr, 1};
  const bool counted = __atomic_load_n(&g_section_users, __ATOMIC_SEQ_CST) != 0;
  bool committed = false;
  for (int tries = 0; tries < 100 && !committed; ++tries) committed = lists.push_started(&n, &n);
  std::printf("probe: started push %s, section users %s\n", committed ? "committed" : "refused",
              counted ? "counted" : "not counted");
  EXPECT_TRUE(counted || !committed)
      << "a started section committed while no locker would fence for it";
  // Not vacuous where the started path can commit at all: the area the
  // sections' offset leads to is this thread's registered one.
  EXPECT_EQ(committed, sections_area_if_registered() != nullptr);
}

TEST(CpuListsTest, SectionUsersAreCountedBeforeAStartedSectionCommits) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl(program_invocation_name, program_invocation_name, "--gtest_also_run_disabled_tests",
          "--gtest_filter=CpuListsFreshProcess.DISABLED_"
          "SectionUsersAreCountedBeforeAStartedSectionCommits",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the fresh-process probe failed";
}

}  // namespace
}  // namespace internal
}  // namespace percpu
