// Example: striping a hash map's locks by cpu_id().
//
// Many threads tally words. One map behind one mutex serialises them; here
// the map is split into one shard per possible CPU, each with its own lock,
// and a thread writes to the shard of the CPU it is running on. Threads on
// different CPUs then rarely touch the same lock or cache lines.
//
// The CPU id is only a hint: the thread may move right after reading it, and
// two threads may read the same id. That is why each shard still has a lock.
// The id decides where to go, never who owns the data: the lock does.
//
// Build against an installed percpu:
//   g++ -std=c++17 striped_map.cpp $(pkg-config --cflags --libs percpu)
#include <percpu/cpu.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

class word_tally {
 public:
  // One shard per possible CPU id: max_cpus(), not the number of online or
  // allowed CPUs, because ids can be sparse and go up to max_cpus() - 1.
  word_tally() : shards_(std::make_unique<shard[]>(static_cast<size_t>(percpu::max_cpus()))) {}

  void add(const std::string& word) {
    shard& s = shards_[static_cast<size_t>(percpu::cpu_id())];
    std::lock_guard<std::mutex> lock(s.mutex);
    ++s.counts[word];
  }

  // Merges the shards. Takes every lock in turn, so it is correct while
  // writers run, though not a snapshot of one instant.
  std::map<std::string, long> totals() const {
    std::map<std::string, long> merged;
    for (int i = 0; i < percpu::max_cpus(); ++i) {
      const shard& s = shards_[static_cast<size_t>(i)];
      std::lock_guard<std::mutex> lock(s.mutex);
      for (const auto& [word, n] : s.counts) merged[word] += n;
    }
    return merged;
  }

 private:
  struct alignas(64) shard {  // own cache line: no false sharing between CPUs
    mutable std::mutex mutex;
    std::unordered_map<std::string, long> counts;
  };
  std::unique_ptr<shard[]> shards_;
};

}  // namespace

int main() {
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "epsilon"};
  const int kThreads = 4;
  const int kWordsPerThread = 100000;
  word_tally tally;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWordsPerThread; ++i)
        tally.add(words[static_cast<size_t>(i + t) % words.size()]);
    });
  }
  for (std::thread& t : threads) t.join();

  long total = 0;
  bool even = true;
  const long per_word =
      static_cast<long>(kThreads) * kWordsPerThread / static_cast<long>(words.size());
  for (const auto& [word, n] : tally.totals()) {
    std::printf("%-8s %ld\n", word.c_str(), n);
    total += n;
    even = even && n == per_word;
  }
  const bool ok = total == static_cast<long>(kThreads) * kWordsPerThread && even;
  std::printf("%s: %ld words in %d shards\n", ok ? "tally exact" : "TALLY WRONG", total,
              percpu::max_cpus());
  return ok ? 0 : 1;
}
