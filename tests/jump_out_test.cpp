// Operations left by a jump out of a signal handler (siglongjmp, as
// interpreters' SIGSEGV handlers do) or by pthread_exit() in a handler. Such
// an operation may leave a lock of a structure held for ever (the headers'
// signal sections); what percpu promises is that fork(), trim(), take_all()
// and ref::kill() never wait for it: a lock held by the calling thread's own
// left frames is skipped at fork(), and one held by a thread that exited is
// reported (one line; debug builds then abort) instead of waited for.
//
// Each case runs in a child process with a time limit (the watchdog: a hang
// fails the case within seconds): a thread runs free_list push/pop and
// object_pool allocate/free, on the rseq path and the locked path, under a
// fast timer signal whose handler jumps out (or exits the thread) whenever
// it lands inside one of percpu's locked slow paths, many times; then the
// process trims, takes all and forks, and the fork's child must run and
// exit. The mode variants (.glibc, .own, .fallback) run each case on each
// path. A counter's add(), which holds nothing, is left the same way and
// must have counted whole or not at all.

#include <gtest/gtest.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/free_list.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "percpu/object_pool.hpp"
#include "percpu/per_cpu.hpp"
#include "percpu/ref.hpp"
#include "tests/stress/stress.hpp"

namespace percpu {
namespace {

namespace stress = percpu::stress;

constexpr int kSignal = SIGUSR2;
constexpr long kHeldJumpsWanted = 40;

enum class leave { jump, pthread_exit };

__thread sigjmp_buf* t_env;
__thread volatile sig_atomic_t t_armed;
__thread leave t_leave;
std::atomic<long> g_jumps{0};
std::atomic<long> g_held_jumps{0};

void on_signal(int) {
  if (t_armed == 0) return;
  const bool held = internal::flags_held() > 0;
  if (held) g_held_jumps.fetch_add(1);
  g_jumps.fetch_add(1);
  t_armed = 0;
  if (t_leave == leave::pthread_exit && held) pthread_exit(nullptr);
  siglongjmp(*t_env, 1);
}

// Nodes and objects a left operation took with it are lost, never reused:
// the nodes live as long as the process.
// Each node is pushed once only (a second push of a node still listed
// would link it twice), by whichever thread takes the next index.
free_list_node g_nodes[4096];
std::atomic<std::size_t> g_next_node{0};

// Runs push/pop and allocate/free under a timer signal whose handler leaves
// the operation, until kHeldJumpsWanted of the jumps left a locked slow path
// (or a few seconds passed); with `r`, only get/put on it (which hold no
// lock: a thread without rseq is then inside its own word), until `wanted`
// jumps.
void jump_out_many_times(free_list& list, object_pool& pool, ref* r, leave how, long wanted) {
  sigjmp_buf env;
  t_env = &env;
  t_leave = how;
  stress::thread_signal_timer timer(kSignal, 20000);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  for (long round = 0; (r != nullptr ? g_jumps.load() : g_held_jumps.load()) < wanted &&
                       std::chrono::steady_clock::now() < until;
       ++round) {
    // The locked path every other round, so that rseq threads take the
    // slot locks too, not only the depot's and the steals'.
    internal::force_locked_path_for_this_thread(round % 2 == 1);
    if (sigsetjmp(env, 1) == 0) {
      t_armed = 1;
      for (int i = 0; i < 64 && r == nullptr; ++i) {
        const std::size_t next = g_next_node.fetch_add(1);
        if (next < sizeof(g_nodes) / sizeof(g_nodes[0])) list.push(&g_nodes[next]);
        if (free_list_node* n = list.pop()) list.push(n);
        void* objects[4];
        for (void*& p : objects) p = pool.allocate();
        for (void* p : objects) pool.deallocate(p);
      }
      for (int i = 0; i < 64 && r != nullptr; ++i) {
        r->get();
        r->put();
      }
      t_armed = 0;
    }
  }
  t_armed = 0;
  internal::force_locked_path_for_this_thread(false);
}

// What the process does after the jumps: the remote operations and fork.
// The fork's child uses every structure and exits 0.
int use_after(free_list& list, object_pool& pool, ref* r) {
  if (r != nullptr) r->kill();
  (void)pool.trim();
  for (free_list_node* n = list.take_all(); n != nullptr;) {
    free_list_node* next = n->next;
    list.push(n);
    n = next;
  }
  const int child = stress::run_in_child(
      [&] {
        for (int i = 0; i < 100; ++i) {
          void* p = pool.allocate();  // may be nullptr: a lock was left held
          pool.deallocate(p);
          if (free_list_node* n = list.pop()) list.push(n);
        }
        (void)pool.trim();
        (void)list.take_all();
        return 0;
      },
      std::chrono::seconds(10));
  if (child != 0) return 30 + (child > 60 ? 60 : child);
  return 0;
}

enum class who { this_thread, exited_thread };

// In a child process whose stderr goes to a file: 0 when everything came
// back; 5 when too few jumps left a locked path to test anything. With
// `with_ref`, the thread uses only the ref, and kill() comes first.
int scenario(who where, leave how, bool with_ref) {
  free_list list;
  object_pool::options o;
  o.object_size = 64;
  o.cache_capacity = 2;
  o.batch = 1;
  object_pool pool(o);
  // Never destroyed: a left get() may have counted, and the destructor's
  // debug check would call that a leak.
  ref* rp = with_ref ? new ref(nullptr) : nullptr;
  stress::install_handler(kSignal, on_signal);
  if (where == who::this_thread) {
    jump_out_many_times(list, pool, rp, how, kHeldJumpsWanted);
  } else if (how == leave::jump) {
    const long wanted = with_ref ? 300 : kHeldJumpsWanted;
    std::thread([&] { jump_out_many_times(list, pool, rp, how, wanted); }).join();
  } else {
    // glibc loads the unwinder (libgcc_s) at a process's first
    // pthread_exit(): do that here, outside a handler, so the handlers'
    // exits do not map a library in a signal handler.
    std::thread([] { pthread_exit(nullptr); }).join();
    // Each thread exits at its first signal inside a locked path.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
    while (g_held_jumps.load() < 4 && std::chrono::steady_clock::now() < until) {
      std::thread([&] {
        jump_out_many_times(list, pool, rp, how, g_held_jumps.load() + 1);
      }).join();
    }
  }
  std::fprintf(stderr, "jumps %ld, out of locked paths %ld\n", g_jumps.load(), g_held_jumps.load());
  // A ref's get() and put() hold no lock: count every jump there; each
  // pthread_exit() ends a thread, so a few are enough.
  const long enough = how == leave::pthread_exit ? 1 : kHeldJumpsWanted / 4;
  if ((with_ref ? g_jumps.load() : g_held_jumps.load()) < enough) return 5;
  return use_after(list, pool, rp);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs scenario() in a child with a 30 s limit. A report is the contract
// only where a lock was left by a thread that is gone, and aborts only in
// debug builds.
void expect_no_hang(who where, leave how, bool with_ref) {
  char path[] = "/tmp/percpu_jump_out_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const int status = stress::run_in_child(
      [&] {
        dup2(fd, STDERR_FILENO);
        return scenario(where, how, with_ref);
      },
      std::chrono::seconds(30));
  close(fd);
  const std::string err = read_all(path);
  unlink(path);
  const bool reported = err.find("was abandoned") != std::string::npos;
  if (status == 5) GTEST_SKIP() << "too few signals landed in a locked path: " << err;
  if (where == who::this_thread) {
    // Nothing is reported: the forking thread's own left locks are skipped.
    EXPECT_EQ(status, 0) << err;
    EXPECT_FALSE(reported) << err;
    return;
  }
  // pthread_exit() unwinds the interrupted operation's frame, which is
  // noexcept: where the compiler put a terminate handler there, C++ ends
  // the process (the headers say so). Never a hang.
  if (how == leave::pthread_exit && status == 128 + SIGABRT &&
      err.find("terminate called") != std::string::npos) {
    std::printf("std::terminate in the unwind of a noexcept frame: %s\n", err.c_str());
    return;
  }
  // Found by its thread being gone, at once, not after the stuck bound.
  if (reported) {
    EXPECT_NE(err.find("(its thread has exited)"), std::string::npos) << err;
  }
#ifdef NDEBUG
  EXPECT_EQ(status, 0) << err;
#else
  if (status != 0) {
    EXPECT_EQ(status, 128 + SIGABRT) << err;
    EXPECT_TRUE(reported) << "aborted without the report:\n" << err;
  }
#endif
  std::printf("status %d: %s\n", status, err.c_str());
}

TEST(JumpOutTest, ForkAfterTheForkingThreadLeftOperations) {
  expect_no_hang(who::this_thread, leave::jump, false);
}

TEST(JumpOutTest, TrimAndForkAfterAThreadLeftOperationsAndExited) {
  expect_no_hang(who::exited_thread, leave::jump, false);
}

TEST(JumpOutTest, TrimAndForkAfterPthreadExitInAHandler) {
  expect_no_hang(who::exited_thread, leave::pthread_exit, false);
}

TEST(JumpOutTest, KillAfterAThreadLeftGetAndPut) {
  expect_no_hang(who::exited_thread, leave::jump, true);
}

// counter.hpp: "An add() that a signal handler leaves with siglongjmp ...
// either counted or did not: it is one committing store or one atomic add,
// and holds nothing"; per_cpu.hpp: "An update that a signal handler leaves
// with siglongjmp either happened or did not." A thread adds a large odd
// step under a fast timer whose handler jumps out, on the rseq path and the
// atomic one in turn; it counts the adds that returned. The total must be
// a whole number of steps, at least the adds that returned and at most one
// more per jump (each jump leaves at most one add, which counted or not).
// Then another thread and a forked child add as usual: nothing was left
// held. In a child process with a watchdog. add(step) adds, total() reads.
constexpr std::int64_t kLeftStep = (std::int64_t{1} << 20) + 1;

template <typename Add, typename Total>
int adds_left_by_jumps(Add add, Total total) {
  return stress::run_in_child(
      [&] {
        stress::install_handler(kSignal, on_signal);
        sigjmp_buf env;
        t_env = &env;
        t_leave = leave::jump;
        volatile long returned = 0;
        volatile long round = 0;
        {
          stress::thread_signal_timer timer(kSignal, 20000);
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
          while (g_jumps.load() < 300 && std::chrono::steady_clock::now() < until) {
            round = round + 1;
            internal::force_locked_path_for_this_thread(round % 2 == 0);
            if (sigsetjmp(env, 1) == 0) {
              t_armed = 1;
              for (int i = 0; i < 1000; ++i) {
                add(kLeftStep);
                returned = returned + 1;
              }
              t_armed = 0;
            }
          }
          t_armed = 0;
        }
        internal::force_locked_path_for_this_thread(false);
        const long jumps = g_jumps.load();
        if (jumps < 20) return 5;
        const std::int64_t sum = total();
        if (sum % kLeftStep != 0) return 1;  // a step counted in part
        const std::int64_t steps = sum / kLeftStep;
        if (steps < returned) return 2;          // an add that returned was lost
        if (steps > returned + jumps) return 3;  // an add counted twice
        std::thread([&] {
          for (int i = 0; i < 1000; ++i) add(kLeftStep);
        }).join();
        if (total() != (steps + 1000) * kLeftStep) return 4;
        const int forked = stress::run_in_child(
            [&] {
              add(kLeftStep);
              return total() == (steps + 1001) * kLeftStep ? 0 : 1;
            },
            std::chrono::seconds(10));
        return forked == 0 ? 0 : 10 + (forked > 50 ? 50 : forked);
      },
      std::chrono::seconds(30));
}

constexpr const char* kLeftAddsCodes =
    "1: part of a step counted, 2: an add that returned lost, 3: more steps than adds, "
    "4: later adds inexact, 1x: the forked child";

counter g_left_counter;

TEST(JumpOutTest, AnAddLeftByAJumpCountedWholeOrNotAtAll) {
  const int status = adds_left_by_jumps([](std::int64_t step) { g_left_counter.add(step); },
                                        [] { return g_left_counter.load(); });
  if (status == 5) GTEST_SKIP() << "too few signals landed while adding";
  EXPECT_EQ(status, 0) << kLeftAddsCodes;
}

struct left_fields {
  std::int64_t added;
  std::int64_t beside;  // never updated: a T of more than one word
};
per_cpu<left_fields> g_left_per_cpu;
cid_per_cpu<left_fields> g_left_cid_per_cpu;

TEST(JumpOutTest, AnUpdateLeftByAJumpHappenedOrNot) {
  int status =
      adds_left_by_jumps([](std::int64_t step) { g_left_per_cpu.add(&left_fields::added, step); },
                         [] { return g_left_per_cpu.sum(&left_fields::added); });
  if (status == 5) GTEST_SKIP() << "too few signals landed while adding";
  EXPECT_EQ(status, 0) << "per_cpu: " << kLeftAddsCodes;
  status = adds_left_by_jumps(
      [](std::int64_t step) { g_left_cid_per_cpu.add(&left_fields::added, step); },
      [] { return g_left_cid_per_cpu.sum(&left_fields::added); });
  if (status == 5) GTEST_SKIP() << "too few signals landed while adding";
  EXPECT_EQ(status, 0) << "cid_per_cpu: " << kLeftAddsCodes;
}

}  // namespace
}  // namespace percpu
