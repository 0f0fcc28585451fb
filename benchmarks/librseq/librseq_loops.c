/* librseq's side of benchmarks/librseq/side_by_side.cpp: the same loops as
 * percpu's side, each operation inlined from librseq's own headers, a
 * compiler barrier between operations. Built only by
 * scripts/bench_librseq.sh, against a librseq the user cloned; percpu never
 * ships or needs it. */
#define _GNU_SOURCE
#include <rseq/mempool.h>
#include <rseq/rseq.h>
#include <stddef.h>
#include <stdint.h>

#define BARRIER() __asm__ __volatile__("" ::: "memory")

struct librseq_counter {
  intptr_t count;
};

static struct rseq_mempool* pool;

/* A pool of per-CPU counters with librseq's default stride, as its
 * documentation's counter example makes. */
void* librseq_counter_create(void) {
  if (pool == NULL) {
    struct rseq_mempool_attr* attr = rseq_mempool_attr_create();
    if (attr == NULL || rseq_mempool_attr_set_percpu(attr, RSEQ_MEMPOOL_STRIDE, 0) != 0) return NULL;
    pool = rseq_mempool_create("side_by_side", sizeof(struct librseq_counter), attr);
    rseq_mempool_attr_destroy(attr);
    if (pool == NULL) return NULL;
  }
  return (void*)rseq_mempool_percpu_zmalloc(pool);
}

int librseq_register(void) { return rseq_register_current_thread(); }
int librseq_max_cpus(void) { return rseq_get_max_nr_cpus(); }

int64_t librseq_cpu_loop(long n) {
  int64_t sum = 0;
  for (long i = 0; i < n; ++i) {
    sum += rseq_current_cpu_raw();
    BARRIER();
  }
  return sum;
}

/* One add of 1 to this CPU's copy of the item, as librseq's documentation
 * writes it: retried until the section commits. */
static inline void librseq_add_one(void* item) {
  struct librseq_counter __rseq_percpu* c = (struct librseq_counter __rseq_percpu*)item;
  for (;;) {
    int cpu = rseq_cpu_start();
    if (rseq_load_add_store__ptr(RSEQ_MO_RELAXED, RSEQ_PERCPU_CPU_ID,
                                 &rseq_percpu_ptr(c, cpu)->count, 1, cpu) == 0) {
      return;
    }
  }
}

void librseq_add_loop(void* item, long n) {
  for (long i = 0; i < n; ++i) {
    librseq_add_one(item);
    BARRIER();
  }
}

/* The same add with the item's pointer read from memory at each add, as a
 * program that keeps it in a struct or a global does (and as percpu's
 * counter reads its slots' pointer from the counter): the loop above keeps
 * it in a register, which the compiler barrier does not clobber. */
void* librseq_item_in_memory;

void librseq_add_loop_from_memory(long n) {
  for (long i = 0; i < n; ++i) {
    librseq_add_one(librseq_item_in_memory);
    BARRIER();
  }
}

/* Summing the item over the CPUs, as a reader of librseq's counter does. */
int64_t librseq_sum(void* item, int cpus) {
  struct librseq_counter __rseq_percpu* c = (struct librseq_counter __rseq_percpu*)item;
  int64_t sum = 0;
  for (int cpu = 0; cpu < cpus; ++cpu) sum += RSEQ_READ_ONCE(rseq_percpu_ptr(c, cpu)->count);
  return sum;
}

int64_t librseq_sum_loop(void* item, int cpus, long n) {
  int64_t total = 0;
  for (long i = 0; i < n; ++i) {
    total += librseq_sum(item, cpus);
    BARRIER();
  }
  return total;
}

/* The sum with the item's pointer and the CPU count read from memory at each
 * sum, as a reader that keeps them in a struct does (percpu's load() reads
 * its slots' pointer and max_cpus() from memory). */
int librseq_cpus_in_memory;

int64_t librseq_sum_loop_from_memory(long n) {
  int64_t total = 0;
  for (long i = 0; i < n; ++i) {
    total += librseq_sum(librseq_item_in_memory, librseq_cpus_in_memory);
    BARRIER();
  }
  return total;
}

/* A per-CPU intrusive list the way librseq's API makes one (the kernel
 * selftests' basic_percpu_ops shape): a head per CPU on its own 128 bytes,
 * push by compare-and-store of the head, pop by librseq's
 * load-compare-store-of-the-successor, both retried while the section
 * aborts. */
struct librseq_node {
  struct librseq_node* next;
};
struct librseq_head {
  struct librseq_node* head;
} __attribute__((aligned(128)));
static struct librseq_head librseq_heads[CPU_SETSIZE];
/* Each thread's node on lines of its own, as percpu's side has them: a
 * pop+push writes its node, and two threads' nodes on one line would make
 * the two-thread rows measure the line moving between CPUs. */
static struct librseq_node_line {
  struct librseq_node node;
} __attribute__((aligned(128))) librseq_nodes[CPU_SETSIZE];

static inline void librseq_push(struct librseq_node* node) {
  for (;;) {
    int cpu = rseq_cpu_start();
    struct librseq_node* expect = RSEQ_READ_ONCE(librseq_heads[cpu].head);
    node->next = expect;
    if (rseq_load_cbne_store__ptr(RSEQ_MO_RELAXED, RSEQ_PERCPU_CPU_ID,
                                  (intptr_t*)&librseq_heads[cpu].head, (intptr_t)expect,
                                  (intptr_t)node, cpu) == 0) {
      return;
    }
  }
}

static inline struct librseq_node* librseq_pop(void) {
  for (;;) {
    int cpu = rseq_cpu_start();
    intptr_t head;
    int ret = rseq_load_cbeq_store_add_load_store__ptr(
        RSEQ_MO_RELAXED, RSEQ_PERCPU_CPU_ID, (intptr_t*)&librseq_heads[cpu].head, 0,
        offsetof(struct librseq_node, next), &head, cpu);
    if (ret == 0) return (struct librseq_node*)head;
    if (ret > 0) return NULL;
  }
}

/* Puts one node on the calling thread's CPU list (its own node, by CPU). */
void librseq_list_prepare(int cpu) { librseq_push(&librseq_nodes[cpu].node); }

/* pop+push of the node on this CPU's list, as percpu-bench's free_list row. */
void librseq_list_loop(long n) {
  for (long i = 0; i < n; ++i) {
    struct librseq_node* node = librseq_pop();
    BARRIER();
    if (node != NULL) librseq_push(node);
    BARRIER();
  }
}
