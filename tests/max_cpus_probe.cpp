// Prints what percpu reports about CPU ids, for hidden_sys_test.cpp, which
// runs it in a mount namespace where /sys is hidden or altered:
//   max_cpus=N cpumask_bits=B ids_in_range=0|1 bounds_every_id=0|1
// ids_in_range: cpu_id() and concurrency_id(), asked on every allowed CPU,
// were all below max_cpus(). bounds_every_id: start-up took max_cpus() for a
// bound on every id the kernel reports (so the inline id paths read the
// kernel's ids unbounded). Exit status 0 when the ids were in range.
// PERCPU_PROBE_WIDEN=1 asks on every CPU the process may use, not only on
// those of the mask it started with.
#include <sched.h>

#include <cstdio>
#include <cstdlib>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/internal/sysfs.hpp"

int main() {
  const int max = percpu::max_cpus();
  // PERCPU_PROBE_WIDEN=1: the probe started (and percpu's start-up ran) on
  // a narrower mask than the process may have; ask on every CPU it may have.
  if (const char* widen = std::getenv("PERCPU_PROBE_WIDEN"); widen != nullptr && *widen == '1') {
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &all);
    sched_setaffinity(0, sizeof(all), &all);  // the kernel keeps what the cpuset allows
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  bool in_range = true;
  // The counter's sections must commit only on a CPU below max_cpus() too:
  // an add on another would write past its slots, and load() would miss it.
  percpu::counter adds;
  long added = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) continue;
    for (int i = 0; i < 100; ++i) {
      const int id = percpu::cpu_id(), cid = percpu::concurrency_id();
      if (id < 0 || id >= max || cid < 0 || cid >= max) in_range = false;
      adds.add(1);
      ++added;
    }
  }
  const bool exact = adds.load() == added;
  std::printf("max_cpus=%d cpumask_bits=%d ids_in_range=%d bounds_every_id=%d adds_exact=%d\n",
              max, percpu::internal::kernel_cpumask_bits(), in_range ? 1 : 0,
              percpu::internal::max_cpus_bounds_every_id() ? 1 : 0, exact ? 1 : 0);
  return in_range && exact ? 0 : 1;
}
