/* The C header compiles as C, links from C, and answers like the kernel. */
#define _GNU_SOURCE
#include "percpu/percpu.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
  cpu_set_t allowed, one;
  int failures = 0, checked = 0;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return 2;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return 2;
    unsigned kernel_cpu = 0, kernel_node = 0;
    syscall(SYS_getcpu, &kernel_cpu, &kernel_node, NULL);
    if (percpu_cpu_id() != cpu || percpu_sched_getcpu() != cpu ||
        percpu_node_id() != (int)kernel_node || (int)kernel_cpu != cpu ||
        percpu_concurrency_id() >= percpu_max_cpus() || cpu >= percpu_max_cpus()) {
      fprintf(stderr, "C API disagrees with the kernel on CPU %d\n", cpu);
      failures++;
    }
    checked++;
  }
  /* The mode queries name a value from their lists. */
  const enum percpu_sections sections = percpu_sections_status();
  if (strcmp(percpu_sections_name(sections), "unknown") == 0 ||
      (strcmp(percpu_rseq_owner_name(), "none") != 0 &&
       strcmp(percpu_rseq_owner_name(), "glibc") != 0 &&
       strcmp(percpu_rseq_owner_name(), "percpu") != 0 &&
       strcmp(percpu_rseq_owner_name(), "other") != 0)) {
    fprintf(stderr, "C API mode queries name no known value\n");
    failures++;
  }
  printf("C API checked on %d CPUs, backend %s, rseq owner %s, sections %s: %d passed, %d failed\n",
         checked, percpu_backend_name(), percpu_rseq_owner_name(), percpu_sections_name(sections),
         checked - failures, failures);
  return failures == 0 && checked > 0 ? 0 : 1;
}
