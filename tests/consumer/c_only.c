/* A C program linked by the C compiler driver alone, as a C user would. */
#include <percpu/percpu.h>
#include <stdio.h>

int main(void) {
  const int cpu = percpu_sched_getcpu();
  const int ok = cpu >= 0 && cpu < percpu_max_cpus();
  printf("c consumer: cpu %d, backend %s: %s\n", cpu, percpu_backend_name(), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
