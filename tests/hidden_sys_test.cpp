// max_cpus() where /sys is not what it usually is: hidden (containers and
// sandboxes that mount nothing there) or listing a sparse set of possible
// CPUs. Each case runs max_cpus_probe (whose path ctest passes as the
// argument) in a child that first enters a mount namespace of its own (root
// only) and changes what /sys shows there.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "percpu/cpu.hpp"
#include "percpu/internal/sysfs.hpp"

namespace {

// The probe's path, the one argument ctest passes after gtest's own.
std::string probe_path() {
  for (const std::string& arg : ::testing::internal::GetArgvs()) {
    const std::string name = "max_cpus_probe";
    if (arg.size() >= name.size() &&
        arg.compare(arg.size() - name.size(), name.size(), name) == 0) {
      return arg;
    }
  }
  return "";
}

// Runs the probe in a private mount namespace after `prepare` (which runs in
// the child, in that namespace). Returns its output; *status its exit code,
// or -1 when the namespace could not be made.
std::string run_probe(void (*prepare)(), int* status) {
  int out[2];
  if (pipe(out) != 0) return "";
  const pid_t child = fork();
  if (child == 0) {
    close(out[0]);
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      _exit(100);
    }
    prepare();
    dup2(out[1], STDOUT_FILENO);
    execl(probe_path().c_str(), "max_cpus_probe", static_cast<char*>(nullptr));
    _exit(101);
  }
  close(out[1]);
  std::string text;
  char buffer[256];
  ssize_t n;
  while ((n = read(out[0], buffer, sizeof(buffer))) > 0) text.append(buffer, n);
  close(out[0]);
  int wait_status = 0;
  waitpid(child, &wait_status, 0);
  *status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  if (*status == 100) *status = -1;
  return text;
}

int field(const std::string& text, const char* name) {
  const std::string key = std::string(name) + "=";
  const auto at = text.find(key);
  return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + key.size());
}

void hide_sys() {
  if (mount("none", "/sys", "tmpfs", 0, nullptr) != 0) _exit(102);
}

// In the probe's namespace: `list` written to `file` and bind-mounted over
// sysfs's list of possible CPUs.
void bind_possible_list(const char* file, const char* list) {
  const int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const ssize_t length = static_cast<ssize_t>(strlen(list));
  if (fd < 0 || write(fd, list, length) != length) _exit(103);
  close(fd);
  if (mount(file, "/sys/devices/system/cpu/possible", nullptr, MS_BIND, nullptr) != 0) _exit(104);
}

void sparse_possible() { bind_possible_list("/tmp/percpu-possible-list", "0-3,8-11\n"); }

void skip_if_no_namespace(int status) {
  if (status == -1) GTEST_SKIP() << "cannot make a mount namespace here (needs root)";
}

TEST(HiddenSys, MaxCpusBoundsEveryIdWithoutSys) {
  ASSERT_FALSE(probe_path().empty()) << "no max_cpus_probe argument (see tests/CMakeLists.txt)";
  int status = 0;
  const std::string out = run_probe(hide_sys, &status);
  skip_if_no_namespace(status);
  if (IsSkipped()) return;
  std::printf("without /sys: %s", out.c_str());
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(field(out, "ids_in_range"), 1) << out;
  // The bound then comes from the kernel's cpumask, not from a count of CPUs.
  EXPECT_EQ(field(out, "max_cpus"), field(out, "cpumask_bits")) << out;
  EXPECT_GE(field(out, "max_cpus"), percpu::max_cpus());
  EXPECT_EQ(field(out, "bounds_every_id"), 1) << "the cpumask's size bounds every id: " << out;
}

TEST(HiddenSys, MaxCpusFollowsASparsePossibleList) {
  ASSERT_FALSE(probe_path().empty()) << "no max_cpus_probe argument (see tests/CMakeLists.txt)";
  int status = 0;
  const std::string out = run_probe(sparse_possible, &status);
  skip_if_no_namespace(status);
  if (IsSkipped()) return;
  std::printf("possible 0-3,8-11: %s", out.c_str());
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(field(out, "max_cpus"), 12) << "one more than the highest possible id: " << out;
  // A file bind-mounted over sysfs's list proves nothing: the inline id
  // paths then leave every id to the slow path, which keeps it in range.
  EXPECT_EQ(field(out, "bounds_every_id"), 0) << "a list not read from sysfs was trusted: " << out;
  EXPECT_EQ(field(out, "ids_in_range"), 1) << out;
}

// A list that misses CPUs, bind-mounted over sysfs's, read by a start-up
// that ran on CPU 0 alone: max_cpus() is 1, and once the process widens its
// mask, every id it is given must still be below 1. Only the slow path,
// which folds ids into range, may answer then: the inline paths would pass
// the kernel's CPU 1 through.
void narrow_start_and_list() {
  bind_possible_list("/tmp/percpu-possible-list-0", "0\n");
  cpu_set_t zero;
  CPU_ZERO(&zero);
  CPU_SET(0, &zero);
  if (sched_setaffinity(0, sizeof(zero), &zero) != 0) _exit(105);
  setenv("PERCPU_PROBE_WIDEN", "1", 1);
}

TEST(HiddenSys, AListThatMissesCpusLeavesIdsInRangeWhenTheMaskWidens) {
  ASSERT_FALSE(probe_path().empty()) << "no max_cpus_probe argument (see tests/CMakeLists.txt)";
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (!CPU_ISSET(0, &allowed) || CPU_COUNT(&allowed) < 2) {
    GTEST_SKIP() << "needs CPU 0 and another CPU allowed";
  }
  int status = 0;
  const std::string out = run_probe(narrow_start_and_list, &status);
  skip_if_no_namespace(status);
  if (IsSkipped()) return;
  std::printf("possible 0, start-up on CPU 0 alone: %s", out.c_str());
  EXPECT_EQ(field(out, "max_cpus"), 1) << out;
  EXPECT_EQ(field(out, "bounds_every_id"), 0) << out;
  EXPECT_EQ(field(out, "ids_in_range"), 1) << "an id at or above max_cpus() reached the caller: "
                                           << out;
  EXPECT_EQ(field(out, "adds_exact"), 1) << "a counter's add on a CPU at or above max_cpus(): " << out;
  EXPECT_EQ(status, 0) << out;
}

