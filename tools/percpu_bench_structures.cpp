// --structures: percpu's structures against the plain alternatives they
// replace, at one and two threads, with rseq (in this process) and without
// it (in a child process of this same binary whose rseq(2) fails with
// ENOSYS, as in a container with an older seccomp profile).
//
// Each figure is ns per operation on each thread's own clock; a repetition's
// figure is the median over its threads. Repetitions are the outer loop, as
// in the seed tables, so a slow drift in the machine's load hits a structure
// and its alternative alike and their ratio stays fair.
//
// The pool's rows against tcmalloc, jemalloc and mimalloc run in children
// of this binary that have the allocator preloaded as malloc (one pair of
// children per allocator: with rseq, and without it), since that is how
// those allocators are used: loaded with dlopen beside the C library's
// malloc they either refuse (jemalloc's static TLS) or fall off their fast
// paths. A child first says which file its malloc came from, so a missing
// library is reported, not measured as glibc's malloc under its name.

#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <thread>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/free_list.hpp"
#include "percpu/object_pool.hpp"
#include "percpu/ref.hpp"
#include "percpu/shared_mutex.hpp"
#include "tools/percpu_bench.hpp"
#include "tools/seccomp_deny_rseq.hpp"

extern "C" {
void percpu_bench_loop_counter_add(std::uint64_t n);
void percpu_bench_loop_per_cpu_atomic(std::uint64_t n);
void percpu_bench_loop_free_list(std::uint64_t n);
void percpu_bench_loop_mutex_vector_stack(std::uint64_t n);
void percpu_bench_loop_object_pool(std::uint64_t n);
void percpu_bench_loop_malloc(std::uint64_t n);
void percpu_bench_loop_object_pool_burst(std::uint64_t n);
void percpu_bench_loop_malloc_burst(std::uint64_t n);
void percpu_bench_loop_object_pool_handoff(std::uint64_t n);
void percpu_bench_loop_malloc_handoff(std::uint64_t n);
void percpu_bench_loop_shared_mutex(std::uint64_t n);
void percpu_bench_loop_std_shared_mutex(std::uint64_t n);
void percpu_bench_loop_shared_mutex_write(std::uint64_t n);
void percpu_bench_loop_std_shared_mutex_write(std::uint64_t n);
void percpu_bench_loop_ref(std::uint64_t n);
void percpu_bench_loop_killed_ref(std::uint64_t n);
void percpu_bench_loop_atomic_refcount(std::uint64_t n);
}

