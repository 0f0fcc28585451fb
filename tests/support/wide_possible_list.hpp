// Test helper: runs this test binary again, with a gtest filter, in a mount
// namespace of its own where /sys/devices/system/cpu/possible says 0-4095
// (root only): the host a structure indexed by concurrency id is for, whose
// possible list is far longer than what the process uses.
// PERCPU_TEST_REAL_MAX_CPUS carries the real bound into the child.
#pragma once

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/stress/stress.hpp"

namespace percpu {
namespace test {

// The real max_cpus() inside such a run, or nullptr outside one.
inline const char* real_max_cpus_in_wide_run() { return std::getenv("PERCPU_TEST_REAL_MAX_CPUS"); }

// The command line this process was started with (/proc/self/cmdline), as
// execv() takes it: empty if it cannot be read.
inline std::vector<std::string> started_command_line() {
  std::vector<std::string> args;
  FILE* file = std::fopen("/proc/self/cmdline", "rb");
  if (file == nullptr) return args;
  std::string arg;
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) {
    if (c == '\0') {
      args.push_back(arg);
      arg.clear();
    } else {
      arg.push_back(static_cast<char>(c));
    }
  }
  std::fclose(file);
  return args;
}

// Two threads, each restricted to a CPU of its own (cpus[0] and cpus[1],
// or cpus[0] twice where there is one), run `body` from the same moment:
// in a wide run, two concurrency ids held at once, one of them a new high.
template <typename Body>
void run_on_two_cpus_at_once(const std::vector<int>& cpus, Body body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      stress::restrict_to({cpus[static_cast<std::size_t>(t) % cpus.size()]});
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      body();
    });
  }
  for (std::thread& t : threads) t.join();
}

// Runs the binary again with `filter` (a whole --gtest_filter=... argument)
// and 0-4095 possible CPUs, `real_max_cpus` in PERCPU_TEST_REAL_MAX_CPUS,
// and checks that exactly one test ran there and passed, or skips where
// no mount namespace can be made.
inline void run_with_4096_possible_cpus(const char* filter, int real_max_cpus) {
  // This binary as it was started: under valgrind /proc/self/exe is
  // valgrind's own tool, and the case runs natively there anyway.
  const std::string self = ::testing::internal::GetArgvs().front();
  // Where a loader was named on the command line (ld-linux.so
  // --library-path DIR binary: the kernels lane's glibc matrix), the binary
  // alone may not start: then the same command line runs again, through
  // /proc/self/exe (the loader), with the filter last, where gtest takes it.
  std::vector<std::string> again = started_command_line();
  again.push_back(filter);
  std::vector<char*> again_argv;
  for (std::string& arg : again) again_argv.push_back(&arg[0]);
  again_argv.push_back(nullptr);
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const std::string real = std::to_string(real_max_cpus);
  const pid_t child = fork();
  if (child == 0) {
    close(out[0]);
    // The types are ignored for these two mounts; "" rather than nullptr
    // keeps valgrind from reporting the system call's argument.
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", "", MS_REC | MS_PRIVATE, nullptr) != 0) {
      _exit(100);
    }
    char path[64];
    std::snprintf(path, sizeof(path), "/tmp/percpu-possible-4096-%d", static_cast<int>(getpid()));
    FILE* list = std::fopen(path, "w");
    if (list == nullptr || std::fputs("0-4095\n", list) < 0 || std::fclose(list) != 0) _exit(101);
    if (mount(path, "/sys/devices/system/cpu/possible", "", MS_BIND, nullptr) != 0) {
      _exit(102);
    }
    setenv("PERCPU_TEST_REAL_MAX_CPUS", real.c_str(), 1);
    dup2(out[1], STDOUT_FILENO);
    execl(self.c_str(), self.c_str(), filter, static_cast<char*>(nullptr));
    if (again.size() > 1) execv("/proc/self/exe", again_argv.data());
    _exit(103);
  }
  close(out[1]);
  std::string text;
  char buffer[512];
  ssize_t n;
  while ((n = read(out[0], buffer, sizeof(buffer))) > 0) {
    text.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 100) GTEST_SKIP() << "cannot make a mount namespace here (needs root)";
  if (code == 102) GTEST_SKIP() << "no /sys/devices/system/cpu/possible to bind a list over";
  std::printf("%s", text.c_str());
  EXPECT_EQ(code, 0) << "101: cannot write the list, 103: cannot run this binary again";
  EXPECT_NE(text.find("[  PASSED  ] 1 test"), std::string::npos) << "the wide case did not run";
}

}  // namespace test
}  // namespace percpu
