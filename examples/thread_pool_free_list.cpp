// Example: a thread pool's per-CPU free list.
//
// A pool runs many small tasks. Allocating each task with new/delete, or
// recycling them through one shared free list, makes every worker contend on
// one lock or one cache line. Here finished tasks go back to a free list of
// the CPU the worker runs on, and new tasks are taken from the submitting
// thread's CPU, so recycling stays CPU-local.
//
// The CPU id is a hint: the thread may move right after reading it. So each
// per-CPU list has its own small lock, and the id only picks which one. A
// list may see a push from one CPU and a pop from another; the lock keeps it
// correct, the id keeps that rare.
//
// percpu::free_list (percpu/free_list.hpp) does the same without locks, with
// rseq critical sections; this example keeps to percpu::cpu_id() so that it
// shows the pattern in a few lines.
//
// Build against an installed percpu:
//   g++ -std=c++17 thread_pool_free_list.cpp $(pkg-config --cflags --libs percpu)
#include <percpu/cpu.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {

struct task {
  long input = 0;
  task* next_free = nullptr;  // link while on a free list
};

// One LIFO stack of recycled tasks per possible CPU.
class per_cpu_free_list {
 public:
  per_cpu_free_list() : lists_(std::make_unique<list[]>(static_cast<size_t>(percpu::max_cpus()))) {}
  ~per_cpu_free_list() {
    for (int i = 0; i < percpu::max_cpus(); ++i) {
      for (task* t = lists_[static_cast<size_t>(i)].head; t != nullptr;) {
        task* next = t->next_free;
        delete t;
        t = next;
      }
    }
  }

  task* get() {
    list& l = lists_[static_cast<size_t>(percpu::cpu_id())];
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      if (task* t = l.head) {
        l.head = t->next_free;
        reused.fetch_add(1, std::memory_order_relaxed);
        return t;
      }
    }
    allocated.fetch_add(1, std::memory_order_relaxed);
    return new task;
  }

  void put(task* t) {
    list& l = lists_[static_cast<size_t>(percpu::cpu_id())];
    std::lock_guard<std::mutex> lock(l.mutex);
    t->next_free = l.head;
    l.head = t;
  }

  std::atomic<long> allocated{0};
  std::atomic<long> reused{0};

 private:
  struct alignas(64) list {  // own cache line per CPU
    std::mutex mutex;
    task* head = nullptr;
  };
  std::unique_ptr<list[]> lists_;
};

class thread_pool {
 public:
  explicit thread_pool(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~thread_pool() { shutdown(); }

  // Runs what is queued, then stops the workers.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& w : workers_) w.join();
    workers_.clear();
  }

  // Queues a task; waits while the queue is full, so a fast submitter keeps
  // reusing finished tasks instead of allocating new ones.
  void submit(long input) {
    task* t = free_tasks_.get();
    t->input = input;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      not_full_.wait(lock, [this] { return queue_.size() < kQueueLimit; });
      queue_.push_back(t);
    }
    ready_.notify_one();
  }

  long sum() const { return sum_.load(); }
  per_cpu_free_list& free_tasks() { return free_tasks_; }

 private:
  void work() {
    for (;;) {
      task* t = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        t = queue_.front();
        queue_.pop_front();
      }
      not_full_.notify_one();
      sum_.fetch_add(t->input, std::memory_order_relaxed);
      free_tasks_.put(t);  // recycled on the CPU that finished it
    }
  }

  per_cpu_free_list free_tasks_;  // destroyed after the workers have joined
  std::mutex mutex_;
  static constexpr size_t kQueueLimit = 64;
  std::condition_variable ready_;
  std::condition_variable not_full_;
  std::deque<task*> queue_;
  bool stopping_ = false;
  std::atomic<long> sum_{0};
  std::vector<std::thread> workers_;
};

}  // namespace

int main() {
  const long kTasks = 100000;
  long expected = 0;
  thread_pool pool(4);
  for (long i = 1; i <= kTasks; ++i) {
    pool.submit(i);
    expected += i;
  }
  pool.shutdown();
  const long allocated = pool.free_tasks().allocated.load();
  const long reused = pool.free_tasks().reused.load();
  std::printf("tasks: %ld, allocated: %ld, reused from free lists: %ld\n", kTasks, allocated, reused);
  // Every task came from new or from a free list, and recycling happened.
  const bool ok = pool.sum() == expected && allocated + reused == kTasks && reused > 0;
  std::printf("%s: sum %ld (expected %ld)\n", ok ? "pool exact" : "POOL WRONG", pool.sum(), expected);
  return ok ? 0 : 1;
}
