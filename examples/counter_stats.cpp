// Example: per-CPU statistics counters.
//
// A server counts requests and bytes from many threads. A std::atomic would
// make every thread fight over one cache line; percpu::counter gives each CPU
// its own slot and adds with no atomic instruction. Reading sums the slots,
// so it suits totals that are read far less often than they are bumped.
//
// Build against an installed percpu:
//   g++ -std=c++17 counter_stats.cpp $(pkg-config --cflags --libs percpu)
#include <percpu/counter.hpp>
#include <percpu/cpu.hpp>

#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

// Global counters are constant-initialised: usable from any thread, from
// static constructors and from signal handlers, with no set-up.
percpu::counter requests;
percpu::counter bytes_sent;

void serve(int count) {
  for (int i = 0; i < count; ++i) {
    requests.increment();
    bytes_sent.add(100 + i % 50);
  }
}

}  // namespace

int main() {
  const int kThreads = 4;
  const int kRequestsPerThread = 200000;
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) workers.emplace_back(serve, kRequestsPerThread);
  for (std::thread& w : workers) w.join();

  // After the joins the totals are exact; while threads still add, load()
  // returns some value between the totals before and after those adds.
  const std::int64_t expected_requests = std::int64_t{kThreads} * kRequestsPerThread;
  std::int64_t expected_bytes = 0;
  for (int i = 0; i < kRequestsPerThread; ++i) expected_bytes += 100 + i % 50;
  expected_bytes *= kThreads;

  std::printf("requests: %lld (expected %lld)\n", static_cast<long long>(requests.load()),
              static_cast<long long>(expected_requests));
  std::printf("bytes: %lld (expected %lld)\n", static_cast<long long>(bytes_sent.load()),
              static_cast<long long>(expected_bytes));
  // Where the work ran: one slot per possible CPU.
  for (int cpu = 0; cpu < requests.slots(); ++cpu) {
    if (requests.slot(cpu) != 0) {
      std::printf("  cpu %d served %lld requests\n", cpu,
                  static_cast<long long>(requests.slot(cpu)));
    }
  }
  const bool exact = requests.load() == expected_requests && bytes_sent.load() == expected_bytes;
  std::printf("%s (backend %s)\n", exact ? "counters exact" : "COUNTERS WRONG",
              percpu::to_string(percpu::backend()));
  return exact ? 0 : 1;
}
