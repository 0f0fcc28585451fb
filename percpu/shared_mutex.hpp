// percpu/shared_mutex.hpp: a reader-writer lock whose readers write only
// their own CPU's cache line.
//
// What it is for
//   Data read by many threads and written rarely: configuration, routing
//   tables, a registry. lock_shared() adds one to the calling CPU's slot of a
//   per-CPU count of read locks (percpu::counter: an rseq add, no atomic
//   read-modify-write, no shared cache line written), then reads the writer
//   state. unlock_shared() adds one to a second per-CPU count, of unlocks.
//   A writer announces itself in the state word, fences every thread of the
//   process with membarrier(PRIVATE_EXPEDITED), and waits until the unlocks
//   add up to the locks. The lock meets the standard's SharedLockable and
//   Lockable requirements: std::shared_lock, std::unique_lock and
//   std::scoped_lock work with it.
//
// When not to use it
//   When writes are frequent: each lock() costs a membarrier system call
//   (an interrupt to every CPU running this process) and a walk over two
//   per-CPU arrays. When you need recursion, upgrades or timed locking: none
//   is offered. When memory is tight: two cache lines per possible CPU.
//
// Fairness
//   Readers that arrive after a writer announced itself wait behind it, so
//   a stream of readers cannot starve a writer. When a writer unlocks, the
//   readers that waited for it get in before the next writer announces
//   itself (that writer waits a bounded time for them), so writers cannot
//   starve readers either.
//
// Without rseq or without membarrier
//   Without rseq, the counts are the counter's atomic words (one relaxed
//   fetch_add on the CPU's own line). Without the membarrier command
//   (old kernel, seccomp, valgrind), the mutex switches at its first use to
//   fence mode: readers issue a sequentially consistent fence between their
//   increment and their check, and writers a fence instead of membarrier.
//   Both remain correct; readers still never write a shared cache line.
//
// Thread safety and signals
//   All members are thread-safe. A reader may lock on one CPU and unlock on
//   another, but unlock_shared() must be called by the thread that locked
//   (as for std::shared_mutex). lock_shared(), try_lock_shared() and
//   unlock_shared() are async-signal-safe once the mutex has been used once
//   outside a signal handler (its first use registers it for fork, which
//   takes a mutex), with one rule: a thread (or a handler that interrupted
//   it) must not take a read lock it already holds when a writer may be
//   waiting, as that writer waits for the read lock the thread holds. Debug
//   builds (NDEBUG not defined) detect that case, lock() by a thread holding
//   a read lock, and unlock_shared() without lock_shared(): each prints one
//   line and aborts. lock(), try_lock() and unlock() are not for signal
//   handlers.
//
// Fork
//   A mutex registers for fork at its first use. fork() waits until no
//   writer is announced or inside (unless the forking thread is that writer:
//   it keeps the write lock in parent and child), but not for readers, so a
//   thread may fork inside its read section. The child gets the mutex with
//   no writer and with the read locks held at the fork still counted: the
//   forking thread's, which it may unlock there, and those of the parent's
//   other threads, which nobody will unlock in the child. So the child can
//   always take read locks; its lock() waits forever if another parent
//   thread held a read lock at the fork.
//
// Construction is constexpr: a global shared_mutex is constant-initialised.
// Destroying it while any thread uses it is undefined, as for any object.
#pragma once

#include <atomic>
#include <cstdint>

#include "percpu/counter.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "percpu/internal/fork_registry.hpp"

#if defined(__SANITIZE_THREAD__)
#define PERCPU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PERCPU_TSAN 1
#endif
#endif
#if defined(PERCPU_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace percpu {

namespace internal {
// Debug-build bookkeeping of the read locks the calling thread holds (see
// shared_mutex.cpp). Out of line so that code built with and without NDEBUG
// can share one library.
void note_read_locked(const void* mutex) noexcept;
void note_read_unlocked(const void* mutex) noexcept;
}  // namespace internal

