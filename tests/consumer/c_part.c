/* The consumer's C side: percpu/percpu.h compiled as C. Returns 0 when the C
 * API's answers are in range. */
#include <percpu/percpu.h>

int consumer_c_part(void) {
  const int max = percpu_max_cpus();
  const int cpu = percpu_sched_getcpu();
  return max > 0 && cpu >= 0 && cpu < max && percpu_cpu_id() < max &&
                 percpu_backend_name()[0] != '\0'
             ? 0
             : 1;
}
