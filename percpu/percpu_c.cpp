// The C API: thin out-of-line wrappers over percpu/cpu.hpp.

#include "percpu/percpu.h"

#include <cerrno>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/registration.hpp"

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

}  // extern "C"