namespace {

// The objects every thread of a row works on, made on first use rather than
// at static initialisation, which may run before the library's own statics
// in another translation unit. Leaked on purpose: the structures register
// fork handlers, and a destructor at exit could race a thread still running.
percpu::counter g_counter;
percpu::shared_mutex g_shared_mutex;
percpu::shared_mutex g_shared_mutex_for_writes;

struct alignas(64) padded_atomic {
  std::atomic<std::int64_t> value{0};
};
struct vector_stack {
  std::mutex mutex;
  std::vector<percpu::free_list_node*> nodes;
};
constexpr std::size_t kObjectSize = 64;
// Live objects per burst: twice object_pool's default cache capacity (128),
// as a program that holds a few hundred objects at a time does. With rseq
// a CPU's cache and its two spares hold three times the capacity, so a
// burst stays on its CPU once the cache's fill has settled; without rseq it
// goes through the depot for every batch beyond one cache.
constexpr std::uint64_t kBurst = 256;

struct shared_objects {
  padded_atomic* slots = new padded_atomic[static_cast<std::size_t>(percpu::max_cpus())];
  percpu::free_list* list = new percpu::free_list;
  vector_stack* stack = new vector_stack;
  percpu::object_pool* pool = [] {
    percpu::object_pool::options o;
    o.object_size = kObjectSize;
    // The alternative, glibc malloc, checks nothing on its fast path either.
    o.checks = false;
    return new percpu::object_pool(o);
  }();
  std::shared_mutex* std_shared_mutex = new std::shared_mutex;
  std::shared_mutex* std_shared_mutex_for_writes = new std::shared_mutex;
  percpu::ref* ref = new percpu::ref(nullptr);
  // Killed, and kept alive by the reference taken before: every get and
  // put goes to its atomic count, as after any kill().
  percpu::ref* killed_ref = [] {
    auto* r = new percpu::ref(nullptr);
    r->get();
    r->kill();
    return r;
  }();
  padded_atomic* count = [] {
    auto* c = new padded_atomic;
    c->value = 1;
    return c;
  }();
};

shared_objects& objects() {
  static shared_objects* o = new shared_objects;
  return *o;
}

// Hands a pointer to the compiler as if it were used, so a malloc/free or
// allocate/deallocate pair cannot be folded away.
template <typename T>
inline void keep(T*& p) {
  asm volatile("" : "+r"(p));
}

// The two sides of the allocation rows: the pool's allocate and deallocate,
// and the process's malloc and free, of kObjectSize bytes.
struct pool_objects {
  percpu::object_pool* pool;
  void* make() const {
    void* p = pool->allocate();
    keep(p);
    return p;
  }
  void drop(void* p) const { pool->deallocate(p); }
};
struct malloc_objects {
  void* make() const {
    void* p = std::malloc(kObjectSize);
    keep(p);
    return p;
  }
  void drop(void* p) const { std::free(p); }
};

// k objects made into held[0..k), then dropped, oldest first.
template <typename Side>
void make_then_drop(void** held, std::uint64_t k, const Side& side) {
  for (std::uint64_t j = 0; j < k; ++j) held[j] = side.make();
  for (std::uint64_t j = 0; j < k; ++j) side.drop(held[j]);
}

// n objects made and dropped in bursts of kBurst.
template <typename Side>
void in_bursts(std::uint64_t n, const Side& side) {
  void* held[kBurst];
  for (std::uint64_t done = 0; done < n;) {
    const std::uint64_t k = std::min(kBurst, n - done);
    make_then_drop(held, k, side);
    done += k;
  }
}

// Which thread of its row the calling thread is, and how many there are
// (run_threads sets them before each loop), for loops whose threads play
// different parts.
thread_local int t_row_thread = 0;
thread_local int t_row_threads = 1;

// Objects per batch a producer hands to its consumer: a server's queue of
// requests or a log's records, far more than any per-CPU cache holds, so
// every object is allocated on one CPU and freed on the other.
constexpr std::size_t kHandoffBatch = 4096;

// A single-producer, single-consumer ring of batches of objects: the
// producer (thread 0) fills a slot and publishes it, the consumer (thread 1)
// frees a published slot's objects and gives the slot back. Both run the
// same n, so they cut it into the same batches, and a run leaves the ring
// empty for the next (the pool's and the allocator's loops take turns on
// it, never at once).
struct handoff_ring {
  static constexpr std::uint64_t kSlots = 4;
  void* objects[kSlots][kHandoffBatch];
  alignas(64) std::atomic<std::uint64_t> published{0};
  alignas(64) std::atomic<std::uint64_t> released{0};
};

handoff_ring& ring() {
  static handoff_ring* r = new handoff_ring;
  return *r;
}

// Waits, spinning then yielding, for `ready`: the other thread runs on its
// own CPU and is never far behind, but where both share one CPU the
// yield lets it run.
template <typename Ready>
void wait_for(Ready&& ready) {
  for (int spins = 0; !ready(); ++spins) {
    if (spins < 1000) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

// n objects through the ring: thread 0 makes every one, thread 1 drops
// every one; a row of one thread makes a batch, then drops it. The figure
// is per object.
template <typename Side>
void handoff(std::uint64_t n, const Side& side) {
  handoff_ring& r = ring();
  for (std::uint64_t done = 0; done < n;) {
    const std::uint64_t k = std::min<std::uint64_t>(kHandoffBatch, n - done);
    if (t_row_threads == 1) {
      make_then_drop(r.objects[0], k, side);
    } else if (t_row_thread == 0) {
      const std::uint64_t batch = r.published.load(std::memory_order_relaxed);
      wait_for([&] {
        return batch - r.released.load(std::memory_order_acquire) < handoff_ring::kSlots;
      });
      void** slot = r.objects[batch % handoff_ring::kSlots];
      for (std::uint64_t j = 0; j < k; ++j) slot[j] = side.make();
      r.published.store(batch + 1, std::memory_order_release);
    } else {
      const std::uint64_t batch = r.released.load(std::memory_order_relaxed);
      wait_for([&] { return r.published.load(std::memory_order_acquire) != batch; });
      void** slot = r.objects[batch % handoff_ring::kSlots];
      for (std::uint64_t j = 0; j < k; ++j) side.drop(slot[j]);
      r.released.store(batch + 1, std::memory_order_release);
    }
    done += k;
  }
}

}  // namespace

extern "C" {

void percpu_bench_loop_counter_add(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) g_counter.add(1);
}

void percpu_bench_loop_per_cpu_atomic(std::uint64_t n) {
  shared_objects& o = objects();
  for (std::uint64_t i = 0; i < n; ++i) {
    o.slots[percpu::cpu_id()].value.fetch_add(1, std::memory_order_relaxed);
  }
}

// Each thread brings one node of its own and deletes the one it holds at the
// end (maybe another thread's: every push is followed by the same thread's
// pop, so each thread holds exactly one node outside its push and pop, and no
// node outlives the loops or is shared at the end).
void percpu_bench_loop_free_list(std::uint64_t n) {
  shared_objects& o = objects();
  auto* mine = new percpu::free_list_node{};
  for (std::uint64_t i = 0; i < n; ++i) {
    o.list->push(mine);
    // pop() may come back empty while another thread's steal holds the nodes
    // for a moment (it never waits); that is part of its cost.
    do {
      mine = o.list->pop();
    } while (mine == nullptr);
  }
  delete mine;
}

void percpu_bench_loop_mutex_vector_stack(std::uint64_t n) {
  shared_objects& o = objects();
  auto* mine = new percpu::free_list_node{};
  for (std::uint64_t i = 0; i < n; ++i) {
    {
      std::lock_guard<std::mutex> lock(o.stack->mutex);
      o.stack->nodes.push_back(mine);
    }
    std::lock_guard<std::mutex> lock(o.stack->mutex);
    mine = o.stack->nodes.back();
    o.stack->nodes.pop_back();
  }
  delete mine;
}

void percpu_bench_loop_object_pool(std::uint64_t n) {
  shared_objects& o = objects();
  for (std::uint64_t i = 0; i < n; ++i) {
    void* p = o.pool->allocate();
    keep(p);
    o.pool->deallocate(p);
  }
}

void percpu_bench_loop_malloc(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    void* p = std::malloc(kObjectSize);
    keep(p);
    std::free(p);
  }
}

// n allocations and n frees, in bursts: kBurst allocations, then their
// frees, oldest first. The figure is per allocation+free pair.
void percpu_bench_loop_object_pool_burst(std::uint64_t n) {
  in_bursts(n, pool_objects{objects().pool});
}

void percpu_bench_loop_malloc_burst(std::uint64_t n) { in_bursts(n, malloc_objects{}); }

void percpu_bench_loop_object_pool_handoff(std::uint64_t n) {
  handoff(n, pool_objects{objects().pool});
}

void percpu_bench_loop_malloc_handoff(std::uint64_t n) { handoff(n, malloc_objects{}); }

void percpu_bench_loop_shared_mutex(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    g_shared_mutex.lock_shared();
    g_shared_mutex.unlock_shared();
  }
}

