// percpu beside librseq in one process: cpu_id(), counter::add(),
// per_cpu<T>::add(), counter::load() and free_list pop+push against
// librseq's own read, its add on an rseq_mempool item, the sum of that item
// over the CPUs, and a per-CPU list made with librseq's sections. The add
// runs twice on librseq's side: with the item's pointer in a register (the
// loop receives it), and read from memory at each add, as percpu's counter
// reads its slots' pointer from the counter object); the sum likewise, with
// the item's pointer and the CPU count in registers and read from memory.
//
// Built and run by scripts/bench_librseq.sh (which builds librseq from a
// clone you name); not part of percpu's build. Each figure: per-thread CPU
// time per operation, the median of 9 rounds, the two sides alternating in
// each round (A B, then B A), threads pinned one per CPU, a compiler
// barrier between operations. ratio = librseq's time / percpu's (above 1,
// percpu is faster).
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/free_list.hpp"
#include "percpu/per_cpu.hpp"

extern "C" {
void* librseq_counter_create(void);
int librseq_register(void);
std::int64_t librseq_cpu_loop(long n);
void librseq_add_loop(void* item, long n);
extern void* librseq_item_in_memory;
void librseq_add_loop_from_memory(long n);
extern int librseq_cpus_in_memory;
std::int64_t librseq_sum_loop_from_memory(long n);
std::int64_t librseq_sum_loop(void* item, int cpus, long n);
void librseq_list_prepare(int cpu);
void librseq_list_loop(long n);
}

#define BARRIER() asm volatile("" ::: "memory")

namespace {

percpu::counter g_counter;
struct two_counts {
  std::int64_t hits;
  std::int64_t bytes;
};
percpu::per_cpu<two_counts> g_per_cpu;
void* g_librseq_item;
std::atomic<std::int64_t> g_sink{0};

// The loops are kept out of line so that each side's loop is compiled on
// its own, like librseq's in librseq_loops.c; the operation inside is inline.
__attribute__((noinline)) void percpu_cpu_loop(long n) {
  std::int64_t sum = 0;
  for (long i = 0; i < n; ++i) {
    sum += percpu::cpu_id();
    BARRIER();
  }
  g_sink.fetch_add(sum, std::memory_order_relaxed);
}
__attribute__((noinline)) void percpu_add_loop(long n) {
  for (long i = 0; i < n; ++i) {
    g_counter.add(1);
    BARRIER();
  }
}
__attribute__((noinline)) void per_cpu_add_loop(long n) {
  for (long i = 0; i < n; ++i) {
    g_per_cpu.add(&two_counts::hits, std::int64_t{1});
    BARRIER();
  }
}
__attribute__((noinline)) void percpu_load_loop(long n) {
  std::int64_t sum = 0;
  for (long i = 0; i < n; ++i) {
    sum += g_counter.load();
    BARRIER();
  }
  g_sink.fetch_add(sum, std::memory_order_relaxed);
}
// The free list's side: pop+push of a node on the calling CPU's list, a
// compiler barrier after each operation, as the librseq side does.
percpu::free_list g_free_list;
// Each thread's node on lines of its own, as on the librseq side.
struct alignas(128) node_line {
  percpu::free_list_node node;
};
node_line g_free_list_nodes[CPU_SETSIZE];
__attribute__((noinline)) void percpu_list_loop(long n) {
  for (long i = 0; i < n; ++i) {
    percpu::free_list_node* node = g_free_list.pop();
    BARRIER();
    if (node != nullptr) g_free_list.push(node);
    BARRIER();
  }
}
void librseq_cpu(long n) { g_sink.fetch_add(librseq_cpu_loop(n), std::memory_order_relaxed); }
void librseq_add(long n) { librseq_add_loop(g_librseq_item, n); }
void librseq_load_from_memory(long n) {
  g_sink.fetch_add(librseq_sum_loop_from_memory(n), std::memory_order_relaxed);
}
void librseq_load(long n) {
  g_sink.fetch_add(librseq_sum_loop(g_librseq_item, percpu::max_cpus(), n),
                   std::memory_order_relaxed);
}

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// ns per operation of `loop` on `threads` threads pinned to CPUs 0..threads-1,
// all started together; the mean over the threads of each one's CPU time.
bool prepared[CPU_SETSIZE];

double run(const std::function<void(long)>& loop, int threads, long n) {
  std::vector<double> ns(threads);
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(t, &one);
      pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
      librseq_register();
      // Each list side gets a node on this thread's CPU (the loops pop it
      // and push it back); harmless for the other rows.
      if (!prepared[t]) {
        prepared[t] = true;
        g_free_list.push(&g_free_list_nodes[t].node);
        librseq_list_prepare(t);
      }
      loop(1000);  // warm: first use, pages, registration
      ready.fetch_add(1);
      while (ready.load() < threads) {
      }
      const double start = thread_seconds();
      loop(n);
      ns[t] = (thread_seconds() - start) * 1e9 / static_cast<double>(n);
    });
  }
  for (std::thread& t : pool) t.join();
  double sum = 0;
  for (double v : ns) sum += v;
  return sum / threads;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct pair_row {
  const char* what;
  const char* percpu_side;
  const char* peer_side;
  std::function<void(long)> percpu;
  std::function<void(long)> peer;
  long n;
};

