// Implementation of tests/stress/stress.hpp.

#include "tests/stress/stress.hpp"

#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#ifndef PERCPU_STRESS_SCALE_DEFAULT
#define PERCPU_STRESS_SCALE_DEFAULT 1
#endif

namespace percpu {
namespace stress {

double scale() {
  static const double value = [] {
    double s = PERCPU_STRESS_SCALE_DEFAULT;
    if (const char* env = std::getenv("PERCPU_STRESS_SCALE")) {
      char* end = nullptr;
      const double parsed = std::strtod(env, &end);
      if (end != env && parsed > 0) {
        s = parsed;
      } else {
        std::fprintf(stderr, "stress: ignoring PERCPU_STRESS_SCALE=%s (want a number > 0)\n", env);
      }
    }
    return s > 0 ? s : 1.0;
  }();
  return value;
}

std::chrono::milliseconds scaled(std::chrono::milliseconds base) {
  const auto ms = static_cast<long long>(static_cast<double>(base.count()) * scale());
  return std::chrono::milliseconds(std::max<long long>(ms, 1));
}

long scaled(long base_count) {
  return std::max<long>(static_cast<long>(static_cast<double>(base_count) * scale()), 1);
}

void sleep_scaled(std::chrono::milliseconds base) { std::this_thread::sleep_for(scaled(base)); }

pid_t this_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> test_cpus(int n) {
  std::vector<int> cpus = allowed_cpus();
  if (static_cast<int>(cpus.size()) > n) cpus.resize(static_cast<std::size_t>(n));
  return cpus;
}

bool set_affinity(pid_t tid, const std::vector<int>& cpus) {
  if (cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return sched_setaffinity(tid, sizeof(set), &set) == 0;
}

bool restrict_to(const std::vector<int>& cpus) { return set_affinity(0, cpus); }

worker_group::worker_group(int n, std::function<void(int, const stop_flag&)> body)
    : tids_(static_cast<std::size_t>(n)) {
  for (auto& tid : tids_) tid.store(0);
  threads_.reserve(static_cast<std::size_t>(n));
  for (int w = 0; w < n; ++w) {
    threads_.emplace_back([this, w, body] {
      tids_[static_cast<std::size_t>(w)].store(this_tid(), std::memory_order_release);
      body(w, stop_);
    });
  }
  for (auto& tid : tids_) {
    while (tid.load(std::memory_order_acquire) == 0) std::this_thread::yield();
  }
}

worker_group::~worker_group() { stop_and_join(); }

std::vector<pid_t> worker_group::tids() const {
  std::vector<pid_t> out;
  for (const auto& tid : tids_) out.push_back(tid.load(std::memory_order_acquire));
  return out;
}

void worker_group::stop_and_join() {
  stop_.raise();
  join();
}

void worker_group::join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

affinity_flipper::affinity_flipper(const worker_group& group, std::vector<int> cpus,
                                   std::chrono::microseconds period)
    : affinity_flipper([&group] { return group.tids(); }, std::move(cpus), period) {}

affinity_flipper::affinity_flipper(std::function<std::vector<pid_t>()> tids, std::vector<int> cpus,
                                   std::chrono::microseconds period)
    : tids_(std::move(tids)), cpus_(std::move(cpus)), period_(period) {
  thread_ = std::thread([this] { run(); });
}

affinity_flipper::~affinity_flipper() { stop(); }

void affinity_flipper::stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void affinity_flipper::run() {
  std::minstd_rand random(12345);
  const std::size_t choices = cpus_.size() + 1;  // each single CPU, then all of them
  while (!stop_.load(std::memory_order_relaxed)) {
    for (pid_t tid : tids_()) {
      if (tid == 0) continue;
      const std::size_t pick = random() % choices;
      const std::vector<int> mask = pick < cpus_.size() ? std::vector<int>{cpus_[pick]} : cpus_;
      if (set_affinity(tid, mask)) flips_.fetch_add(1, std::memory_order_relaxed);
    }
    std::this_thread::sleep_for(period_);
  }
}

void install_handler(int signo, void (*handler)(int)) {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = handler;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(signo, &action, nullptr) != 0) {
    std::perror("stress: sigaction");
    std::abort();
  }
}

void restore_default(int signo) {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signo, &action, nullptr);
}

thread_signal_timer::thread_signal_timer(int signo, long hz) {
  struct sigevent event;
  std::memset(&event, 0, sizeof(event));
  event.sigev_notify = SIGEV_THREAD_ID;
  event.sigev_signo = signo;
  event._sigev_un._tid = this_tid();
  if (timer_create(CLOCK_MONOTONIC, &event, &timer_) != 0) {
    std::perror("stress: timer_create");
    return;
  }
  const long period_ns = 1000000000L / std::max(hz, 1L);
  struct itimerspec spec;
  spec.it_interval.tv_sec = period_ns / 1000000000L;
  spec.it_interval.tv_nsec = period_ns % 1000000000L;
  spec.it_value = spec.it_interval;
  if (timer_settime(timer_, 0, &spec, nullptr) != 0) {
    std::perror("stress: timer_settime");
    timer_delete(timer_);
    return;
  }
  armed_ = true;
}

thread_signal_timer::~thread_signal_timer() {
  if (armed_) timer_delete(timer_);
}

int run_in_child(const std::function<int()>& child_body, std::chrono::milliseconds timeout) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int rc = child_body();
    std::fflush(nullptr);
    _exit(rc);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "stress: child %d still running after the timeout; killing it\n",
                   static_cast<int>(pid));
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

void churn(long total, int concurrent, const std::function<void(long)>& body) {
  std::atomic<long> next{0};
  std::vector<std::thread> spawners;
  for (int s = 0; s < std::max(concurrent, 1); ++s) {
    spawners.emplace_back([&] {
      for (;;) {
        const long n = next.fetch_add(1, std::memory_order_relaxed);
        if (n >= total) return;
        std::thread([&body, n] { body(n); }).join();
      }
    });
  }
  for (std::thread& t : spawners) t.join();
}

}  // namespace stress
}  // namespace percpu
