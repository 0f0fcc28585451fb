/* jemalloc_churn: threads that allocate and free small blocks, timed. An
 * ordinary program linked to jemalloc and to nothing of percpu; with
 * MALLOC_CONF=percpu_arena:percpu jemalloc asks sched_getcpu() which arena to
 * use, so the preload can change its speed without a rebuild.
 *
 *   jemalloc_churn THREADS ROUNDS
 *
 * Prints "churn ns_per_op=X ops=N". Exit 2 on bad usage.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kBatch = 64 };

static long rounds;

static void* churn(void* arg) {
  unsigned seed = (unsigned)(size_t)arg;
  void* blocks[kBatch];
  for (long r = 0; r < rounds; ++r) {
    for (int i = 0; i < kBatch; ++i) {
      seed = seed * 1103515245u + 12345u;
      blocks[i] = malloc(16 + (seed >> 16) % 240);
      if (blocks[i] == NULL) abort();
      *(volatile char*)blocks[i] = (char)i;
    }
    for (int i = 0; i < kBatch; ++i) free(blocks[i]);
  }
  return NULL;
}

int main(int argc, char** argv) {
  const long threads = argc == 3 ? strtol(argv[1], NULL, 10) : 0;
  rounds = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
  if (threads <= 0 || threads > 1024 || rounds <= 0) {
    fprintf(stderr, "usage: jemalloc_churn THREADS ROUNDS\n");
    return 2;
  }
  pthread_t* ids = calloc((size_t)threads, sizeof(pthread_t));
  struct timespec start, stop;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (long t = 0; t < threads; ++t) {
    if (pthread_create(&ids[t], NULL, churn, (void*)(size_t)(t + 1)) != 0) return 2;
  }
  for (long t = 0; t < threads; ++t) pthread_join(ids[t], NULL);
  clock_gettime(CLOCK_MONOTONIC, &stop);
  free(ids);
  const double ns =
      (double)(stop.tv_sec - start.tv_sec) * 1e9 + (double)(stop.tv_nsec - start.tv_nsec);
  const double ops = (double)threads * (double)rounds * kBatch * 2;
  printf("churn ns_per_op=%.3f ops=%.0f\n", ns / ops, ops);
  return 0;
}