// Memory per instance with thousands of possible CPUs (free_list.hpp and
// object_pool.hpp, "Memory"): the per-CPU heads are on the per-CPU memory,
// so a list or a pool used on one CPU costs the same whether the possible
// list says 2 CPUs or 4,096, within 2x (the bound; it was 64 bytes
// for every possible CPU, 256 KiB each at 4,096).
void possible_two() {
  bind_possible_list("/tmp/percpu-possible-list-2", "0-1\n");
  setenv("PERCPU_PROBE_STRUCTURES", "3000", 1);
}
void possible_4096() {
  bind_possible_list("/tmp/percpu-possible-list-4096", "0-4095\n");
  setenv("PERCPU_PROBE_STRUCTURES", "3000", 1);
}

TEST(HiddenSys, ListsPoolsAndCountersCostAsMuchWithFourThousandPossibleCpusAsWithTwo) {
  ASSERT_FALSE(probe_path().empty()) << "no max_cpus_probe argument (see tests/CMakeLists.txt)";
  int status = 0;
  const std::string two = run_probe(possible_two, &status);
  skip_if_no_namespace(status);
  if (IsSkipped()) return;
  const std::string many = run_probe(possible_4096, &status);
  std::printf("possible 0-1: %spossible 0-4095: %s", two.c_str(), many.c_str());
  ASSERT_EQ(field(two, "max_cpus"), 2) << two;
  ASSERT_EQ(field(many, "max_cpus"), 4096) << many;
  // Not read from sysfs, but it covers the kernel's cpumask, whose size
  // bounds every id: proof enough, so the inline paths stay inline.
  EXPECT_EQ(field(many, "bounds_every_id"), 1) << many;
  for (const char* name : {"list_bytes", "pool_bytes"}) {
    const int small = field(two, name), large = field(many, name);
    ASSERT_GT(small, 0) << name << ": " << two;
    ASSERT_GT(large, 0) << name << ": " << many;
    EXPECT_LE(large, 2 * small) << name << " with 4,096 possible CPUs against 2";
  }
  // A cid_counter with 4,096 possible CPUs costs what a counter does with 2
  // (counter.hpp, "Indexed by concurrency id"), within 2x; a few bytes of
  // slack for pages that earlier structures had already filled.
  const long counter_two = field(two, "counter_bytes");
  const long cid_many = field(many, "cid_counter_bytes");
  ASSERT_GE(counter_two, 0) << two;
  ASSERT_GE(cid_many, 0) << many;
  EXPECT_LE(cid_many, 2 * counter_two + 8)
      << "cid_counter with 4,096 possible CPUs against counter with 2";
}

// The kernel's own list is a proof: the inline id paths read the kernel's ids
// unbounded (fast_path_offsets in cpu.hpp).
TEST(HiddenSys, TheKernelsPossibleListBoundsEveryId) {
  const int fd = open("/sys/devices/system/cpu/possible", O_RDONLY);
  if (fd < 0) GTEST_SKIP() << "no /sys/devices/system/cpu/possible here";
  close(fd);
  EXPECT_TRUE(percpu::internal::max_cpus_bounds_every_id());
}

TEST(HiddenSys, MaxCpusIsThePossibleListsBound) {
  const int fd = open("/sys/devices/system/cpu/possible", O_RDONLY);
  if (fd < 0) GTEST_SKIP() << "no /sys/devices/system/cpu/possible here";
  char text[4096] = {};
  const ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  ASSERT_GT(n, 0);
  EXPECT_EQ(percpu::max_cpus(), percpu::internal::cpu_list_bound(text)) << text;
}

TEST(CpuListBound, ParsesTheKernelsFormat) {
  using percpu::internal::cpu_list_bound;
  EXPECT_EQ(cpu_list_bound("0\n"), 1);
  EXPECT_EQ(cpu_list_bound("0-1\n"), 2);
  EXPECT_EQ(cpu_list_bound("0-3,8-11\n"), 12);
  EXPECT_EQ(cpu_list_bound("0-3,8-11"), 12);
  EXPECT_EQ(cpu_list_bound("5"), 6);
  EXPECT_EQ(cpu_list_bound("0,2,4,6\n"), 7);
  EXPECT_EQ(cpu_list_bound("0-8191\n"), 8192);
}

TEST(CpuListBound, RejectsWhatIsNotAList) {
  using percpu::internal::cpu_list_bound;
  EXPECT_EQ(cpu_list_bound(""), 0);
  EXPECT_EQ(cpu_list_bound("\n"), 0);
  EXPECT_EQ(cpu_list_bound("abc"), 0);
  EXPECT_EQ(cpu_list_bound("0-3,,8"), 0);
  EXPECT_EQ(cpu_list_bound("-3"), 0);
  EXPECT_EQ(cpu_list_bound("3-"), 0);
  EXPECT_EQ(cpu_list_bound("0-99999999999"), 0);
}

TEST(KernelCpumaskBits, BoundsEveryAllowedCpu) {
  const int bits = percpu::internal::kernel_cpumask_bits();
  ASSERT_GT(bits, 0);
  EXPECT_EQ(bits % 64, 0) << "the kernel copies whole longs";
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      EXPECT_LT(cpu, bits);
    }
  }
}

}  // namespace
