// The C API: thin out-of-line wrappers over percpu/cpu.hpp.

#include "percpu/percpu.h"

#include <cerrno>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/registration.hpp"

// The C values are the C++ enumerators' (percpu_sections_status() converts).
#define PERCPU_SAME_SECTIONS(c, cxx) \
  static_assert(static_cast<int>(c) == static_cast<int>(percpu::sections::cxx), #c)
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_ON, on);
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_NO_RSEQ, no_rseq);
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_FOREIGN_SIGNATURE, foreign_signature);
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_KERNEL_QUIRK, kernel_quirk);
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_DISABLED_BY_ENVIRONMENT, disabled_by_environment);
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_UNSUPPORTED_ARCH, unsupported_arch);
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_FALLBACK_FORCED, fallback_forced);
PERCPU_SAME_SECTIONS(PERCPU_SECTIONS_STARTING, starting);
#undef PERCPU_SAME_SECTIONS

extern "C" {

// The inline fast paths are safe from the first constructor on (their bounds
// reject every load until start-up has run), so these are plain wrappers.
int percpu_cpu_id(void) { return percpu::cpu_id(); }

int percpu_node_id(void) { return percpu::node_id(); }

int percpu_concurrency_id(void) { return percpu::concurrency_id(); }

int percpu_max_cpus(void) { return percpu::max_cpus(); }

int percpu_sched_getcpu(void) {
  const int id = percpu::internal::rseq_cpu_id_or_negative();
  if (__builtin_expect(id >= 0, 1)) return id;
  if (percpu::backend() == percpu::cpu_backend::rseq) return percpu::cpu_id();
  // Before start-up the fallback is still the system call.
  unsigned cpu = 0;
  const int error = percpu::internal::query_fallback(&cpu, nullptr);
  if (error != 0) {
    errno = error;
    return -1;
  }
  return static_cast<int>(cpu);
}

const char* percpu_backend_name(void) { return percpu::to_string(percpu::backend()); }

const char* percpu_rseq_owner_name(void) { return percpu::to_string(percpu::rseq_ownership()); }

enum percpu_sections percpu_sections_status(void) {
  return static_cast<enum percpu_sections>(percpu::sections_status());
}

const char* percpu_sections_name(enum percpu_sections status) {
  if (status < PERCPU_SECTIONS_ON || status > PERCPU_SECTIONS_STARTING) return "unknown";
  return percpu::to_string(static_cast<percpu::sections>(status));
}

}  // extern "C"
