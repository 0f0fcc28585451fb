// Tests for percpu::free_list: LIFO on one CPU, steals, take_all, the
// fence-free path of threads without rseq, refusal without membarrier, and
// the node multiset (nothing lost, nothing duplicated) with 12 threads on 2
// CPUs under oversubscription, affinity flipping, timer signals whose
// handlers pop and push, threads forced onto the locked path next to rseq
// threads, concurrent take_all, fork during heavy use and thread churn. The
// mode variants (.glibc, .own, .fallback) run all of it on each path.

#include "percpu/free_list.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "percpu/cpu.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "percpu/internal/thread_slots.hpp"
#include "tests/stress/stress.hpp"
#include "tests/support/address_limit.hpp"
#include "tests/support/pages.hpp"

namespace percpu {
namespace {

namespace stress = percpu::stress;

constexpr int kWorkers = 12;
constexpr int kItems = 4096;

// A node with an identity and a flag that catches a second holder at once.
struct item {
  free_list_node hook;
  int id;
  std::atomic<int> held;
};

std::atomic<long> g_duplicates{0};

item* as_item(free_list_node* node) { return reinterpret_cast<item*>(node); }

item* take(free_list& list, bool local_only = false) {
  free_list_node* node = local_only ? list.try_pop_local() : list.pop();
  if (node == nullptr) return nullptr;
  item* it = as_item(node);
  if (it->held.exchange(1) != 0) g_duplicates.fetch_add(1);
  return it;
}

void put(free_list& list, item* it) {
  it->held.store(0);
  list.push(&it->hook);
}

bool on_rseq() { return backend() == cpu_backend::rseq; }

// Whether this process runs rseq sections while membarrier's RSEQ fence is
// missing (Linux 4.18 to 5.9, a kernel without membarrier, a sandbox that
// refuses it: the .no_membarrier variants). free_list.hpp then keeps other
// CPUs' lists off limits to non-owners: steals are refused, and take_all()
// leaves every CPU's list where it is ("slots that cannot be fenced keep
// their nodes"). Asked afresh each time: the simulate_missing_membarrier()
// seam changes the answer.
bool fence_missing() {
  return on_rseq() && sections_status() == sections::on && !internal::slot_fence_available();
}

// Says which case a test checked, so a log shows which half ran.
void print_case(const char* test) {
  std::printf("%s: checked the case %s\n", test,
              fence_missing() ? "without the membarrier RSEQ fence (no steal, no remote take)"
                              : "with remote access (the fence, or no rseq sections)");
}

// Every node the list holds, as a chain: take_all(), and then, where the
// fence is missing and take_all() must leave the CPUs' lists alone, each
// allowed CPU's own list, popped locally by this thread pinned to that CPU.
// (No other thread may use the list meanwhile.) *from_take_all: how many
// came from take_all().
free_list_node* drain(free_list& list, long* from_take_all = nullptr) {
  free_list_node* first = list.take_all();
  free_list_node* last = first;
  long taken = 0;
  for (free_list_node* n = first; n != nullptr; n = n->next) {
    last = n;
    ++taken;
  }
  if (from_take_all != nullptr) *from_take_all = taken;
  if (!fence_missing()) return first;
  const std::vector<int> saved = stress::allowed_cpus();
  for (int cpu : saved) {
    if (!stress::restrict_to({cpu})) continue;
    while (free_list_node* n = list.try_pop_local()) {
      n->next = nullptr;
      if (last == nullptr) {
        first = n;
      } else {
        last->next = n;
      }
      last = n;
    }
  }
  stress::restrict_to(saved);
  return first;
}

// Drains the list (drain() above) and checks each of `items` came back
// exactly once. *from_take_all as for drain().
void expect_exactly(free_list& list, std::vector<item>& items, long* from_take_all = nullptr) {
  std::vector<int> seen(items.size(), 0);
  long count = 0;
  long taken = 0;
  for (free_list_node* n = drain(list, &taken); n != nullptr; n = n->next) {
    const int id = as_item(n)->id;
    ASSERT_GE(id, 0);
    ASSERT_LT(id, static_cast<int>(items.size()));
    ++seen[id];
    ++count;
  }
  if (fence_missing()) {
    std::printf("drained %ld nodes: %ld by take_all(), the rest popped on each CPU\n", count,
                taken);
  }
  if (from_take_all != nullptr) *from_take_all = taken;
  long missing = 0, doubled = 0;
  for (int s : seen) {
    if (s == 0) ++missing;
    if (s > 1) ++doubled;
  }
  EXPECT_EQ(count, static_cast<long>(items.size()));
  EXPECT_EQ(missing, 0) << "nodes lost";
  EXPECT_EQ(doubled, 0) << "nodes duplicated";
  EXPECT_EQ(g_duplicates.load(), 0) << "a node was held by two threads at once";
}

std::vector<item> make_items(free_list& list, int n) {
  std::vector<item> items(n);
  for (int i = 0; i < n; ++i) {
    items[i].id = i;
    items[i].held.store(0);
    list.push(&items[i].hook);
  }
  return items;
}

// make_items, with the pushes shared out over `cpus`, each share pushed while
// the thread runs there, so that every one of those CPUs' lists holds nodes.
// Without the membarrier RSEQ fence nothing moves a node off the CPU list it
// was pushed on: with every node on the list of the CPU the test started on,
// a run whose workers the scheduler kept on the other CPUs (a loaded
// machine) popped nothing at all. Leaves the thread restricted to `cpus`.
std::vector<item> make_items_on(free_list& list, int n, const std::vector<int>& cpus) {
  std::vector<item> items(n);
  const int shares = static_cast<int>(cpus.size());
  for (int c = 0; c < shares; ++c) {
    EXPECT_TRUE(stress::restrict_to({cpus[c]}));
    for (int i = c; i < n; i += shares) {
      items[i].id = i;
      items[i].held.store(0);
      list.push(&items[i].hook);
    }
  }
  EXPECT_TRUE(stress::restrict_to(cpus));
  return items;
}

// Where a list's thread slots are (thread index 0's copy; nullptr where
// thread slots are not usable) and its CPUs' slots (CPU 0's copy), read
// without a seam in the library: an explicit instantiation may name a
// private member ([temp.spec.general]), and the friend it defines hands the
// pointer out.
const internal::cpu_lists& lists_of(const free_list& l);
template <auto Lists>
struct expose_free_list_lists {
  friend const internal::cpu_lists& lists_of(const free_list& l) { return l.*Lists; }
};
template struct expose_free_list_lists<&free_list::lists_>;
const void* thread_words(const free_list& l) { return lists_of(l).thread_words(); }
const void* cpu_words(const free_list& l) { return lists_of(l).cpu_words(); }

// Forks; the child pushes and pops on every 97th of the n lists, and must
// get its own node back from each.
void expect_lists_work_in_a_child(free_list* lists, free_list_node* nodes, long n) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (long i = 0; i < n; i += 97) {
      lists[i].push(&nodes[i]);
      if (lists[i].pop() != &nodes[i]) _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child's lists failed";
}

// Where `words` keeps each of n lists' words.
std::set<std::uintptr_t> pages_of(const free_list* lists, long n,
                                  const void* (*words)(const free_list&)) {
  std::vector<const void*> where;
  for (long i = 0; i < n; ++i) where.push_back(words(lists[i]));
  return test::pages_holding(where);
}

// Memory per instance (free_list.hpp, "Memory"): 100,000 lists, each
// pushed and popped once by this thread, kept on one CPU, take:
//   - of the CPUs' slots, that CPU's one (32 bytes, and only with rseq):
//     the other CPUs' copies keep no page, where each list kept 64 bytes
//     for every possible CPU before;
//   - of the threads' slots, this thread's one (32 bytes, and only without
//     rseq), not the 8 KiB for every thread index each took before.
// Counted with mincore over every copy, before anything reads them (a read
// maps the zero page, which mincore counts). Then a fork() fills none of
// the other CPUs' copies (it waits for the lockers reading only; the
// resident anonymous memory of the lists' mappings, which the zero page is
// not, stays where it was), and the child's lists work.
TEST(FreeListTest, AHundredThousandListsTakeBytesEachAndForkFillsNoPage) {
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  constexpr long kLists = 100000;
  std::unique_ptr<free_list[]> lists(new free_list[kLists]);
  std::unique_ptr<free_list_node[]> nodes(new free_list_node[kLists]);
  for (long i = 0; i < kLists; ++i) {
    lists[i].push(&nodes[i]);
    ASSERT_EQ(lists[i].pop(), &nodes[i]) << "list " << i;
  }
  const long page = sysconf(_SC_PAGESIZE);
  const long cpu_present =
      test::present_stride_pages(pages_of(lists.get(), kLists, cpu_words), max_cpus());
  const long thread_present = test::present_stride_pages(
      pages_of(lists.get(), kLists, thread_words), internal::kThreadSlots);
  ASSERT_GE(cpu_present, 0);
  ASSERT_GE(thread_present, 0);
  const double per_list_cpus = static_cast<double>(cpu_present * page) / kLists;
  const double per_list_threads = static_cast<double>(thread_present * page) / kLists;
  std::printf(
      "%ld lists, each used once by one thread on one CPU: %.1f bytes of CPU slots and %.1f of "
      "thread slots each (this thread %s rseq; %d possible CPUs), plus %zu bytes of the list\n",
      kLists, per_list_cpus, per_list_threads,
      internal::section_area() != nullptr ? "with" : "without", max_cpus(), sizeof(free_list));
  // One slot each; the chunks' headers (CPU 0's first page of each chunk)
  // and partly used pages: 8 more.
  EXPECT_LE(per_list_cpus, static_cast<double>(internal::cpu_lists::slot_bytes()) + 8.0)
      << "more than one CPU's slot per list";
  EXPECT_LE(per_list_threads, 32.0 + 8) << "more than one thread's slot per list";

  // The lists' chunks of per-CPU memory alone: a sanitizer's shadow of the
  // fork's reads (TSan) is not the lists' memory.
  const std::set<std::uintptr_t> cpu_pages = pages_of(lists.get(), kLists, cpu_words);
  const long before = test::anonymous_bytes_of_mappings(cpu_pages);
  ASSERT_GT(before, 0);
  expect_lists_work_in_a_child(lists.get(), nodes.get(), kLists);
  const long grown = test::anonymous_bytes_of_mappings(cpu_pages) - before;
  std::printf("fork(): the lists' per-CPU memory grew by %ld bytes in the parent\n", grown);
  // A fork that wrote every list's locker on another CPU would fill
  // kLists * 32 bytes there.
  EXPECT_LT(grown, kLists * static_cast<long>(internal::cpu_lists::slot_bytes()) / 4)
      << "fork() filled pages of the CPUs' slots";
}

// fork() writes nothing to the threads' slots (thread_slots.hpp, "Fork"):
// the pages behind 10,000 lists' slots are the same after a fork as
// before, where revoking every index's slot of every list would fill a
// page per index for every 128 lists. The child checks its lists work.
// Kept on one CPU, as the test above: a pop on another CPU than its push
// finds nothing where no membarrier fence allows a steal.
TEST(FreeListTest, ForkWritesNoThreadSlot) {
  const stress::affinity_guard restore;
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  constexpr long kLists = 10000;
  std::unique_ptr<free_list[]> lists(new free_list[kLists]);
  std::unique_ptr<free_list_node[]> nodes(new free_list_node[kLists]);
  for (long i = 0; i < kLists; ++i) {
    lists[i].push(&nodes[i]);
    ASSERT_EQ(lists[i].pop(), &nodes[i]) << "list " << i;
  }
  const std::set<std::uintptr_t> pages = pages_of(lists.get(), kLists, thread_words);
  if (!internal::thread_slots_usable()) {
    // Without membarrier there are no thread slots for a fork to touch.
    EXPECT_TRUE(pages.empty());
    return;
  }
  ASSERT_FALSE(pages.empty());
  const long before = test::present_stride_pages(pages, internal::kThreadSlots);
  expect_lists_work_in_a_child(lists.get(), nodes.get(), kLists);
  const long after = test::present_stride_pages(pages, internal::kThreadSlots);
  EXPECT_EQ(after, before) << "fork() filled pages of the threads' slots";
}

// "throws std::bad_alloc when no memory can be mapped for it": lists are
// made, in a child whose address space is limited to what it has mapped,
// until one throws; it throws std::bad_alloc, and the list made before it
// still pushes and pops.
TEST(FreeListTest, TheConstructorThrowsBadAllocWhenNoMemoryCanBeMapped) {
  if (const char* why = test::why_no_address_limit()) GTEST_SKIP() << why;
  free_list_node node;
  // More lists than a chunk of the arena's 32-byte class and the objects
  // earlier tests gave back.
  const int status = test::run_until_bad_alloc<free_list>(
      262144, [](void* where) { return new (where) free_list; },
      [&](free_list* last) {
        if (last == nullptr) return 0;  // the first one found no memory
        last->push(&node);
        return last->pop() == &node ? 0 : 5;
      });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  if (WEXITSTATUS(status) == test::kLimitNotEnforced) {
    GTEST_SKIP() << "RLIMIT_AS is not enforced here (qemu-user ignores it)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0) << "98: setrlimit failed, 3: no constructor threw, 4: one "
                                       "threw something else, 5: the last list made lost a node";
}

TEST(FreeListTest, EmptyPopsNothingAndSlotsAreMaxCpus) {
  free_list list;
  EXPECT_EQ(list.slot_count(), max_cpus());
  EXPECT_EQ(list.pop(), nullptr);
  EXPECT_EQ(list.try_pop_local(), nullptr);
  EXPECT_EQ(list.take_all(), nullptr);
}

TEST(FreeListTest, LifoOnOneCpu) {
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to({stress::test_cpus(1)[0]}));
  free_list list;
  free_list_node a, b, c;
  list.push(&a);
  list.push(&b);
  list.push(&c);
  EXPECT_EQ(list.try_pop_local(), &c);
  EXPECT_EQ(list.pop(), &b);
  EXPECT_EQ(list.pop(), &a);
  EXPECT_EQ(list.pop(), nullptr);
  stress::restrict_to(saved);
}

TEST(FreeListTest, PopStealsFromAnotherCpu) {
  const std::vector<int> cpus = stress::test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "a steal needs two CPUs; this process may use one";
  const stress::affinity_guard restore;
  const std::vector<int> saved = stress::allowed_cpus();
  free_list list;
  // Another thread pushes: without rseq a thread's pushes go to a list of
  // its own, so only another thread's nodes need a steal.
  std::vector<item> items;
  std::thread pusher([&] {
    ASSERT_TRUE(stress::restrict_to({cpus[0]}));
    items = make_items(list, 40);
  });
  pusher.join();
  ASSERT_EQ(items.size(), 40u);
  ASSERT_TRUE(stress::restrict_to({cpus[1]}));
  const unsigned long fences_before = internal::fence_count();
  if (backend() != cpu_backend::syscall) {
    EXPECT_EQ(list.try_pop_local(), nullptr) << "nothing was pushed on this CPU";
  } else if (item* early = take(list, true)) {
    // The system-call fallback is asked only every so many operations, so
    // this thread may still try the list of the CPU it ran on before.
    put(list, early);
  }
  print_case("PopStealsFromAnotherCpu");
  if (fence_missing()) {
    // free_list.hpp: with sections running and no fence, other CPUs' lists
    // are never touched by non-owners, so there is nothing to steal.
    EXPECT_EQ(take(list), nullptr) << "a steal that cannot be fenced must be refused";
    EXPECT_EQ(list.take_all(), nullptr) << "take_all() must leave unfenceable lists alone";
    EXPECT_EQ(internal::fence_count(), fences_before) << "there is no fence to issue";
    stress::restrict_to(saved);
    expect_exactly(list, items);
    return;
  }
  item* first = take(list);
  ASSERT_NE(first, nullptr) << "pop must steal from the other CPU";
  // The steal moved a batch here, so the next pops are local.
  item* second = take(list, true);
  EXPECT_NE(second, nullptr) << "a steal brings a batch to the stealer's CPU";
  if (on_rseq()) {
    EXPECT_GT(internal::fence_count(), fences_before) << "a steal under rseq must fence";
  } else if (internal::thread_slots_usable()) {
    EXPECT_GT(internal::fence_count(), fences_before)
        << "a steal from another thread's own list must revoke it with a barrier";
  } else {
    EXPECT_EQ(internal::fence_count(), fences_before)
        << "with no rseq in the process, the locked path needs no membarrier";
  }
  put(list, first);
  if (second != nullptr) put(list, second);
  stress::restrict_to(saved);
  expect_exactly(list, items);
}

TEST(FreeListTest, StealsAreRefusedWithoutMembarrierWhileSectionsRun) {
  const std::vector<int> cpus = stress::test_cpus(2);
  if (cpus.size() < 2) GTEST_SKIP() << "a steal needs two CPUs; this process may use one";
  const stress::affinity_guard restore;
  const std::vector<int> saved = stress::allowed_cpus();
  free_list list;
  ASSERT_TRUE(stress::restrict_to({cpus[0]}));
  std::vector<item> items = make_items(list, 8);
  internal::simulate_missing_membarrier(true);
  ASSERT_TRUE(stress::restrict_to({cpus[1]}));
  item* got = take(list);
  print_case("StealsAreRefusedWithoutMembarrierWhileSectionsRun (with the seam on)");
  if (on_rseq()) {
    EXPECT_EQ(got, nullptr) << "a steal that cannot be fenced must be refused";
    EXPECT_FALSE(internal::remote_access_possible());
  } else {
    EXPECT_NE(got, nullptr) << "with no rseq in the process, no fence is needed";
    EXPECT_TRUE(internal::remote_access_possible());
  }
  if (got != nullptr) put(list, got);
  internal::simulate_missing_membarrier(false);
  stress::restrict_to(saved);
  expect_exactly(list, items);
}

TEST(FreeListTest, TakeAllGetsEveryCpuAndTheOverflow) {
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  free_list list;
  std::vector<item> items(30);
  for (int i = 0; i < 30; ++i) {
    items[i].id = i;
    ASSERT_TRUE(stress::restrict_to({cpus[i % cpus.size()]}));
    list.push(&items[i].hook);
  }
  stress::restrict_to(saved);
  print_case("TakeAllGetsEveryCpuAndTheOverflow");
  long from_take_all = 0;
  expect_exactly(list, items, &from_take_all);
  if (fence_missing()) {
    // Every push above was an owner's, onto its CPU's list, which take_all()
    // cannot fence: each node stays there for the CPU's own pops.
    EXPECT_EQ(from_take_all, 0) << "take_all() took from a list it cannot fence";
  }
  EXPECT_EQ(list.pop(), nullptr);
}

// ---- stress ------------------------------------------------------------------

constexpr int kSignal = SIGUSR2;
free_list* g_signal_list = nullptr;
std::atomic<long> g_handler_runs{0};

void on_signal(int) {
  if (free_list* list = g_signal_list) {
    const long n = g_handler_runs.fetch_add(1, std::memory_order_relaxed);
    item* a = take(*list, n % 4 == 0);
    item* b = take(*list);
    if (b != nullptr) put(*list, b);
    if (a != nullptr) put(*list, a);
  }
}

struct run_options {
  bool flip_affinity = false;
  bool signals = false;
  bool mixed = false;     // a third of the workers take the locked path
  bool take_all = false;  // a thread drains and refills the list all along
  std::chrono::milliseconds length{500};
};

void hammer(const run_options& options) {
  g_duplicates.store(0);
  free_list list;
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  std::vector<item> items = make_items_on(list, kItems, cpus);
  ASSERT_TRUE(stress::restrict_to(cpus));
  if (options.signals) {
    g_handler_runs.store(0);
    g_signal_list = &list;
    stress::install_handler(kSignal, on_signal);
  }
  const unsigned long fences_before = internal::fence_count();
  std::atomic<long> cycles{0};
  std::atomic<long> drains{0};
  std::atomic<long> pops{0}, empty_pops{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      if (options.mixed && w % 3 == 0) internal::force_locked_path_for_this_thread(true);
      std::unique_ptr<stress::thread_signal_timer> timer;
      if (options.signals) timer.reset(new stress::thread_signal_timer(kSignal, 10000));
      item* held[8];
      long mine = 0, got = 0, nulls = 0;
      while (!stop) {
        const int want = 1 + (w + static_cast<int>(mine)) % 8;
        int n = 0;
        while (n < want) {
          item* it = take(list);
          if (it == nullptr) {
            ++nulls;
            break;
          }
          held[n++] = it;
        }
        got += n;
        for (int i = 0; i < n; ++i) put(list, held[(mine & 1) != 0 ? i : n - 1 - i]);
        ++mine;
      }
      internal::force_locked_path_for_this_thread(false);
      cycles.fetch_add(mine);
      pops.fetch_add(got);
      empty_pops.fetch_add(nulls);
    });
    std::unique_ptr<stress::affinity_flipper> flipper;
    if (options.flip_affinity) {
      flipper.reset(new stress::affinity_flipper(workers, cpus, std::chrono::microseconds(300)));
    }
    std::atomic<bool> stop_drain{false};
    std::thread drainer;
    if (options.take_all) {
      drainer = std::thread([&] {
        while (!stop_drain.load()) {
          std::vector<item*> got;
          for (free_list_node* n = list.take_all(); n != nullptr;) {
            free_list_node* next = n->next;
            item* it = as_item(n);
            if (it->held.exchange(1) != 0) g_duplicates.fetch_add(1);
            got.push_back(it);
            n = next;
          }
          for (item* it : got) put(list, it);
          drains.fetch_add(1);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      });
    }
    stress::sleep_scaled(options.length);
    if (flipper) {
      // A starved flipper thread (a loaded machine) may not have run yet:
      // the run is extended until it has moved a worker at least once, with
      // two minutes as the limit, so only a flipper that cannot flip fails.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (flipper->flips() == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      flipper->stop();
      std::printf("affinity flips: %ld\n", flipper->flips());
      EXPECT_GT(flipper->flips(), 0) << "no worker was ever moved";
    }
    if (drainer.joinable()) {
      // Likewise a starved drainer (seen in emulated VMs on a loaded host):
      // the run goes on until it has drained once, with the same limit.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (drains.load() == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      stop_drain.store(true);
      drainer.join();
      std::printf("take_all rounds: %ld\n", drains.load());
      EXPECT_GT(drains.load(), 0);
    }
    workers.stop_and_join();
  }
  if (options.signals) {
    g_signal_list = nullptr;
    std::printf("signal handlers ran %ld times\n", g_handler_runs.load());
    EXPECT_GT(g_handler_runs.load(), 0) << "no timer signal reached a worker";
  }
  // pop() may return nullptr while nodes are in a locked slot or a steal
  // (free_list.hpp), so empty pops are counted and shown, not bounded; but a
  // run in which no pop found a node checked nothing.
  std::printf("worker cycles: %ld, nodes popped: %ld, empty pops: %ld, membarrier fences: %lu\n",
              cycles.load(), pops.load(), empty_pops.load(),
              internal::fence_count() - fences_before);
  EXPECT_GT(cycles.load(), 0);
  EXPECT_GT(pops.load(), 0) << "every pop came back empty";
  if (options.mixed && on_rseq()) {
    if (fence_missing()) {
      std::printf("locked-path threads next to rseq threads: checked that nothing fenced "
                  "(no membarrier RSEQ fence)\n");
      EXPECT_EQ(internal::fence_count(), fences_before)
          << "without the membarrier RSEQ fence nothing may fence";
    } else {
      std::printf("locked-path threads next to rseq threads: checked that they fenced\n");
      EXPECT_GT(internal::fence_count(), fences_before)
          << "locked-path threads next to rseq threads must fence";
    }
  }
  if (!on_rseq() && internal::thread_slots_usable()) {
    // Steals from threads' own lists (and take_all) revoke them with a
    // barrier; the operations themselves never fence.
    EXPECT_LT(internal::fence_count() - fences_before, static_cast<unsigned long>(cycles.load()))
        << "without rseq, no operation may need a fence";
  } else if (!on_rseq()) {
    EXPECT_EQ(internal::fence_count(), fences_before)
        << "with no rseq in the process, nothing needs a fence";
  }
  stress::restrict_to(saved);
  expect_exactly(list, items);
  if (options.signals) stress::restore_default(kSignal);
}

TEST(FreeListStressTest, Oversubscribed) { hammer({}); }

TEST(FreeListStressTest, AffinityFlipping) {
  run_options options;
  options.flip_affinity = true;
  hammer(options);
}

TEST(FreeListStressTest, TimerSignalsPopAndPushToo) {
  run_options options;
  options.signals = true;
  hammer(options);
}

TEST(FreeListStressTest, LockedPathThreadsNextToRseqThreads) {
  run_options options;
  options.mixed = true;
  options.flip_affinity = true;
  hammer(options);
}

TEST(FreeListStressTest, TakeAllWhileInUse) {
  run_options options;
  options.take_all = true;
  options.flip_affinity = true;
  hammer(options);
}

TEST(FreeListStressTest, EverythingAtOnce) {
  run_options options;
  options.take_all = true;
  options.flip_affinity = true;
  options.signals = true;
  options.mixed = true;
  hammer(options);
}

TEST(FreeListStressTest, ThreadChurn) {
  g_duplicates.store(0);
  free_list list;
  const std::vector<int> saved = stress::allowed_cpus();
  // On both CPUs' lists (make_items_on): without the membarrier RSEQ fence
  // no pop steals, and short-lived threads the scheduler kept on one CPU
  // found every node on the other.
  std::vector<item> items = make_items_on(list, 512, stress::test_cpus(2));
  std::atomic<long> pops{0};
  stress::churn(stress::scaled(600L), kWorkers, [&](long n) {
    item* held[4];
    for (int round = 0; round < 200; ++round) {
      int got = 0;
      for (int i = 0; i < 1 + static_cast<int>(n % 4); ++i) {
        if (item* it = take(list)) held[got++] = it;
      }
      pops.fetch_add(got, std::memory_order_relaxed);
      for (int i = 0; i < got; ++i) put(list, held[i]);
    }
  });
  stress::restrict_to(saved);
  std::printf("nodes popped: %ld\n", pops.load());
  EXPECT_GT(pops.load(), 0) << "every pop came back empty";
  expect_exactly(list, items);
}

// The parent's workers keep popping and pushing while the main thread forks.
// Each child checks that its copy holds no node twice and no node flagged as
// held, then runs its own threads on it and must get back exactly its nodes.
TEST(FreeListStressTest, ForkDuringHeavyUse) {
  g_duplicates.store(0);
  free_list list;
  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  std::vector<item> items = make_items_on(list, kItems, cpus);
  ASSERT_TRUE(stress::restrict_to(cpus));
  int children = 0;
  {
    stress::worker_group workers(kWorkers, [&](int, const stress::stop_flag& stop) {
      while (!stop) {
        item* a = take(list);
        item* b = take(list);
        if (b != nullptr) put(list, b);
        if (a != nullptr) put(list, a);
      }
    });
    const auto until =
        std::chrono::steady_clock::now() + stress::scaled(std::chrono::milliseconds(500));
    while (std::chrono::steady_clock::now() < until) {
      const int status = stress::run_in_child(
          [&list, &items] {
            std::vector<char> seen(items.size(), 0);
            std::vector<item*> mine;
            for (free_list_node* n = drain(list); n != nullptr; n = n->next) {
              item* it = as_item(n);
              if (seen[it->id]++ != 0 || it->held.load() != 0) {
                std::fprintf(stderr, "child: node %d listed twice or while held\n", it->id);
                return 1;
              }
              mine.push_back(it);
            }
            // Each parent worker holds at most two nodes, or a steal batch in transit.
            if (mine.size() + kWorkers * 18 < items.size()) {
              std::fprintf(stderr, "child: only %zu of %zu nodes listed\n", mine.size(),
                           items.size());
              return 1;
            }
            if (fence_missing()) {
              // Nothing is stolen without the fence: each allowed CPU gets a
              // share, so the threads below find nodes wherever they run.
              const std::vector<int> allowed = stress::allowed_cpus();
              for (std::size_t i = 0; i < mine.size(); ++i) {
                if (i % (mine.size() / allowed.size() + 1) == 0) {
                  stress::restrict_to({allowed[i / (mine.size() / allowed.size() + 1)]});
                }
                put(list, mine[i]);
              }
              stress::restrict_to(allowed);
            } else {
              for (item* it : mine) put(list, it);
            }
            std::atomic<long> popped{0};
            std::vector<std::thread> threads;
            for (int t = 0; t < 4; ++t) {
              threads.emplace_back([&list, &popped] {
                for (int i = 0; i < 20000; ++i) {
                  item* a = take(list);
                  if (a != nullptr) {
                    popped.fetch_add(1, std::memory_order_relaxed);
                    put(list, a);
                  }
                }
              });
            }
            for (std::thread& t : threads) t.join();
            if (popped.load() == 0) {
              std::fprintf(stderr, "child: every pop came back empty\n");
              return 1;
            }
            std::size_t back = 0;
            for (free_list_node* n = drain(list); n != nullptr; n = n->next) ++back;
            if (back != mine.size() || g_duplicates.load() != 0) {
              std::fprintf(stderr, "child: %zu nodes back of %zu\n", back, mine.size());
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
  print_case("ForkDuringHeavyUse");
  std::printf("forked %d children\n", children);
  EXPECT_GT(children, 0);
  expect_exactly(list, items);
}

}  // namespace
}  // namespace percpu
