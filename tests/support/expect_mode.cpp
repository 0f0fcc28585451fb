// Linked into every gtest binary: prints the rseq mode the run exercised and,
// when the ctest variant names one, fails the run if it is a different mode.
// Without this a lane that silently fell back could pass.
//
//   PERCPU_EXPECT_OWNER    glibc | percpu | none
//   PERCPU_EXPECT_BACKEND  rseq | rdpid | vdso | syscall, or forced: what
//                          PERCPU_BACKEND must give on this host (the named
//                          fallback where the host offers it, else the next
//                          one it offers; tests/support/expected_backend.hpp)
//   PERCPU_EXPECT_SECTIONS on | no_rseq | foreign_signature: what
//                          percpu::sections_status() says for the main thread,
//                          unless a process-wide reason (PERCPU_RSEQ_SECTIONS,
//                          the kernel, a forced fallback) comes first

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "percpu/cpu.hpp"
#include "percpu/internal/registration.hpp"
#include "tests/support/expected_backend.hpp"
#include "tests/support/expected_sections.hpp"

namespace {

class expect_mode : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* owner = percpu::to_string(percpu::rseq_ownership());
    const char* backend = percpu::to_string(percpu::backend());
    // The registration length says which kernel mode serves the thread:
    // more than 32 bytes is Linux 7.0+'s strict V2 mode, 32 the legacy one.
    const unsigned length = percpu::internal::rseq_registration_length();
    std::printf(
        "percpu test mode: rseq owner=%s, main thread backend=%s, fallback=%s, "
        "feature size=%u, max_cpus=%d, registration=%u (%s), sections=%s\n",
        owner, backend, percpu::to_string(percpu::fallback_backend()), percpu::rseq_feature_size(),
        percpu::max_cpus(), length,
        length == 0   ? "none"
        : length > 32 ? "v2"
                      : "legacy",
        percpu::to_string(percpu::sections_status()));
    if (const char* want = std::getenv("PERCPU_EXPECT_OWNER")) {
      EXPECT_STREQ(owner, want) << "this variant must run with rseq owned by " << want;
    }
    if (const char* want = std::getenv("PERCPU_EXPECT_BACKEND")) {
      std::string why;
      const std::string expected = percpu::test::expected_backend(want, &why);
      std::printf("percpu expected backend=%s (%s)\n", expected.c_str(), why.c_str());
      ASSERT_NE(expected, "") << "PERCPU_EXPECT_BACKEND=" << want << ": " << why;
      EXPECT_EQ(backend, expected) << why;
    }
    if (const char* want = std::getenv("PERCPU_EXPECT_SECTIONS")) {
      percpu::sections thread_reason = percpu::sections::on;
      ASSERT_TRUE(percpu::test::parse_sections(want, &thread_reason))
          << "PERCPU_EXPECT_SECTIONS=" << want << " names no percpu::sections";
      EXPECT_STREQ(percpu::to_string(percpu::sections_status()),
                   percpu::to_string(percpu::test::expected_sections(thread_reason)))
          << "PERCPU_EXPECT_SECTIONS=" << want;
    }
  }
};

const auto* const g_registered = ::testing::AddGlobalTestEnvironment(new expect_mode);

}  // namespace
