// A correct program that a user checks with a sanitizer: built with
// -fsanitize=thread (or address, or memory) against an installed percpu that
// was built without any (tests/consumer/sanitizers.sh). Every structure hands
// plain data from one thread to another only through the happens-before
// edge percpu promises, so any sanitizer report is a false one:
//   shared_mutex: writers write a record, readers read it;
//   free_list: a pusher writes a node's payload, whoever pops it reads and
//     rewrites it;
//   object_pool: an object freed on one thread is allocated on another and
//     written (the pool reuses its memory for links in between);
//   ref: each thread writes its own cell, then puts; the release function,
//     on whichever thread drops the last reference, reads every cell and
//     frees them;
//   counter: exact after the threads are joined.
// Exits 0 when every check holds; prints what failed otherwise.
#include <percpu/counter.hpp>
#include <percpu/cpu.hpp>
#include <percpu/free_list.hpp>
#include <percpu/object_pool.hpp>
#include <percpu/ref.hpp>
#include <percpu/shared_mutex.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 4;
std::atomic<int> failures{0};

void fail(const char* what) {
  std::fprintf(stderr, "sanitized consumer: %s\n", what);
  failures.fetch_add(1);
}

// Plain data guarded by the lock: a writer keeps the three fields equal.
percpu::shared_mutex record_lock;
struct {
  long a = 0, b = 0, c = 0;
} record;

void shared_mutex_round() {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 3000; ++i) {
        if (t == 0 && i % 10 == 0) {
          std::unique_lock<percpu::shared_mutex> lock(record_lock);
          ++record.a;
          ++record.b;
          ++record.c;
        } else if (t == 1 && i % 25 == 0 && record_lock.try_lock()) {
          record.a += 2;
          record.b += 2;
          record.c += 2;
          record_lock.unlock();
        } else if (i % 7 == 0 && record_lock.try_lock_shared()) {
          if (record.a != record.c) fail("shared_mutex: torn record (try_lock_shared)");
          record_lock.unlock_shared();
        } else {
          std::shared_lock<percpu::shared_mutex> lock(record_lock);
          if (record.a != record.b || record.b != record.c) fail("shared_mutex: torn record");
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// Nodes whose payload the popper checks and rewrites.
struct item {
  percpu::free_list_node node;  // first: a node pointer is the item's
  long payload[4];
};

void free_list_round() {
  percpu::free_list list;
  std::vector<item> items(64);
  for (std::size_t i = 0; i < items.size(); ++i) {
    for (long& w : items[i].payload) w = static_cast<long>(i);
    list.push(&items[i].node);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&list, t] {
      for (int i = 0; i < 20000; ++i) {
        percpu::free_list_node* n = (i % 3 == 0) ? list.try_pop_local() : list.pop();
        if (n == nullptr) continue;
        item* it = reinterpret_cast<item*>(n);
        const long v = it->payload[0];
        for (long w : it->payload) {
          if (w != v) fail("free_list: torn payload");
        }
        for (long& w : it->payload) w = v + t + 1;
        list.push(n);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // take_all hands every node to this thread: read them all.
  long seen = 0;
  for (percpu::free_list_node* n = list.take_all(); n != nullptr; n = n->next) {
    seen += reinterpret_cast<item*>(n)->payload[0] >= 0 ? 1 : 0;
  }
  if (seen != static_cast<long>(items.size())) fail("free_list: take_all lost nodes");
}

// Objects freed on one thread, allocated and written on another; small
// caches so that batches move through the depot, and a trim from another
// thread meanwhile.
void object_pool_round() {
  percpu::object_pool::options opts;
  opts.object_size = 64;
  opts.cache_capacity = 4;
  percpu::object_pool pool(opts);
  std::mutex handoff_lock;
  std::vector<long*> handoff;  // objects allocated by one thread, freed by another
  std::atomic<bool> stop{false};
  std::thread trimmer([&] {
    while (!stop.load()) {
      pool.trim();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<long*> mine;
      for (int i = 0; i < 4000; ++i) {
        long* p = static_cast<long*>(pool.allocate());
        if (p == nullptr) {
          fail("object_pool: allocate failed");
          return;
        }
        for (int w = 0; w < 8; ++w) p[w] = t * 100000 + i;
        mine.push_back(p);
        if (mine.size() == 6) {
          std::lock_guard<std::mutex> lock(handoff_lock);
          for (long* q : mine) handoff.push_back(q);
          mine.clear();
        }
        std::vector<long*> theirs;
        {
          std::lock_guard<std::mutex> lock(handoff_lock);
          if (handoff.size() > 12) theirs.swap(handoff);
        }
        for (long* q : theirs) {
          if (q[0] != q[7]) fail("object_pool: torn object");
          q[3] = -1;  // a write by the freeing thread, just before the free
          pool.deallocate(q);
        }
      }
      for (long* q : mine) pool.deallocate(q);
    });
  }
  for (std::thread& t : threads) t.join();
  stop.store(true);
  trimmer.join();
  for (long* q : handoff) pool.deallocate(q);
}

// The release function reads what every thread wrote before its put.
struct cells {
  long value[kThreads];
};
std::atomic<int> releases{0};
void release_cells(void* context) {
  cells* c = static_cast<cells*>(context);
  long sum = 0;
  for (long v : c->value) sum += v;
  if (sum != kThreads * 1000L) fail("ref: the release function saw a partial write");
  delete c;
  releases.fetch_add(1);
}

void ref_round() {
  for (int round = 0; round < 50; ++round) {
    cells* c = new cells{};
    percpu::ref r(release_cells, c);
    std::atomic<int> holding{0};
    std::atomic<bool> killed{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        r.get();
        for (int i = 0; i < 3; ++i) {  // short-lived references before kill()
          r.get();
          r.put();
        }
        holding.fetch_add(1);
        while (!killed.load(std::memory_order_relaxed)) std::this_thread::yield();
        c->value[t] = 1000;  // after this thread's last look at c, then put
        r.put();
      });
    }
    while (holding.load() != kThreads) std::this_thread::yield();
    r.kill();  // drops the owner's reference; the last put releases
    killed.store(true, std::memory_order_relaxed);
    for (std::thread& t : threads) t.join();
    if (!r.released()) fail("ref: not released");
  }
  if (releases.load() != 50) fail("ref: wrong number of releases");
}

percpu::counter events;

void counter_round() {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 10000; ++i) events.increment();
    });
  }
  for (std::thread& t : threads) t.join();
  if (events.load() != kThreads * 10000L) fail("counter: inexact");
}

}  // namespace