std::string cpu_model() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  std::string model = "unknown";
  char line[512];
  while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
    std::string s(line);
    if (s.rfind("model name", 0) == 0) {
      model = s.substr(s.find(':') + 2);
      model.erase(model.find_last_not_of("\n") + 1);
      break;
    }
  }
  if (f != nullptr) std::fclose(f);
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 9;
  const char* build = argc > 2 ? argv[2] : "default -O2";
  if (librseq_register() != 0) {
    std::fprintf(stderr, "librseq could not register rseq for this thread\n");
    return 1;
  }
  g_librseq_item = librseq_counter_create();
  librseq_item_in_memory = g_librseq_item;
  librseq_cpus_in_memory = percpu::max_cpus();
  if (g_librseq_item == nullptr) {
    std::fprintf(stderr, "librseq's mempool failed\n");
    return 1;
  }
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  std::printf("percpu beside librseq, one process; %s; CPU %s, %d CPUs online, max_cpus %d; "
              "rseq owner %s, sections %s\n",
              build, cpu_model().c_str(), cpus, percpu::max_cpus(),
              percpu::to_string(percpu::rseq_ownership()),
              percpu::to_string(percpu::sections_status()));
  std::printf("median of %d alternating rounds, per-thread CPU time, threads pinned; "
              "ratio = librseq / percpu\n\n",
              rounds);
  const std::vector<pair_row> rows = {
      {"cpu id", "percpu::cpu_id()", "rseq_current_cpu_raw()", percpu_cpu_loop, librseq_cpu,
       20000000},
      {"per-CPU add", "counter::add(1)", "rseq_load_add_store__ptr on a mempool item",
       percpu_add_loop, librseq_add, 10000000},
      {"per-CPU add", "counter::add(1)", "the same, its item pointer read from memory",
       percpu_add_loop, librseq_add_loop_from_memory, 10000000},
      {"per-CPU add", "per_cpu<T>::add", "counter::add(1) (percpu's own)", per_cpu_add_loop,
       percpu_add_loop, 10000000},
      {"read the total", "counter::load()", "summing the mempool item over max_cpus()",
       percpu_load_loop, librseq_load, 2000000},
      {"read the total", "counter::load()", "the same, its pointer and count read from memory",
       percpu_load_loop, librseq_load_from_memory, 2000000},
      {"list pop+push", "free_list", "librseq per-CPU list (selftests' shape)", percpu_list_loop,
       librseq_list_loop, 10000000},
  };
  std::printf("%-16s %-18s %-45s %8s %10s %10s %7s\n", "what", "percpu", "peer", "threads",
              "percpu ns", "peer ns", "ratio");
  for (const pair_row& row : rows) {
    for (int threads : {1, 2}) {
      if (threads > cpus) continue;
      std::vector<double> mine, theirs;
      for (int r = 0; r < rounds; ++r) {
        if (r % 2 == 0) {
          mine.push_back(run(row.percpu, threads, row.n));
          theirs.push_back(run(row.peer, threads, row.n));
        } else {
          theirs.push_back(run(row.peer, threads, row.n));
          mine.push_back(run(row.percpu, threads, row.n));
        }
      }
      const double m = median(mine), t = median(theirs);
      std::printf("%-16s %-18s %-45s %8d %10.3f %10.3f %7.2f\n", row.what, row.percpu_side,
                  row.peer_side, threads, m, t, t / m);
    }
  }
  return 0;
}