void percpu_bench_loop_std_shared_mutex(std::uint64_t n) {
  shared_objects& o = objects();
  for (std::uint64_t i = 0; i < n; ++i) {
    o.std_shared_mutex->lock_shared();
    o.std_shared_mutex->unlock_shared();
  }
}

// Writers one after another and no reader: a burst, whose first writer
// alone fences the readers with membarrier (see percpu/shared_mutex.hpp).
void percpu_bench_loop_shared_mutex_write(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    g_shared_mutex_for_writes.lock();
    g_shared_mutex_for_writes.unlock();
  }
}

void percpu_bench_loop_std_shared_mutex_write(std::uint64_t n) {
  shared_objects& o = objects();
  for (std::uint64_t i = 0; i < n; ++i) {
    o.std_shared_mutex_for_writes->lock();
    o.std_shared_mutex_for_writes->unlock();
  }
}

void percpu_bench_loop_ref(std::uint64_t n) {
  shared_objects& o = objects();
  for (std::uint64_t i = 0; i < n; ++i) {
    o.ref->get();
    o.ref->put();
  }
}

void percpu_bench_loop_killed_ref(std::uint64_t n) {
  shared_objects& o = objects();
  for (std::uint64_t i = 0; i < n; ++i) {
    o.killed_ref->get();
    o.killed_ref->put();
  }
}