// With arguments, runs only the rounds named (shared_mutex, free_list,
// object_pool, ref, counter).
int main(int argc, char** argv) {
  const struct {
    const char* name;
    void (*run)();
  } rounds[] = {{"shared_mutex", shared_mutex_round},
                {"free_list", free_list_round},
                {"object_pool", object_pool_round},
                {"ref", ref_round},
                {"counter", counter_round}};
  for (const auto& r : rounds) {
    bool wanted = argc < 2;
    for (int i = 1; i < argc; ++i) wanted = wanted || std::strcmp(argv[i], r.name) == 0;
    if (wanted) r.run();
  }
  // The mode the run must be in, when the caller says (as every test binary
  // of the build does): a run that silently fell back must not pass.
  const char* owner = percpu::to_string(percpu::rseq_ownership());
  const char* backend = percpu::to_string(percpu::backend());
  const char* want_owner = std::getenv("PERCPU_EXPECT_OWNER");
  const char* want_backend = std::getenv("PERCPU_EXPECT_BACKEND");
  if (want_owner != nullptr && std::strcmp(want_owner, owner) != 0)
    fail("not the expected rseq owner");
  if (want_backend != nullptr && std::strcmp(want_backend, backend) != 0) {
    fail("not the expected backend");
  }
  std::printf("sanitized consumer: backend %s, rseq owner %s: %s\n", backend, owner,
              failures.load() == 0 ? "ok" : "FAILED");
  return failures.load() == 0 ? 0 : 1;
}
