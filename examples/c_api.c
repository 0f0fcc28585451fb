/* Example: the C API (percpu/percpu.h).
 *
 * Per-CPU hit counters in C: an array sized by percpu_max_cpus(), indexed by
 * percpu_cpu_id(). The id is a hint (the thread may move right after reading
 * it), so each slot is still updated atomically; what the id buys is that
 * threads on different CPUs touch different cache lines.
 *
 * Build against an installed percpu (a C++ library underneath, so link with
 * the C++ driver or add -lstdc++):
 *   gcc -c c_api.c $(pkg-config --cflags percpu)
 *   g++ c_api.o $(pkg-config --libs percpu)
 */
#include <percpu/percpu.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct slot {
  _Alignas(64) long hits;
};

static struct slot* slots;

static void* worker(void* arg) {
  const long n = *(const long*)arg;
  for (long i = 0; i < n; ++i) {
    __atomic_fetch_add(&slots[percpu_cpu_id()].hits, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

int main(void) {
  const int max_cpus = percpu_max_cpus();
  slots = calloc((size_t)max_cpus, sizeof(*slots));
  if (slots == NULL) return 2;

  /* sched_getcpu() semantics: -1 and errno only when nothing can tell. */
  const int cpu = percpu_sched_getcpu();
  if (cpu < 0) {
    perror("percpu_sched_getcpu");
    return 1;
  }
  printf("on cpu %d of %d possible, node %d, backend %s\n", cpu, max_cpus, percpu_node_id(),
         percpu_backend_name());

  enum { kThreads = 4 };
  long per_thread = 100000;
  pthread_t threads[kThreads];
  for (int t = 0; t < kThreads; ++t) {
    if (pthread_create(&threads[t], NULL, worker, &per_thread) != 0) return 2;
  }
  for (int t = 0; t < kThreads; ++t) pthread_join(threads[t], NULL);

  long total = 0;
  for (int i = 0; i < max_cpus; ++i) {
    if (slots[i].hits != 0) printf("  cpu %d: %ld hits\n", i, slots[i].hits);
    total += slots[i].hits;
  }
  const int ok = total == kThreads * per_thread && cpu < max_cpus;
  printf("%s: %ld hits\n", ok ? "hits exact" : "HITS WRONG", total);
  free(slots);
  return ok ? 0 : 1;
}
