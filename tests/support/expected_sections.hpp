// What percpu::sections_status() must answer in this process, worked out from
// what a test variant imposes: the process-wide reasons (the architecture,
// PERCPU_RSEQ_SECTIONS and the running kernel, a forced fallback) come first,
// as cpu.hpp promises, then `thread_reason`, what the variant expects for the
// calling thread itself (on, no_rseq, foreign_signature).
#pragma once

#include <sys/utsname.h>

#include <cstdlib>
#include <cstring>

#include "percpu/cpu.hpp"
#include "percpu/internal/config.hpp"
#include "percpu/internal/registration.hpp"

namespace percpu {
namespace test {

inline sections expected_sections(sections thread_reason) {
  if (!internal::kArchHasRseq) return sections::unsupported_arch;
  struct utsname name;
  const bool named = uname(&name) == 0;
  const sections process = internal::sections_decision_for(std::getenv("PERCPU_RSEQ_SECTIONS"),
                                                           named ? name.machine : nullptr,
                                                           named ? name.release : nullptr);
  if (process != sections::on) return process;
  if (const char* forced = std::getenv("PERCPU_BACKEND")) {
    for (const char* fallback : {"rdpid", "vdso", "syscall"}) {
      if (std::strcmp(forced, fallback) == 0) return sections::fallback_forced;
    }
  }
  return thread_reason;
}

// The enumerator named `name` (to_string's inverse); false when none is.
inline bool parse_sections(const char* name, sections* out) {
  for (sections s : {sections::on, sections::no_rseq, sections::foreign_signature,
                     sections::kernel_quirk, sections::disabled_by_environment,
                     sections::unsupported_arch, sections::fallback_forced, sections::starting}) {
    if (std::strcmp(to_string(s), name) == 0) {
      *out = s;
      return true;
    }
  }
  return false;
}

}  // namespace test
}  // namespace percpu
