// Example: a thread pool's per-CPU free list.
//
// A pool runs many small tasks. Allocating each task with new/delete, or
// recycling them through one shared free list, makes every worker contend on
// one lock or one cache line. Here finished tasks go back to the free list of
// the CPU the worker runs on, and new tasks are taken from the submitting
// thread's CPU, so recycling stays CPU-local.
//
// percpu::free_list does the per-CPU part: push and pop are rseq critical
// sections on the calling CPU's list, with no lock and no atomic instruction.
// A thread that moved to another CPU mid-way simply restarts on the new one,
// so the CPU id needs no protection of its own here. When the local list is
// empty, pop() takes from other CPUs' lists before giving up.
//
// Build against an installed percpu:
//   g++ -std=c++17 thread_pool_free_list.cpp $(pkg-config --cflags --libs percpu)
#include <percpu/free_list.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace {

struct task {
  long input = 0;
  percpu::free_list_node link;  // used while the task is on a free list
};

task* task_of(percpu::free_list_node* node) {
  return reinterpret_cast<task*>(reinterpret_cast<char*>(node) - offsetof(task, link));
}

// Recycled tasks, on a list per possible CPU.
class task_recycler {
 public:
  ~task_recycler() {
    for (percpu::free_list_node* n = free_.take_all(); n != nullptr;) {
      percpu::free_list_node* next = n->next;
      delete task_of(n);
      n = next;
    }
  }

  task* get() {
    if (percpu::free_list_node* n = free_.pop()) {
      reused.fetch_add(1, std::memory_order_relaxed);
      return task_of(n);
    }
    allocated.fetch_add(1, std::memory_order_relaxed);
    return new task;
  }

  void put(task* t) { free_.push(&t->link); }

  std::atomic<long> allocated{0};
  std::atomic<long> reused{0};

 private:
  percpu::free_list free_;
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
  task_recycler& free_tasks() { return free_tasks_; }

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

  task_recycler free_tasks_;  // destroyed after the workers have joined
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
  std::printf("tasks: %ld, allocated: %ld, reused from free lists: %ld\n", kTasks, allocated,
              reused);
  // Every task came from new or from a free list, and recycling happened.
  const bool ok = pool.sum() == expected && allocated + reused == kTasks && reused > 0;
  std::printf("%s: sum %ld (expected %ld)\n", ok ? "pool exact" : "POOL WRONG", pool.sum(),
              expected);
  return ok ? 0 : 1;
}