// What a put must do on a plain reference count: the release half so the
// last owner sees every other owner's writes, the acquire half for the last
// owner itself.
void percpu_bench_loop_atomic_refcount(std::uint64_t n) {
  shared_objects& o = objects();
  for (std::uint64_t i = 0; i < n; ++i) {
    o.count->value.fetch_add(1, std::memory_order_relaxed);
    o.count->value.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // extern "C"

namespace percpu {
namespace bench {
namespace {

constexpr double kStructureProbeNs = 2e6;
constexpr std::uint64_t kStructureMinCalls = 100;

// The bars: percpu's own targets for its structures. The counter must beat
// the best plain per-CPU counter clearly with rseq and stay near it without;
// every other structure must at least match what it replaces.
// The goals are the alternative's time / percpu's. The counter's were set
// the other way round (percpu / alternative at most 0.43 with rseq, at most
// 1.2 without): inverted and rounded to the two places printed, 2.33 and 0.83.
constexpr const char* kTcmalloc = "libtcmalloc_minimal.so.4";
constexpr const char* kJemalloc = "libjemalloc.so.2";
constexpr const char* kMimalloc = "libmimalloc.so.2";
// The Debian package that installs each, for the reason a row is missing.
const char* package_of(const std::string& library) {
  if (library == kTcmalloc) return "libgoogle-perftools-dev (or libtcmalloc-minimal4)";
  if (library == kJemalloc) return "libjemalloc-dev (or libjemalloc2)";
  if (library == kMimalloc) return "libmimalloc-dev (or libmimalloc2.0)";
  return "its package";
}

const std::vector<structure_kind> kKinds = {
    {"counter_add", "percpu::counter::add(1)", "per-CPU-slot std::atomic fetch_add (relaxed)",
     "per-CPU-slot fetch_add / counter::add", percpu_bench_loop_counter_add,
     percpu_bench_loop_per_cpu_atomic, 2.33, 0.83},
    {"free_list_push_pop", "percpu::free_list push+pop", "mutex-protected std::vector stack",
     "mutex stack / free_list push+pop", percpu_bench_loop_free_list,
     percpu_bench_loop_mutex_vector_stack, 1.0, 1.0},
    {"object_pool_allocate_deallocate", "percpu::object_pool allocate+deallocate",
     "glibc malloc+free (64 bytes)", "malloc+free / object_pool pair",
     percpu_bench_loop_object_pool, percpu_bench_loop_malloc, 1.0, 1.0},
    {"shared_mutex_read", "percpu::shared_mutex lock_shared+unlock_shared",
     "std::shared_mutex lock_shared+unlock_shared", "std::shared_mutex / shared_mutex read",
     percpu_bench_loop_shared_mutex, percpu_bench_loop_std_shared_mutex, 1.0, 1.0},
    // Writes are the rare side: the goal is half std::shared_mutex's speed.
    {"shared_mutex_write", "percpu::shared_mutex lock+unlock, no readers",
     "std::shared_mutex lock+unlock", "std::shared_mutex / shared_mutex write",
     percpu_bench_loop_shared_mutex_write, percpu_bench_loop_std_shared_mutex_write, 0.5, 0.5},
    {"ref_get_put", "percpu::ref get+put", "atomic reference count fetch_add+fetch_sub",
     "atomic count / ref get+put", percpu_bench_loop_ref, percpu_bench_loop_atomic_refcount, 1.0,
     1.0},
    // After kill() a ref is one atomic count, as the kernel's percpu_ref in
    // atomic mode: it must stay near a plain one.
    {"ref_get_put_killed", "percpu::ref after kill(): get+put",
     "atomic reference count fetch_add+fetch_sub", "atomic count / killed ref get+put",
     percpu_bench_loop_killed_ref, percpu_bench_loop_atomic_refcount, 0.8, 0.8},
    // The general allocators a pool user would pick instead, each as the
    // process's malloc. A per-CPU pool that loses to them on its own object
    // size has no reason to exist: pairs must be 1.2 times as fast, bursts
    // (more live objects than a cache holds) at least as fast.
    {"object_pool_vs_tcmalloc", "percpu::object_pool pair (tcmalloc is malloc)",
     "tcmalloc malloc+free (64 bytes, gperftools)", "tcmalloc / object_pool pair",
     percpu_bench_loop_object_pool, percpu_bench_loop_malloc, 1.2, 1.2, kTcmalloc},
    {"object_pool_vs_jemalloc", "percpu::object_pool pair (jemalloc is malloc)",
     "jemalloc malloc+free (64 bytes)", "jemalloc / object_pool pair",
     percpu_bench_loop_object_pool, percpu_bench_loop_malloc, 1.2, 1.2, kJemalloc},
    {"object_pool_vs_mimalloc", "percpu::object_pool pair (mimalloc is malloc)",
     "mimalloc malloc+free (64 bytes)", "mimalloc / object_pool pair",
     percpu_bench_loop_object_pool, percpu_bench_loop_malloc, 1.2, 1.2, kMimalloc},
    {"object_pool_burst_vs_tcmalloc", "percpu::object_pool burst of 256 (tcmalloc is malloc)",
     "tcmalloc 256 mallocs, 256 frees", "tcmalloc / object_pool burst of 256",
     percpu_bench_loop_object_pool_burst, percpu_bench_loop_malloc_burst, 1.0, 1.0, kTcmalloc},
    {"object_pool_burst_vs_jemalloc", "percpu::object_pool burst of 256 (jemalloc is malloc)",
     "jemalloc 256 mallocs, 256 frees", "jemalloc / object_pool burst of 256",
     percpu_bench_loop_object_pool_burst, percpu_bench_loop_malloc_burst, 1.0, 1.0, kJemalloc},
    {"object_pool_burst_vs_mimalloc", "percpu::object_pool burst of 256 (mimalloc is malloc)",
     "mimalloc 256 mallocs, 256 frees", "mimalloc / object_pool burst of 256",
     percpu_bench_loop_object_pool_burst, percpu_bench_loop_malloc_burst, 1.0, 1.0, kMimalloc},
    // Allocated on one CPU, freed on the other (at two threads; one thread
    // allocates a batch, then frees it): the objects cross CPUs through
    // the pool's depot, or the allocator's remote frees.
    {"object_pool_handoff_vs_tcmalloc", "percpu::object_pool handoff of 4096 (tcmalloc is malloc)",
     "tcmalloc malloc on one thread, free on the other", "tcmalloc / object_pool handoff",
     percpu_bench_loop_object_pool_handoff, percpu_bench_loop_malloc_handoff, 1.0, 1.0, kTcmalloc},
    {"object_pool_handoff_vs_jemalloc", "percpu::object_pool handoff of 4096 (jemalloc is malloc)",
     "jemalloc malloc on one thread, free on the other", "jemalloc / object_pool handoff",
     percpu_bench_loop_object_pool_handoff, percpu_bench_loop_malloc_handoff, 1.0, 1.0, kJemalloc},
    {"object_pool_handoff_vs_mimalloc", "percpu::object_pool handoff of 4096 (mimalloc is malloc)",
     "mimalloc malloc on one thread, free on the other", "mimalloc / object_pool handoff",
     percpu_bench_loop_object_pool_handoff, percpu_bench_loop_malloc_handoff, 1.0, 1.0, kMimalloc},
};
const std::vector<int> kThreadCounts = {1, 2};

// Runs loop(n) on `threads` threads, each pinned to its own allowed CPU
// while there are enough, all starting together after a short warm-up of
// their own (a new thread's first operations set up its CPU's caches and,
// without rseq, its thread slot). Returns each thread's ns per operation.
std::vector<double> run_threads(loop_fn loop, std::uint64_t n, int threads) {
  const std::vector<int> cpus = allowed_cpus();
  std::vector<double> per_op(static_cast<std::size_t>(threads), 0);
  barrier start(threads);
  auto body = [&](int t) {
    pin_guard pin(cpus.empty() ? -1 : cpus[static_cast<std::size_t>(t) % cpus.size()]);
    t_row_thread = t;
    t_row_threads = threads;
    loop(std::min<std::uint64_t>(n, kStructureMinCalls));
    start.wait();
    per_op[static_cast<std::size_t>(t)] = time_loop(loop, n) / static_cast<double>(n);
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(body, t);
  body(0);
  for (std::thread& w : workers) w.join();
  return per_op;
}

// Operations per thread per repetition: --calls, or fewer so a repetition
// fits the budget. Probed at the row's own thread count, since contention
// can make an operation many times slower at two threads than at one.
std::uint64_t fit_structure_calls(loop_fn loop, int threads, std::uint64_t cap) {
  std::uint64_t n = std::min<std::uint64_t>(cap, kStructureMinCalls);
  double per_op = median(run_threads(loop, n, threads));
  while (per_op * static_cast<double>(n) < kStructureProbeNs && n < cap) {
    n = std::min<std::uint64_t>(cap, n * 8);
    per_op = median(run_threads(loop, n, threads));
  }
  const double fitted = kStructureBudgetNs / std::max(per_op, 1e-3);
  if (fitted >= static_cast<double>(cap)) return cap;
  return std::max<std::uint64_t>(std::min(cap, kStructureMinCalls),
                                 static_cast<std::uint64_t>(fitted));
}

// Whether a row's alternative runs on `library`'s malloc (nullptr: the C
// library's).
bool of_library(const structure_row& row, const char* library) {
  const char* own = row.kind->malloc_library;
  return own == nullptr || library == nullptr ? own == library : std::strcmp(own, library) == 0;
}

// The file this process's malloc comes from, as the loader names it
// ("/lib/x86_64-linux-gnu/libc.so.6"), or "unknown".
std::string malloc_file() {
  Dl_info info{};
  void* m = dlsym(RTLD_DEFAULT, "malloc");
  if (m == nullptr || dladdr(m, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

bool file_is_library(const std::string& file, const std::string& library) {
  const std::size_t slash = file.rfind('/');
  return file.substr(slash == std::string::npos ? 0 : slash + 1) == library;
}

// Every kind of `library` at every thread count, in this process, into
// `mode` of each row.
void measure_here(const options& opts, std::vector<structure_row>* rows,
                  structure_mode structure_row::*mode, const char* library) {
  use_clock(opts);
  for (structure_row& row : *rows) {
    if (!of_library(row, library)) continue;
    structure_mode& m = row.*mode;
    m.available = true;
    m.backend = to_string(backend());
    for (structure_side* side : {&m.percpu, &m.alternative}) {
      const loop_fn loop = side == &m.percpu ? row.kind->percpu_loop : row.kind->alternative_loop;
      side->available = true;
      side->calls = fit_structure_calls(loop, row.threads, opts.calls);
    }
  }
  for (int rep = 0; rep < opts.repetitions; ++rep) {
    for (structure_row& row : *rows) {
      if (!of_library(row, library)) continue;
      structure_mode& m = row.*mode;
      for (structure_side* side : {&m.percpu, &m.alternative}) {
        const loop_fn loop = side == &m.percpu ? row.kind->percpu_loop : row.kind->alternative_loop;
        const std::vector<double> per_thread = run_threads(loop, side->calls, row.threads);
        side->ns_per_op.push_back(median(per_thread));
        side->all_ns_per_op.insert(side->all_ns_per_op.end(), per_thread.begin(), per_thread.end());
      }
    }
  }
}

std::vector<structure_row> empty_rows() {
  std::vector<structure_row> rows;
  for (const structure_kind& kind : kKinds) {
    for (int threads : kThreadCounts) {
      structure_row row;
      row.kind = &kind;
      row.threads = threads;
      rows.push_back(row);
    }
  }
  return rows;
}

void mark_unavailable(std::vector<structure_row>* rows, structure_mode structure_row::*mode,
                      const char* library, const std::string& reason) {
  for (structure_row& row : *rows) {
    if (!of_library(row, library)) continue;
    (row.*mode).available = false;
    (row.*mode).reason = reason;
  }
}

// The child's figures, one line per side:
//   backend BACKEND malloc FILE
//   side KIND THREADS percpu|alternative CALLS NS_PER_OP... ; ALL_NS_PER_OP... end
// into `mode` of the rows of `library`. False when the text is not that,
// or misses a row; *backend_name and *malloc_from say what the child had.
bool parse_child(const std::string& text, int repetitions, const char* library,
                 std::vector<structure_row>* rows, structure_mode structure_row::*mode,
                 std::string* backend_name, std::string* malloc_from) {
  std::istringstream in(text);
  std::string word, malloc_word;
  if (!(in >> word >> *backend_name >> malloc_word >> *malloc_from) || word != "backend" ||
      malloc_word != "malloc") {
    return false;
  }
  if (library != nullptr && !file_is_library(*malloc_from, library)) return true;
  std::size_t seen = 0, expected = 0;
  for (const structure_row& row : *rows) expected += of_library(row, library) ? 2 : 0;
  while (in >> word) {
    if (word != "side") return false;
    std::string kind, which;
    int threads = 0;
    std::uint64_t calls = 0;
    if (!(in >> kind >> threads >> which >> calls)) return false;
    std::vector<double> medians, all;
    std::string value;
    bool after_separator = false;
    while (in >> value && value != "end") {
      if (value == ";") {
        after_separator = true;
        continue;
      }
      (after_separator ? all : medians).push_back(std::strtod(value.c_str(), nullptr));
    }
    if (medians.size() != static_cast<std::size_t>(repetitions) || all.empty()) return false;
    for (structure_row& row : *rows) {
      if (kind != row.kind->name || threads != row.threads || !of_library(row, library)) continue;
      structure_mode& m = row.*mode;
      m.available = true;
      m.backend = *backend_name;
      structure_side& side = which == "percpu" ? m.percpu : m.alternative;
      side.available = true;
      side.calls = calls;
      side.ns_per_op = medians;
      side.all_ns_per_op = all;
      ++seen;
    }
  }
  return seen == expected;
}

// Runs this binary as child `row` (kStructuresChild or kStructuresDenyChild)
// for the rows of `library`, preloaded when not nullptr, and files its
// figures into `mode`, or the reason there are none.
void measure_in_child(const options& opts, std::string row, const char* library,
                      std::vector<structure_row>* rows, structure_mode structure_row::*mode) {
  const bool deny = row == kStructuresDenyChild;
  std::vector<std::string> env;
  if (library != nullptr) {
    row += kMallocLibrarySeparator;
    row += library;
    env.push_back(std::string("LD_PRELOAD=") + library);
  }
  std::string out, child_backend, malloc_from;
  const int status = run_capture(
      {self_path(), "--calls", std::to_string(opts.calls), "--repetitions",
       std::to_string(opts.repetitions), "--clock", opts.clock, "--internal-child", row},
      env, false, &out);
  const bool parsed =
      parse_child(out, opts.repetitions, library, rows, mode, &child_backend, &malloc_from);
  if (status == 0 && parsed && library != nullptr && !file_is_library(malloc_from, library)) {
    mark_unavailable(rows, mode, library,
                     std::string(library) + " is not installed here (LD_PRELOAD left malloc in " +
                         malloc_from + "; Debian: " + package_of(library) + ")");
    return;
  }
  if (status != 0 || !parsed) {
    mark_unavailable(rows, mode, library,
                     std::string("the child process") + (deny ? " without rseq" : "") +
                         " failed (status " + std::to_string(status) + ")");
    return;
  }
  const bool has_rseq = child_backend == "rseq";
  if (deny && has_rseq) {
    mark_unavailable(rows, mode, library,
                     "the seccomp filter did not take rseq away from the child");
  } else if (!deny && !has_rseq) {
    mark_unavailable(rows, mode, library,
                     "the child has no rseq (cpu_id() backend: " + child_backend + ")");
  }
}

// The allocators of the rows that have one, each once, in the rows' order.
std::vector<const char*> malloc_libraries() {
  std::vector<const char*> libraries;
  for (const structure_kind& kind : kKinds) {
    if (kind.malloc_library == nullptr) continue;
    bool seen = false;
    for (const char* l : libraries) seen = seen || std::strcmp(l, kind.malloc_library) == 0;
    if (!seen) libraries.push_back(kind.malloc_library);
  }
  return libraries;
}

}  // namespace

const std::vector<structure_kind>& structure_kinds() { return kKinds; }
const std::vector<int>& structure_thread_counts() { return kThreadCounts; }

double structure_side::median() const { return bench::median(ns_per_op); }
double structure_side::min() const {
  return all_ns_per_op.empty() ? 0 : *std::min_element(all_ns_per_op.begin(), all_ns_per_op.end());
}
double structure_side::max() const {
  return all_ns_per_op.empty() ? 0 : *std::max_element(all_ns_per_op.begin(), all_ns_per_op.end());
}

double structure_mode::ratio() const {
  if (!available || !percpu.available || !alternative.available) return 0;
  const double p = percpu.median(), a = alternative.median();
  if (p <= 0 || a <= 0) return 0;
  return a / p;
}

std::vector<structure_row> measure_structures(const options& opts) {
  std::vector<structure_row> rows = empty_rows();
  const bool rseq_here = backend() == cpu_backend::rseq;
  const std::string no_rseq =
      std::string("this process has no rseq (cpu_id() backend: ") + to_string(backend()) + ")";
  if (rseq_here) {
    measure_here(opts, &rows, &structure_row::with_rseq, nullptr);
  } else {
    mark_unavailable(&rows, &structure_row::with_rseq, nullptr, no_rseq);
  }
  measure_in_child(opts, kStructuresDenyChild, nullptr, &rows, &structure_row::without_rseq);
  for (const char* library : malloc_libraries()) {
    if (kSanitizerBuild) {
      const std::string why = "not measured in a sanitizer build, whose malloc is the sanitizer's";
      mark_unavailable(&rows, &structure_row::with_rseq, library, why);
      mark_unavailable(&rows, &structure_row::without_rseq, library, why);
      continue;
    }
    // A child inherits what keeps rseq from this process (a seccomp filter,
    // valgrind), so it is asked only where this process has it.
    if (rseq_here) {
      measure_in_child(opts, kStructuresChild, library, &rows, &structure_row::with_rseq);
    } else {
      mark_unavailable(&rows, &structure_row::with_rseq, library, no_rseq);
    }
    measure_in_child(opts, kStructuresDenyChild, library, &rows, &structure_row::without_rseq);
  }
  return rows;
}

int run_structures_child(const options& opts) {
  const std::size_t at = opts.child_row.find(kMallocLibrarySeparator);
  const std::string row = opts.child_row.substr(0, at);
  const std::string library = at == std::string::npos ? "" : opts.child_row.substr(at + 1);
  if (row == kStructuresDenyChild) {
    // The filter must be in place before glibc starts, which decides at
    // start-up whether to register rseq: so it is installed here and the
    // binary runs again, fresh, under it.
    if (!tools::deny_rseq(ENOSYS)) {
      std::perror("percpu-bench: installing the seccomp filter");
      return 1;
    }
    std::vector<std::string> args = opts.argv;
    for (std::string& a : args) {
      if (a == opts.child_row) a = kStructuresChild + opts.child_row.substr(row.size());
    }
    const std::string self = self_path();
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    execv(self.c_str(), argv.data());
    std::perror("percpu-bench: re-running itself without rseq");
    return 1;
  }
  std::vector<structure_row> rows = empty_rows();
  const char* const only = library.empty() ? nullptr : library.c_str();
  const std::string from = malloc_file();
  std::printf("backend %s malloc %s\n", to_string(backend()), from.c_str());
  // LD_PRELOAD did not load it: the parent says so instead of a figure.
  if (only != nullptr && !file_is_library(from, library)) return 0;
  measure_here(opts, &rows, &structure_row::without_rseq, only);
  for (const structure_row& row : rows) {
    if (!of_library(row, only)) continue;
    const structure_mode& m = row.without_rseq;
    for (const structure_side* side : {&m.percpu, &m.alternative}) {
      std::printf("side %s %d %s %" PRIu64, row.kind->name, row.threads,
                  side == &m.percpu ? "percpu" : "alternative", side->calls);
      for (double v : side->ns_per_op) std::printf(" %.17g", v);
      std::printf(" ;");
      for (double v : side->all_ns_per_op) std::printf(" %.17g", v);
      std::printf(" end\n");
    }
  }
  return 0;
}

}  // namespace bench
}  // namespace percpu
