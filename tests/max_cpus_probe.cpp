// Prints what percpu reports about CPU ids, for hidden_sys_test.cpp, which
// runs it in a mount namespace where /sys is hidden or altered:
//   max_cpus=N cpumask_bits=B ids_in_range=0|1 bounds_every_id=0|1
// ids_in_range: cpu_id() and concurrency_id(), asked on every allowed CPU,
// were all below max_cpus(). bounds_every_id: start-up took max_cpus() for a
// bound on every id the kernel reports (so the inline id paths read the
// kernel's ids unbounded). Exit status 0 when the ids were in range.
// PERCPU_PROBE_WIDEN=1 asks on every CPU the process may use, not only on
// those of the mask it started with.
// PERCPU_PROBE_STRUCTURES=N then also prints list_bytes=L pool_bytes=P: the
// resident anonymous memory that N free_lists, and then N object_pools of
// 64-byte objects, each used once by this thread on one CPU, added per
// instance (for the memory a possible list of thousands of CPUs costs),
// then counter_bytes=C cid_counter_bytes=D for 10 N of each.
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/free_list.hpp"
#include "percpu/internal/sysfs.hpp"
#include "percpu/object_pool.hpp"
#include "tests/support/pages.hpp"

namespace {

// Resident anonymous bytes per instance that making `n` of T and using each
// once (use(T&)) adds.
template <class T, class Make, class Use>
long bytes_each(long n, Make make, Use use) {
  std::vector<std::unique_ptr<T>> made;
  made.reserve(static_cast<std::size_t>(n));
  const long before = percpu::test::resident_bytes();
  for (long i = 0; i < n; ++i) {
    made.push_back(make());
    use(*made.back());
  }
  const long after = percpu::test::resident_bytes();
  return before < 0 || after < 0 ? -1 : (after - before) / n;
}

void print_structure_bytes(long n) {
  // One CPU, the one start-up ran on: the others' copies must stay unfilled.
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  sched_setaffinity(0, sizeof(one), &one);
  percpu::free_list_node node;
  const long list = bytes_each<percpu::free_list>(
      n, [] { return std::make_unique<percpu::free_list>(); },
      [&](percpu::free_list& l) {
        l.push(&node);
        if (l.pop() != &node) std::abort();
      });
  const long pool = bytes_each<percpu::object_pool>(
      n, [] { return std::make_unique<percpu::object_pool>(64); },
      [](percpu::object_pool& p) { p.deallocate(p.allocate()); });
  // Ten times as many counters (16 bytes a CPU each, where a list or a
  // pool takes more), each added to once; the cid_counters also read once,
  // which reads the words of the ids used (a counter's load() would read
  // every possible CPU's, the zero page where they were never written).
  const long by_cpu = bytes_each<percpu::counter>(
      10 * n, [] { return std::make_unique<percpu::counter>(); },
      [](percpu::counter& c) { c.add(1); });
  const long by_id = bytes_each<percpu::cid_counter>(
      10 * n, [] { return std::make_unique<percpu::cid_counter>(); },
      [](percpu::cid_counter& c) {
        c.add(1);
        if (c.load() != 1) std::abort();
      });
  std::printf(" list_bytes=%ld pool_bytes=%ld counter_bytes=%ld cid_counter_bytes=%ld", list, pool,
              by_cpu, by_id);
}

}  // namespace

int main() {
  const int max = percpu::max_cpus();
  // PERCPU_PROBE_WIDEN=1: the probe started (and percpu's start-up ran) on
  // a narrower mask than the process may have; ask on every CPU it may have.
  if (const char* widen = std::getenv("PERCPU_PROBE_WIDEN"); widen != nullptr && *widen == '1') {
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &all);
    sched_setaffinity(0, sizeof(all), &all);  // the kernel keeps what the cpuset allows
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  bool in_range = true;
  // The counter's sections must commit only on a CPU below max_cpus() too:
  // an add on another would write past its slots, and load() would miss it.
  percpu::counter adds;
  long added = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) continue;
    for (int i = 0; i < 100; ++i) {
      const int id = percpu::cpu_id(), cid = percpu::concurrency_id();
      if (id < 0 || id >= max || cid < 0 || cid >= max) in_range = false;
      adds.add(1);
      ++added;
    }
  }
  const bool exact = adds.load() == added;
  std::printf("max_cpus=%d cpumask_bits=%d ids_in_range=%d bounds_every_id=%d adds_exact=%d", max,
              percpu::internal::kernel_cpumask_bits(), in_range ? 1 : 0,
              percpu::internal::max_cpus_bounds_every_id() ? 1 : 0, exact ? 1 : 0);
  if (const char* n = std::getenv("PERCPU_PROBE_STRUCTURES"); n != nullptr && std::atol(n) > 0) {
    print_structure_bytes(std::atol(n));
  }
  std::printf("\n");
  return in_range && exact ? 0 : 1;
}
