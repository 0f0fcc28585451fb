// The C API: thin out-of-line wrappers over percpu/cpu.hpp.

#include "percpu/percpu.h"

#include <cerrno>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/registration.hpp"

extern "C" {

// Out of line anyway, so each entry point can afford to make sure percpu has
// started: C callers include allocators that run before constructors do.
#define PERCPU_STARTED() __builtin_expect(percpu::internal::ensure_initialized(), 1)

int percpu_cpu_id(void) {
  return PERCPU_STARTED() ? percpu::cpu_id() : percpu::internal::cpu_id_slow();
}

int percpu_node_id(void) {
  return PERCPU_STARTED() ? percpu::node_id() : percpu::internal::node_id_slow();
}

int percpu_concurrency_id(void) {
  return PERCPU_STARTED() ? percpu::concurrency_id() : percpu::internal::cpu_id_slow();
}

int percpu_max_cpus(void) { return percpu::max_cpus(); }

int percpu_sched_getcpu(void) {
  if (PERCPU_STARTED()) {
    const int id = percpu::internal::load_tp_relative_i32(percpu::internal::g_fast_path.cpu_id);
    if (__builtin_expect(id >= 0, 1)) return id;
    if (percpu::internal::registered_rseq_area() != nullptr) return percpu::cpu_id();
  }
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
