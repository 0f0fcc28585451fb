/* getcpu_early_caller: a shared library whose constructor calls
 * sched_getcpu() and getcpu() before the preload's constructors have run, the
 * way a malloc implementation does on its first allocation. Listed after
 * libpercpu_getcpu.so in LD_PRELOAD, its constructor runs first (the dynamic
 * loader initialises later preloads earlier). It prints
 *   early calls: ok        or        early calls: FAILED (...)
 * on stdout and knows nothing of percpu.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ERRNO_SENTINEL 12345

__attribute__((constructor)) static void call_early(void) {
  cpu_set_t allowed, one;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    printf("early calls: FAILED (sched_getaffinity)\n");
    return;
  }
  int bad = 0, checked = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && bad == 0; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) {
      bad = 1;
      break;
    }
    unsigned kernel_cpu = 0, kernel_node = 0, got_cpu = ~0u, got_node = ~0u;
    syscall(SYS_getcpu, &kernel_cpu, &kernel_node, NULL);
    errno = ERRNO_SENTINEL;
    const int got = sched_getcpu();
    if (got != cpu || (int)kernel_cpu != cpu) bad = 2;
    if (getcpu(&got_cpu, NULL) != 0 || (int)got_cpu != cpu) bad = 3;
    if (getcpu(&got_cpu, &got_node) != 0 || (int)got_cpu != cpu || got_node != kernel_node) bad = 4;
    if (errno != ERRNO_SENTINEL) bad = 5;
    if (bad != 0)
      printf("early calls: FAILED (check %d on CPU %d: sched_getcpu said %d)\n", bad, cpu, got);
    ++checked;
  }
  sched_setaffinity(0, sizeof(allowed), &allowed);
  if (bad == 0 && checked > 0) printf("early calls: ok\n");
  fflush(stdout);
}
