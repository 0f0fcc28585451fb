// The parent's program: percpu's inline fast path, a per-CPU array sized by
// max_cpus() and percpu::counter, as an application would use them.
#include <percpu/counter.hpp>
#include <percpu/cpu.hpp>

#include <cstdio>
#include <thread>
#include <vector>

namespace {
percpu::counter hits;
}

int main() {
  const int cpus = percpu::max_cpus();
  std::vector<long> per_cpu(static_cast<std::size_t>(cpus));
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 1000; ++i) hits.increment();
    });
  }
  for (std::thread& t : threads) t.join();
  const int cpu = percpu::cpu_id();
  const bool ok = cpu >= 0 && cpu < cpus && hits.load() == 2000;
  if (ok) per_cpu[static_cast<std::size_t>(cpu)] += hits.load();
  std::printf("parent app: cpu %d of %d, backend %s, %lld hits: %s\n", cpu, cpus,
              percpu::to_string(percpu::backend()), static_cast<long long>(hits.load()),
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
