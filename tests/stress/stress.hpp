// Reusable stress helpers for percpu's tests: many threads on few CPUs,
// affinity flipping, timer-signal storms, fork under load, thread churn.
//
// Library target: percpu_stress (link it with DEPS percpu_stress). Namespace
// percpu::stress. Not async-signal-safe except where a function says so.
//
// Typical use (exact sums under migration and signals):
//
//   stress::restrict_to(stress::test_cpus(2));        // 2 cores, inherited
//   stress::install_handler(SIGRTMIN, on_signal);      // handler may use percpu
//   stress::worker_group workers(12, [&](int w, const stress::stop_flag& stop) {
//     stress::thread_signal_timer timer(SIGRTMIN, 10000);   // this thread, 10 kHz
//     while (!stop) counter.increment(), ++local[w];
//   });
//   stress::affinity_flipper flipper(workers, stress::test_cpus(2),
//                                    std::chrono::microseconds(300));
//   stress::sleep_scaled(std::chrono::milliseconds(500));
//   flipper.stop();
//   workers.stop_and_join();
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace percpu {
namespace stress {

// PERCPU_STRESS_SCALE from the environment, else the value CMake built in
// (default 1). Multiplies durations and iteration counts; always > 0.
double scale();
// `base` scaled, at least one unit.
std::chrono::milliseconds scaled(std::chrono::milliseconds base);
long scaled(long base_count);
void sleep_scaled(std::chrono::milliseconds base);

// The kernel thread id of the calling thread. Async-signal-safe.
pid_t this_tid();

// CPUs the calling thread may run on, ascending.
std::vector<int> allowed_cpus();
// The first `n` of allowed_cpus() (fewer if fewer are allowed).
std::vector<int> test_cpus(int n);
// Pins the calling thread to `cpus`; threads it creates afterwards inherit it.
// Returns false (and changes nothing) if the kernel refuses.
bool restrict_to(const std::vector<int>& cpus);
// Sets the affinity of thread `tid`; false when it failed (e.g. it exited).
bool set_affinity(pid_t tid, const std::vector<int>& cpus);

// Set by the group to ask its workers to return.
// Restores the calling thread's allowed CPUs when it goes out of scope, so
// a test that fails an ASSERT while pinned leaves the next test unpinned.
class affinity_guard {
 public:
  affinity_guard() : saved_(allowed_cpus()) {}
  ~affinity_guard() { restrict_to(saved_); }
  affinity_guard(const affinity_guard&) = delete;
  affinity_guard& operator=(const affinity_guard&) = delete;

 private:
  std::vector<int> saved_;
};

class stop_flag {
 public:
  explicit operator bool() const { return stop_.load(std::memory_order_relaxed); }
  void raise() { stop_.store(true, std::memory_order_relaxed); }

 private:
  std::atomic<bool> stop_{false};
};

// `n` threads running body(worker_index, stop) until they return. The
// constructor returns once every worker has started, so tids() is complete.
class worker_group {
 public:
  worker_group(int n, std::function<void(int, const stop_flag&)> body);
  ~worker_group();  // stop_and_join()
  worker_group(const worker_group&) = delete;
  worker_group& operator=(const worker_group&) = delete;

  std::vector<pid_t> tids() const;
  int size() const { return static_cast<int>(threads_.size()); }
  const stop_flag& stopping() const { return stop_; }
  void stop_and_join();  // raises the flag, then joins every worker
  void join();           // joins without asking (workers that finish on their own)

 private:
  stop_flag stop_;
  std::vector<std::thread> threads_;
  std::vector<std::atomic<pid_t>> tids_;
};

// A controller thread that, every `period`, gives each worker of `group`
// (or each tid from `tids`) a new affinity drawn from: one CPU of `cpus`,
// another one, all of them. Flips to exited threads are ignored.
class affinity_flipper {
 public:
  affinity_flipper(const worker_group& group, std::vector<int> cpus,
                   std::chrono::microseconds period);
  affinity_flipper(std::function<std::vector<pid_t>()> tids, std::vector<int> cpus,
                   std::chrono::microseconds period);
  ~affinity_flipper();  // stop()
  void stop();
  long flips() const { return flips_.load(std::memory_order_relaxed); }

 private:
  void run();
  std::function<std::vector<pid_t>()> tids_;
  std::vector<int> cpus_;
  std::chrono::microseconds period_;
  std::atomic<bool> stop_{false};
  std::atomic<long> flips_{0};
  std::thread thread_;
};

// Installs `handler` for `signo` with SA_RESTART, all other signals allowed.
void install_handler(int signo, void (*handler)(int));
// Restores the default action for `signo`.
void restore_default(int signo);

// A POSIX timer that sends `signo` to the calling thread `hz` times a second
// (SIGEV_THREAD_ID) from construction to destruction. Create it in the thread
// that should receive the signals. A signal may still arrive shortly after
// destruction, so keep the handler installed until the threads are joined.
class thread_signal_timer {
 public:
  thread_signal_timer(int signo, long hz);
  ~thread_signal_timer();
  thread_signal_timer(const thread_signal_timer&) = delete;
  thread_signal_timer& operator=(const thread_signal_timer&) = delete;
  bool armed() const { return armed_; }

 private:
  timer_t timer_{};
  bool armed_ = false;
};

// Forks. The child runs `child_body` (only the forking thread exists there;
// it may start new threads) and exits with its return value through _exit.
// The parent waits and returns the child's exit status, or 128 + the signal
// number that killed it, or -1 if fork failed. `timeout` bounds the wait: a
// child still running then is killed with SIGKILL (so a hang fails).
int run_in_child(const std::function<int()>& child_body, std::chrono::milliseconds timeout);

// Thread churn: runs `total` short-lived threads, at most `concurrent` alive
// at a time, each calling body(thread_number). Returns when all have exited.
void churn(long total, int concurrent, const std::function<void(long)>& body);

}  // namespace stress
}  // namespace percpu
