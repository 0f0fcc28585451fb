// The switch that keeps the per-CPU structures off rseq critical sections on
// arm64 kernels that do not abort a section on same-CPU preemption: the
// decision by kernel release, and PERCPU_RSEQ_SECTIONS=on|off. Registered
// with the variable set each way (tests/CMakeLists.txt); the test reads it
// and checks that percpu obeyed, that cpu_id() still reads rseq, and that the
// structures stay exact on whichever path they took.
#include <gtest/gtest.h>
#include <sys/utsname.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/internal/registration.hpp"
#include "percpu/internal/rseq_cs.hpp"
#include "tests/support/expected_sections.hpp"

namespace {

using percpu::internal::rseq_sections_broken_on;

TEST(SectionsDecision, Arm64ReleasesWithoutSameCpuAborts) {
  for (const char* release :
       {"6.19", "6.19.0", "6.19.3+deb14-arm64", "6.19.14-200.fc43.aarch64", "7.0.0",
        "7.0.0-14-generic", "7.0.9", "7.0.13-arm64", "7.1.0-rc3", "7.1-rc7+", "6.19.0-rc1"}) {
    EXPECT_TRUE(rseq_sections_broken_on("aarch64", release)) << release;
  }
  for (const char* release :
       {"6.18.44", "6.18.44-fc-v669", "6.1.0-50-cloud-arm64", "5.10.0-32-cloud-arm64",
        "6.12.117+deb13-cloud-arm64", "7.0.14", "7.0.20+deb14-arm64", "7.1.0", "7.1.5-arch1-1",
        "7.2.13+deb14-cloud-arm64", "7.3-rc7", "7.3.0-rc7-cloud-arm64", "6.20.0", "8.0.0",
        "4.18.0"}) {
    EXPECT_FALSE(rseq_sections_broken_on("aarch64", release)) << release;
  }
  // Only arm64 lost the abort.
  for (const char* machine : {"x86_64", "riscv64", "armv7l", "ppc64le"}) {
    EXPECT_FALSE(rseq_sections_broken_on(machine, "6.19.3")) << machine;
    EXPECT_FALSE(rseq_sections_broken_on(machine, "7.0.0")) << machine;
  }
  // Unparsable releases keep sections on: the kernel check is a denylist.
  for (const char* release : {"", "linux", "7", "7.", "x.y.z"}) {
    EXPECT_FALSE(rseq_sections_broken_on("aarch64", release)) << '"' << release << '"';
  }
  EXPECT_FALSE(rseq_sections_broken_on(nullptr, "6.19.0"));
  EXPECT_FALSE(rseq_sections_broken_on("aarch64", nullptr));
}

// Start-up's decision for the whole process, which sections_status() reports:
// the kernel check, and PERCPU_RSEQ_SECTIONS both ways. The kernel quirk can
// only be seen on an affected arm64 kernel, so it is checked here on the
// release strings.
TEST(SectionsDecision, NamesTheKernelQuirkAndTheVariable) {
  using percpu::sections;
  using percpu::internal::sections_decision_for;
  EXPECT_EQ(sections_decision_for(nullptr, "aarch64", "7.0.0-14-generic"), sections::kernel_quirk);
  EXPECT_EQ(sections_decision_for(nullptr, "aarch64", "6.19.3+deb14-arm64"),
            sections::kernel_quirk);
  EXPECT_EQ(sections_decision_for("bogus", "aarch64", "7.1.0-rc3"), sections::kernel_quirk)
      << "a value other than on or off is ignored";
  EXPECT_EQ(sections_decision_for("on", "aarch64", "7.0.0"), sections::on);
  EXPECT_EQ(sections_decision_for("off", "aarch64", "7.0.0"), sections::disabled_by_environment);
  EXPECT_EQ(sections_decision_for("off", "x86_64", "6.12.0"), sections::disabled_by_environment);
  EXPECT_EQ(sections_decision_for(nullptr, "aarch64", "7.0.14"), sections::on);
  EXPECT_EQ(sections_decision_for(nullptr, "x86_64", "7.0.0"), sections::on);
  EXPECT_EQ(sections_decision_for(nullptr, nullptr, nullptr), sections::on)
      << "an unknown kernel keeps sections on: the check is a denylist";
  EXPECT_EQ(sections_decision_for("", "aarch64", "7.0.0"), sections::kernel_quirk);
}

// What PERCPU_RSEQ_SECTIONS and the running kernel say percpu must do here.
bool expected_sections() {
  if (!percpu::internal::kArchHasRseq) return false;
  const char* forced = std::getenv("PERCPU_RSEQ_SECTIONS");
  if (forced != nullptr && std::strcmp(forced, "on") == 0) return true;
  if (forced != nullptr && std::strcmp(forced, "off") == 0) return false;
  struct utsname name;
  if (uname(&name) != 0) return true;
  return !rseq_sections_broken_on(name.machine, name.release);
}

TEST(SectionsSwitch, ObeysTheVariableAndTheKernel) {
  const bool want = expected_sections();
  EXPECT_EQ(percpu::internal::rseq_sections_enabled(), want);
  // The public answer names the switch (disabled_by_environment under
  // PERCPU_RSEQ_SECTIONS=off, kernel_quirk on an affected kernel) before the
  // thread's own reason; here the thread has rseq exactly when backend() says so.
  const percpu::sections thread_reason = percpu::backend() == percpu::cpu_backend::rseq
                                             ? percpu::sections::on
                                             : percpu::sections::no_rseq;
  EXPECT_STREQ(percpu::to_string(percpu::sections_status()),
               percpu::to_string(percpu::test::expected_sections(thread_reason)));
  const char* forced = std::getenv("PERCPU_RSEQ_SECTIONS");
  if (forced != nullptr && std::strcmp(forced, "off") == 0) {
    EXPECT_EQ(percpu::sections_status(), percpu::sections::disabled_by_environment);
  }
  if (percpu::backend() != percpu::cpu_backend::rseq) {
    GTEST_SKIP() << "no rseq for this thread (" << percpu::to_string(percpu::backend())
                 << "): nothing to switch";
  }
  percpu::internal::rseq_area* area = percpu::internal::rseq_area_for_sections();
  if (want) {
    EXPECT_NE(area, nullptr) << "sections are on: structures must get the area";
  } else {
    EXPECT_EQ(area, nullptr) << "sections are off: structures must take their no-rseq paths";
  }
  // cpu_id() reads rseq either way.
  EXPECT_EQ(percpu::internal::rseq_cpu_id_or_negative(), percpu::cpu_id());
  std::thread([&] {
    EXPECT_EQ(percpu::backend(), percpu::cpu_backend::rseq);
    EXPECT_EQ(percpu::internal::rseq_area_for_sections() != nullptr, want);
  }).join();
}

TEST(SectionsSwitch, CounterIsExactOnEitherPath) {
  percpu::counter total;
  constexpr int kThreads = 4;
  constexpr long kAdds = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (long i = 0; i < kAdds; ++i) total.add(1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(total.load(), kThreads * kAdds);
}

}  // namespace
