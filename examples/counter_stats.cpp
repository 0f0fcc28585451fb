// Example: per-CPU statistics.
//
// A server counts requests, bytes and errors from many threads. A
// std::atomic per field would make every thread fight over the same cache
// lines; percpu::per_cpu<stats> gives each CPU its own copy of the whole
// struct and updates a field of the calling CPU's copy with no atomic
// instruction. Reading sums a field over the copies, so it suits totals
// that are read far less often than they are bumped. (For one number
// alone, percpu::counter is the same thing, ready-made.)
//
// Build against an installed percpu:
//   g++ -std=c++17 counter_stats.cpp $(pkg-config --cflags --libs percpu)
#include <percpu/cpu.hpp>
#include <percpu/per_cpu.hpp>

#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

// Each field an 8-byte integer: per_cpu updates one word at a time.
struct server_stats {
  std::int64_t requests;
  std::int64_t bytes_sent;
  std::int64_t errors;
};

// Constant-initialised: usable from any thread, from static constructors and
// from signal handlers, with no set-up.
percpu::per_cpu<server_stats> stats;

void serve(int count) {
  for (int i = 0; i < count; ++i) {
    stats.add(&server_stats::requests, std::int64_t{1});
    stats.add(&server_stats::bytes_sent, std::int64_t{100 + i % 50});
    if (i % 1000 == 999) stats.add(&server_stats::errors, std::int64_t{1});
  }
}

}  // namespace

int main() {
  const int kThreads = 4;
  const int kRequestsPerThread = 200000;
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) workers.emplace_back(serve, kRequestsPerThread);
  for (std::thread& w : workers) w.join();

  // After the joins the sums are exact; while threads still update, sum()
  // returns some value between the totals before and after those updates.
  const std::int64_t expected_requests = std::int64_t{kThreads} * kRequestsPerThread;
  std::int64_t expected_bytes = 0;
  for (int i = 0; i < kRequestsPerThread; ++i) expected_bytes += 100 + i % 50;
  expected_bytes *= kThreads;
  const std::int64_t expected_errors = std::int64_t{kThreads} * (kRequestsPerThread / 1000);

  const std::int64_t requests = stats.sum(&server_stats::requests);
  const std::int64_t bytes = stats.sum(&server_stats::bytes_sent);
  const std::int64_t errors = stats.sum(&server_stats::errors);
  std::printf("requests: %lld (expected %lld)\n", static_cast<long long>(requests),
              static_cast<long long>(expected_requests));
  std::printf("bytes: %lld (expected %lld)\n", static_cast<long long>(bytes),
              static_cast<long long>(expected_bytes));
  std::printf("errors: %lld (expected %lld)\n", static_cast<long long>(errors),
              static_cast<long long>(expected_errors));
  // Where the work ran: one copy per possible CPU (and, for threads without
  // rseq, a second set updated with atomics).
  for (int cpu = 0; cpu < stats.cpus(); ++cpu) {
    const server_stats mine = stats.copy(cpu);
    const server_stats by_atomics = stats.atomic_copy(cpu);
    if (mine.requests + by_atomics.requests != 0) {
      std::printf("  cpu %d served %lld requests\n", cpu,
                  static_cast<long long>(mine.requests + by_atomics.requests));
    }
  }
  const bool exact =
      requests == expected_requests && bytes == expected_bytes && errors == expected_errors;
  std::printf("%s (backend %s)\n", exact ? "counters exact" : "COUNTERS WRONG",
              percpu::to_string(percpu::backend()));
  return exact ? 0 : 1;
}
