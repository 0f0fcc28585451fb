// Tests for how percpu trusts a CPU-number source other than rseq
// (internal/fallback.*): an answer that agrees with the getcpu system call
// on CPU 0 is checked again on another allowed CPU, so a stub that answers 0
// everywhere (qemu-user's x86-64 vDSO getcpu does) is refused wherever the
// process may run on more than CPU 0, and a source that is right is kept.
// The emulated cpu_test variants (percpu/CMakeLists.txt) run the whole
// choice under such a vDSO.
#include "percpu/internal/fallback.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <cerrno>
#include <vector>

#include "tests/support/expected_backend.hpp"

namespace percpu {
namespace internal {
namespace {

using test::allowed_cpus;

// The thread's mask, put back at the end of a test.
class saved_affinity {
 public:
  saved_affinity() { sched_getaffinity(0, sizeof(mask_), &mask_); }
  ~saved_affinity() { sched_setaffinity(0, sizeof(mask_), &mask_); }
  const cpu_set_t& mask() const { return mask_; }

 private:
  cpu_set_t mask_;
};

// Runs the calling thread on CPU 0 while leaving `other` allowed too: set to
// CPU 0 alone, then widened, which does not move a thread that is on an
// allowed CPU.
bool on_cpu_0_with(int other) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) return false;
  CPU_SET(other, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0 && sched_getcpu() == 0;
}

// A source that answers CPU 0 wherever it runs.
bool answers_0_everywhere(unsigned* agreed) noexcept {
  unsigned cpu = 0;
  if (raw_syscall_getcpu(&cpu, nullptr) != 0) return false;
  *agreed = cpu;
  return cpu == 0;
}

// A source that is right everywhere: the system call itself.
bool always_right(unsigned* agreed) noexcept {
  return raw_syscall_getcpu(agreed, nullptr) == 0;
}

TEST(FallbackTrust, AStubAnsweringZeroEverywhereIsRefused) {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.empty() || cpus[0] != 0 || cpus.size() < 2) {
    GTEST_SKIP() << "needs CPU 0 and another CPU allowed: the stub is right where only CPU 0 is";
  }
  saved_affinity saved;
  ASSERT_TRUE(on_cpu_0_with(cpus.back()));
  errno = 1234;
  EXPECT_FALSE(agrees_on_cpu_0_and_another(answers_0_everywhere))
      << "an answer of 0 checked on CPU 0 only was trusted";
  EXPECT_EQ(errno, 1234);
  cpu_set_t now;
  ASSERT_EQ(sched_getaffinity(0, sizeof(now), &now), 0);
  cpu_set_t expected;
  CPU_ZERO(&expected);
  CPU_SET(0, &expected);
  CPU_SET(cpus.back(), &expected);
  EXPECT_TRUE(CPU_EQUAL(&now, &expected)) << "the thread's mask was not given back";
}

TEST(FallbackTrust, ARightSourceIsKeptOnCpu0AndElsewhere) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  saved_affinity saved;
  if (cpus[0] == 0 && cpus.size() >= 2) {
    ASSERT_TRUE(on_cpu_0_with(cpus.back()));
    EXPECT_TRUE(agrees_on_cpu_0_and_another(always_right)) << "checked on CPU 0 and CPU "
                                                           << cpus.back();
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus.back(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_TRUE(agrees_on_cpu_0_and_another(always_right)) << "checked on CPU " << cpus.back();
}

// With CPU 0 the only CPU allowed, an answer of 0 is right: it stands.
TEST(FallbackTrust, OnlyCpu0AllowedKeepsTheOneAgreement) {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.empty() || cpus[0] != 0) GTEST_SKIP() << "CPU 0 is not allowed here";
  saved_affinity saved;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_TRUE(agrees_on_cpu_0_and_another(answers_0_everywhere));
}

}  // namespace
}  // namespace internal
}  // namespace percpu