class shared_mutex : private internal::fork_participant {
 public:
  constexpr shared_mutex() noexcept = default;
  ~shared_mutex();
  shared_mutex(const shared_mutex&) = delete;
  shared_mutex& operator=(const shared_mutex&) = delete;

  // Exclusive: waits for the previous writer, announces itself, fences and
  // waits until every reader has left.
  void lock() noexcept;
  // Like lock(), but gives up (false) instead of waiting for another writer
  // or for readers.
  bool try_lock() noexcept;
  void unlock() noexcept;

  // Shared: waits only while a writer is announced or holds the lock.
  void lock_shared() noexcept;
  // Gives up (false) instead of waiting for a writer.
  bool try_lock_shared() noexcept;
  void unlock_shared() noexcept;

 private:
  // state_ bits. Readers take the fast path only when all of kSlowBits are
  // clear; the rest of the word is a generation that each writer's unlock
  // advances, so a reader asleep on the word cannot miss an unlock.
  static constexpr std::uint32_t kUninit = 1;   // mode not chosen yet
  static constexpr std::uint32_t kFences = 2;   // no membarrier: readers fence
  static constexpr std::uint32_t kWriter = 4;   // a writer is announced or holds
  static constexpr std::uint32_t kSlowBits = kUninit | kFences | kWriter;
  static constexpr std::uint32_t kGeneration = 8;

  void lock_shared_slow(std::uint32_t seen) noexcept;
  bool try_lock_shared_slow(std::uint32_t seen) noexcept;
  void unlock_shared_slow(std::uint32_t seen) noexcept;
  std::uint32_t initialize() noexcept;
  void back_out() noexcept;
  void wait_for_writer(std::uint32_t seen) noexcept;
  bool readers_gone() const noexcept;
  void lock_writers() noexcept;
  void unlock_writers() noexcept;
  void fence_readers(std::uint32_t state) noexcept;
  void before_fork() noexcept override;
  void after_fork() noexcept override;

  // Read by every reader; written by writers, and once by initialize().
  std::atomic<std::uint32_t> state_{kUninit};
  counter locks_;
  counter unlocks_;
  // Writers' side, on its own line.
  alignas(64) std::atomic<std::uint32_t> writers_{0};  // futex mutex: 0 free, 1 held, 2 contended
  // Advanced by readers that leave while a writer is announced; the writer
  // sleeps on it.
  std::atomic<std::uint32_t> drained_{0};
  // Readers asleep behind a writer; the next writer lets them in first.
  std::atomic<std::uint32_t> waiting_readers_{0};
  // pthread_self() of the thread holding the write lock, 0 if none: fork()
  // must not wait for writers_ on that thread's behalf.
  std::atomic<std::uintptr_t> writer_thread_{0};
  bool fork_took_writers_ = false;  // between before_fork and after_fork
};

// The reader fast path. The ordering argument is in shared_mutex.cpp
// ("Why a reader and a writer never both get in").
inline void shared_mutex::lock_shared() noexcept {
  locks_.increment();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint32_t seen = state_.load(std::memory_order_acquire);
  if (__builtin_expect((seen & kSlowBits) != 0, 0)) lock_shared_slow(seen);
#ifndef NDEBUG
  internal::note_read_locked(this);
#endif
}

inline bool shared_mutex::try_lock_shared() noexcept {
  locks_.increment();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint32_t seen = state_.load(std::memory_order_acquire);
  if (__builtin_expect((seen & kSlowBits) != 0, 0) && !try_lock_shared_slow(seen)) return false;
#ifndef NDEBUG
  internal::note_read_locked(this);
#endif
  return true;
}

inline void shared_mutex::unlock_shared() noexcept {
#ifndef NDEBUG
  internal::note_read_unlocked(this);
#endif
#if defined(PERCPU_TSAN)
  __tsan_release(this);  // TSan cannot see membarrier; the writer acquires this
#endif
  unlocks_.increment();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint32_t seen = state_.load(std::memory_order_relaxed);
  if (__builtin_expect((seen & (kFences | kWriter)) != 0, 0)) unlock_shared_slow(seen);
}

}  // namespace percpu
