// --structures' memory table: what one instance of each structure costs in
// resident memory, beside what a user would pick instead.
//
// Each figure comes from a fresh run of this binary (a child), so no earlier
// row's freed heap or half-filled per-CPU chunk lowers it. The child makes
// `instances` objects, uses each once as a program would (an add, a get and
// a put, a read and a write lock, a push and a pop, an allocation and its
// free) and keeps them all; then it does it again, and reports the second
// batch's growth of its resident anonymous memory (/proc/self/smaps_rollup)
// divided by the count: what each further instance costs, without what a
// process pays once. Everything the objects cost is in it: the objects
// themselves, their per-CPU and per-thread memory, the mappings they make,
// the heap they take. "Without rseq" runs the child under a seccomp filter
// that fails rseq(2), as the structures table does.

#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/free_list.hpp"
#include "percpu/object_pool.hpp"
#include "percpu/per_cpu.hpp"
#include "percpu/ref.hpp"
#include "percpu/shared_mutex.hpp"
#include "tools/percpu_bench.hpp"
#include "tests/support/pages.hpp"  // test::resident_bytes, shared with the tests
#include "tools/seccomp_deny_rseq.hpp"

namespace percpu {
namespace bench {
namespace {

// Makes n objects, uses each once, and keeps them (the child exits after).
using make_fn = void (*)(long n);

struct memory_kind {
  const char* name;
  const char* label;
  const char* alternative_label;
  long instances;
  make_fn percpu;
  make_fn alternative;  // nullptr: nothing a user would make per instance
};

// What the batches made, reachable until the child exits (so a leak checker
// in a sanitizer build sees it kept, not lost).
void* g_kept[16];
int g_kept_count = 0;
template <typename T>
T* keep(T* objects) {
  if (g_kept_count < 16) g_kept[g_kept_count++] = objects;
  return objects;
}
template <typename T>
T* keep_array(long n) {
  return keep(new T[static_cast<std::size_t>(n)]);
}

void make_counters(long n) {
  counter* c = keep_array<counter>(n);
  for (long i = 0; i < n; ++i) c[i].add(1);
}
void make_atomics(long n) {
  auto* a = keep_array<std::atomic<std::int64_t>>(n);
  for (long i = 0; i < n; ++i) a[i].fetch_add(1, std::memory_order_relaxed);
}
// per_cpu<T> for a T of two counts, against the two atomics it replaces.
struct two_counts {
  std::int64_t hits;
  std::int64_t bytes;
};
void make_per_cpus(long n) {
  per_cpu<two_counts>* p = keep_array<per_cpu<two_counts>>(n);
  for (long i = 0; i < n; ++i) {
    p[i].add(&two_counts::hits, std::int64_t{1});
    p[i].add(&two_counts::bytes, std::int64_t{64});
  }
}
struct two_atomics {
  std::atomic<std::int64_t> hits;
  std::atomic<std::int64_t> bytes;
};
void make_atomic_pairs(long n) {
  two_atomics* a = keep_array<two_atomics>(n);
  for (long i = 0; i < n; ++i) {
    a[i].hits.fetch_add(1, std::memory_order_relaxed);
    a[i].bytes.fetch_add(64, std::memory_order_relaxed);
  }
}
void make_refs(long n) {
  ref* r = keep(std::allocator<ref>().allocate(static_cast<std::size_t>(n)));
  for (long i = 0; i < n; ++i) {
    new (&r[i]) ref(nullptr);
    r[i].get();
    r[i].put();
  }
}
void make_atomic_counts(long n) {
  auto* a = keep_array<std::atomic<std::int64_t>>(n);
  for (long i = 0; i < n; ++i) {
    a[i].store(1, std::memory_order_relaxed);
    a[i].fetch_add(1, std::memory_order_relaxed);
    a[i].fetch_sub(1, std::memory_order_acq_rel);
  }
}
template <typename Mutex>
void make_mutexes(long n) {
  Mutex* m = keep_array<Mutex>(n);
  for (long i = 0; i < n; ++i) {
    m[i].lock_shared();
    m[i].unlock_shared();
    m[i].lock();
    m[i].unlock();
  }
}
void make_free_lists(long n) {
  free_list* lists = keep_array<free_list>(n);
  free_list_node* nodes = keep_array<free_list_node>(n);
  for (long i = 0; i < n; ++i) {
    lists[i].push(&nodes[i]);
    (void)lists[i].pop();
  }
}
struct vector_stack {
  std::mutex mutex;
  std::vector<free_list_node*> nodes;
};
void make_vector_stacks(long n) {
  vector_stack* stacks = keep_array<vector_stack>(n);
  free_list_node* nodes = keep_array<free_list_node>(n);
  for (long i = 0; i < n; ++i) {
    std::lock_guard<std::mutex> hold(stacks[i].mutex);
    stacks[i].nodes.push_back(&nodes[i]);
    stacks[i].nodes.pop_back();
  }
}
void make_pools(long n) {
  object_pool::options o;
  o.object_size = 64;
  object_pool* pools = keep(std::allocator<object_pool>().allocate(static_cast<std::size_t>(n)));
  for (long i = 0; i < n; ++i) {
    new (&pools[i]) object_pool(o);
    pools[i].deallocate(pools[i].allocate());
  }
}

const std::vector<memory_kind> kMemoryKinds = {
    {"counter", "percpu::counter", "std::atomic<std::int64_t>", 10000, make_counters,
     make_atomics},
    {"per_cpu", "percpu::per_cpu (T: two int64_t)", "two std::atomic<std::int64_t>", 10000,
     make_per_cpus, make_atomic_pairs},
    {"ref", "percpu::ref", "std::atomic<std::int64_t> reference count", 10000, make_refs,
     make_atomic_counts},
    {"shared_mutex", "percpu::shared_mutex", "std::shared_mutex", 10000,
     make_mutexes<shared_mutex>, make_mutexes<std::shared_mutex>},
    {"free_list", "percpu::free_list", "mutex-protected std::vector stack", 10000,
     make_free_lists, make_vector_stacks},
    // A pool per object is unusual; a few hundred say what one costs. malloc
    // has no instances to count.
    {"object_pool", "percpu::object_pool (64-byte objects)", "glibc malloc (one per process)", 300,
     make_pools, nullptr},
};

const memory_kind* find_kind(const std::string& name) {
  for (const memory_kind& k : kMemoryKinds) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// Runs "memory[-without-rseq]:NAME:SIDE" in a child; the figure, or -1.
double measure_in_child(const std::string& row) {
  std::string out;
  const int status = run_capture({self_path(), "--internal-child", row}, {}, false, &out);
  double bytes = -1;
  if (status != 0 || std::sscanf(out.c_str(), "bytes %lf", &bytes) != 1) return -1;
  return bytes;
}

}  // namespace

std::vector<memory_row> measure_memory(const options&) {
  std::vector<memory_row> rows;
  const std::string prefix = kMemoryChildPrefix;
  for (const memory_kind& k : kMemoryKinds) {
    memory_row row;
    row.name = k.name;
    row.label = k.label;
    row.alternative_label = k.alternative_label;
    row.instances = k.instances;
    row.with_rseq = measure_in_child(prefix + ":" + k.name + ":percpu");
    row.without_rseq = measure_in_child(prefix + "-without-rseq:" + k.name + ":percpu");
    if (k.alternative != nullptr) {
      row.alternative = measure_in_child(prefix + ":" + k.name + ":alternative");
    }
    if (row.with_rseq < 0 || row.without_rseq < 0 || (k.alternative != nullptr && row.alternative < 0)) {
      row.reason = "a child process failed";
    }
    rows.push_back(row);
  }
  return rows;
}

int run_memory_child(const options& opts) {
  // "memory:NAME:SIDE" or "memory-without-rseq:NAME:SIDE".
  const std::string& row = opts.child_row;
  const std::size_t first = row.find(':');
  const std::size_t second = row.find(':', first + 1);
  if (first == std::string::npos || second == std::string::npos) {
    std::fprintf(stderr, "percpu-bench: bad memory row '%s'\n", row.c_str());
    return 2;
  }
  const std::string mode = row.substr(0, first);
  const memory_kind* kind = find_kind(row.substr(first + 1, second - first - 1));
  const std::string side = row.substr(second + 1);
  if (kind == nullptr || (side != "percpu" && side != "alternative") ||
      (side == "alternative" && kind->alternative == nullptr)) {
    std::fprintf(stderr, "percpu-bench: bad memory row '%s'\n", row.c_str());
    return 2;
  }
  if (mode == std::string(kMemoryChildPrefix) + "-without-rseq") {
    // As for the structures: glibc decides at start-up whether to register
    // rseq, so the filter goes in first and the binary runs again under it.
    if (!tools::deny_rseq(ENOSYS)) {
      std::perror("percpu-bench: installing the seccomp filter");
      return 1;
    }
    const std::string self = self_path();
    std::string again = std::string(kMemoryChildPrefix) + row.substr(first);
    std::string flag = "--internal-child";
    char* argv[] = {const_cast<char*>(self.c_str()), &flag[0], &again[0], nullptr};
    execv(self.c_str(), argv);
    std::perror("percpu-bench: re-running itself without rseq");
    return 1;
  }
  if (mode != kMemoryChildPrefix) {
    std::fprintf(stderr, "percpu-bench: bad memory row '%s'\n", row.c_str());
    return 2;
  }
  // A first batch, not counted, takes what is paid once per process (start-up,
  // malloc's arena, the first chunk of per-CPU memory): the figure is what
  // each further instance costs.
  const make_fn make = side == "percpu" ? kind->percpu : kind->alternative;
  make(kind->instances);
  const long before = test::resident_bytes();
  make(kind->instances);
  const long after = test::resident_bytes();
  if (before < 0 || after < 0) return 1;
  const double bytes = static_cast<double>(after - before);
  std::printf("bytes %.17g\n", bytes / static_cast<double>(kind->instances));
  return 0;
}

}  // namespace bench
}  // namespace percpu
