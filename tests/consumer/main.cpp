// The consumer's C++ side: the inline fast path, a per-CPU array sized by
// max_cpus(), and percpu::counter, all from the installed headers.
#include <percpu/counter.hpp>
#include <percpu/cpu.hpp>

#include <cstdio>
#include <thread>
#include <vector>

extern "C" int consumer_c_part(void);  // c_part.c: the C API, compiled as C

namespace {
percpu::counter events;
}

int main() {
  const int cpus = percpu::max_cpus();
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 1000; ++i) events.increment();
    });
  }
  for (std::thread& t : threads) t.join();
  const int cpu = percpu::cpu_id();
  const bool ok = cpu >= 0 && cpu < cpus && events.load() == 2000 && consumer_c_part() == 0;
  std::printf("consumer: cpu %d of %d, backend %s, %lld events: %s\n", cpu, cpus,
              percpu::to_string(percpu::backend()), static_cast<long long>(events.load()),
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
