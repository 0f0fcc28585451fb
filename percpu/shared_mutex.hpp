// percpu/shared_mutex.hpp: a reader-writer lock whose readers write only
// a word of their own thread.
//
// What it is for
//   Data read by many threads and written rarely: configuration, routing
//   tables, a registry. lock_shared() adds one to the calling thread's own
//   word in this mutex (a plain load and store: no atomic read-modify-write,
//   no rseq section, no shared cache line written), then reads the writer
//   state; unlock_shared() subtracts one from the word of the thread that
//   calls it. A writer announces itself in the state word, fences every
//   thread of the process with membarrier(PRIVATE_EXPEDITED) (see "Writers
//   in bursts"), and waits until the sum of every thread's word (and of the
//   per-CPU counts below) is zero. The lock meets the standard's SharedLockable and Lockable
//   requirements: std::shared_lock, std::unique_lock and std::scoped_lock
//   work with it.
//
//   Threads beyond the process's thread slots (internal::kThreadSlots live
//   threads), and every thread when the words could not be mapped, count on
//   two per-CPU counts instead, of locks and of unlocks (percpu::counter:
//   an rseq add with rseq, a relaxed fetch_add on the CPU's own line
//   without).
//
// Writers in bursts
//   A writer that comes while no other writer has come for 10 ms (a lone
//   writer) pays a membarrier system call, an interrupt to every CPU running
//   this process: some hundreds of nanoseconds to microseconds. It leaves
//   readers on their slow path, where each read lock adds a fence (a locked
//   instruction) and a read of the coarse clock, until a reader finds no
//   writer in the last 10 ms (by CLOCK_MONOTONIC_COARSE, so 10 ms give or
//   take one clock tick); the next writer is then a lone writer again. A writer
//   that comes within that time (a burst) needs no membarrier: a few atomic
//   instructions, a read of the coarse clock, and a walk over one word per
//   thread index claimed so far in the process and two per-CPU arrays. If no
//   reader comes at all, every later writer is in the burst. With readers
//   always present, the cost of a write is the membarrier once per burst
//   and the readers' fences for 10 ms after it.
//
// When not to use it
//   When writes are frequent and spread out, so each comes alone: each such
//   lock() costs a membarrier, and each one keeps readers fencing for 10 ms
//   (see "Writers in bursts"). When you need recursion,
//   upgrades or timed locking: none is offered.
//
// Memory
//   The mutex itself (128 bytes, two cache lines: the readers', the
//   writers'), plus 256 bytes for each group of four thread indexes whose
//   threads read-lock it: the reader words are a cache line per thread
//   index, four indexes' lines side by side, from percpu's thread-group
//   memory (internal/thread_slots.hpp), so that a process with few threads
//   pays one group and a writer walks one run of lines; a group no thread
//   touches costs nothing. The two per-CPU counts come from percpu's
//   per-CPU memory and fill a CPU's page only for threads beyond the thread
//   slots. 10,000 mutexes, each read-locked once from one thread and
//   write-locked once, take about 420 bytes each (percpu-bench
//   --structures, the memory table).
//
// Indexed by thread, not by CPU
//   Its reader words follow the threads already (one line per thread
//   index), and a writer walks those of the thread indexes claimed so far
//   in the process, however many CPUs are possible: there is no
//   concurrency-id form, and none is needed. Only the two per-CPU counts,
//   for threads beyond the thread slots, are by CPU.
//
// Fairness
//   Readers that arrive after a writer announced itself wait behind it, so
//   a stream of readers cannot starve a writer. When a writer unlocks, the
//   readers that waited for it get in before the next writer announces
//   itself (that writer waits a bounded time for them), so writers cannot
//   starve readers either.
//
// Without rseq or without membarrier
//   Readers never needed rseq on their own words: without it only the
//   threads beyond the thread slots are slower (their per-CPU counts use
//   atomic fetch_add). Without the membarrier command (old kernel, seccomp,
//   valgrind), the mutex switches at its first use to fence mode:
//   lock_shared() issues a sequentially consistent fence between its update
//   and its check, writers a fence instead of membarrier, and unlock_shared()
//   no fence at all (so a writer waiting for readers in this mode sleeps in
//   bounded steps, as an unlock may not wake it). Both modes are correct;
//   readers still never write a shared cache line.
//
// Thread safety and signals
//   All members are thread-safe. A reader may lock on one CPU and unlock on
//   another. It may also unlock on another thread than the one that locked
//   (a coroutine resumed elsewhere): the words are signed and the writer
//   sums them all, so a +1 on one thread's word and a -1 on another's still
//   balance, even after either thread exits (a thread that takes over an
//   exited thread's slot takes over its word). Debug builds keep their
//   misuse checks per thread, though, and report such an unlock as misuse:
//   code that moves read locks between threads must build with NDEBUG.
//   lock_shared(), try_lock_shared() and unlock_shared() are
//   async-signal-safe once the mutex has been used once outside a signal
//   handler (its first use maps the words and registers it for fork, which
//   takes a mutex), with two rules: a signal handler releases every read
//   lock it takes before it returns, and never releases one that the code it
//   interrupted took (the interrupted code may be between the load and the
//   store of the same word); and a thread (or a handler that interrupted it)
//   must not take a read lock it already holds when a writer may be
//   waiting, as that writer waits for the read lock the thread holds. Debug
//   builds (NDEBUG not defined) detect that case, lock() by a thread holding
//   a read lock, and unlock_shared() without lock_shared(): each prints one
//   line and aborts. lock(), try_lock() and unlock() are not for signal
//   handlers.
//   No member is a cancellation point: readers and writers sleep on futexes
//   through the raw system call, so a deferred pthread_cancel() never acts
//   inside one (unlike pthread_rwlock's waits, these are not cancellation
//   points). No member may be left by a jump out of a signal handler
//   (siglongjmp) or ended there by pthread_exit(): a read lock left half
//   taken counts as held for ever, so lock() then waits for ever, as for
//   any lock that is never released, and a writer left inside lock() or
//   unlock() makes lock() and fork() wait for ever (not detected).
//   ThreadSanitizer in your build sees the lock order each section after the
//   write sections before it (and a write section after the read sections
//   too), never one reader after another, however percpu was built (README,
//   "Sanitizers in your build").
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
#include "percpu/internal/sanitizers.hpp"
#include "percpu/internal/thread_pointer.hpp"
#include "percpu/internal/thread_slots.hpp"

#pragma GCC visibility push(default)  // exported (see percpu/cpu.hpp)
namespace percpu {

namespace internal {
// Debug-build bookkeeping of the read locks the calling thread holds (see
// shared_mutex.cpp). Out of line so that code built with and without NDEBUG
// can share one library.
void note_read_locked(const void* mutex) noexcept;
void note_read_unlocked(const void* mutex) noexcept;

// The offset of t_thread_group_offset_plus_one (internal/thread_slots.hpp:
// where the thread's reader word is in every mutex's words) from the thread
// pointer, 0 until the first shared_mutex is initialised. Read through a
// fresh thread pointer on every call, so a coroutine resumed on another
// thread counts on that thread's word (see cpu.hpp).
extern std::intptr_t g_reader_line_tls_offset;

// One thread index's count of read locks in one mutex: +1 per lock, -1 per
// unlock by the thread holding the index. Written only by that thread (and
// its signal handlers), with a relaxed load and a relaxed store; read by
// writers. A line of the thread-group memory (internal/thread_slots.hpp).
struct alignas(64) reader_word {
  std::atomic<std::int64_t> count;
};
static_assert(sizeof(reader_word) == kThreadGroupLine, "one line of a thread group");
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
  static constexpr std::uint32_t kUninit = 1;  // mode not chosen yet
  static constexpr std::uint32_t kFences = 2;  // no membarrier: readers fence
  static constexpr std::uint32_t kWriter = 4;  // a writer is announced or holds
  // A writer came lately: readers fence, so the next writer needs no
  // membarrier ("Writers in bursts" in shared_mutex.cpp).
  static constexpr std::uint32_t kRecent = 8;
  static constexpr std::uint32_t kSlowBits = kUninit | kFences | kWriter | kRecent;
  static constexpr std::uint32_t kGeneration = 16;

  using word = std::atomic<std::int64_t>;
  // TSan's view of the lock (internal/sanitizers.hpp): writers release
  // `this` and readers and writers acquire it; readers release
  // readers_released() and only writers acquire it, so TSan sees no edge
  // from one reader to another.
  const void* readers_released() const noexcept { return reinterpret_cast<const char*>(this) + 1; }
  // The calling thread's word, or nullptr: the per-CPU counts then.
  word* reader_word() const noexcept;
  static void add(word* w, std::int64_t step) noexcept;
  PERCPU_LOCAL void count_lock(word* w) noexcept;
  PERCPU_LOCAL void count_unlock(word* w) noexcept;
  void lock_shared_counted() noexcept;
  bool try_lock_shared_counted() noexcept;
  void unlock_shared_counted() noexcept;
  void lock_shared_slow(std::uint32_t seen, word* w) noexcept;
  bool try_lock_shared_slow(std::uint32_t seen, word* w) noexcept;
  void unlock_shared_slow() noexcept;
  PERCPU_LOCAL std::uint32_t initialize() noexcept;
  PERCPU_LOCAL void back_out(word* w) noexcept;
  PERCPU_LOCAL void wait_for_writer(std::uint32_t seen) noexcept;
  PERCPU_LOCAL bool readers_gone() const noexcept;
  PERCPU_LOCAL void lock_writers() noexcept;
  PERCPU_LOCAL void unlock_writers() noexcept;
  PERCPU_LOCAL bool announce_writer() noexcept;
  PERCPU_LOCAL static void fence_after_readers_gone(bool fenced_only) noexcept;
  PERCPU_LOCAL void end_recent_if_quiet(std::uint32_t seen) noexcept;
  void before_fork() noexcept override;
  void after_fork(bool child) noexcept override;

  // Read by every reader; written by writers, and once by initialize().
  std::atomic<std::uint32_t> state_{kUninit};
  // The reader words: index i's at internal::thread_group_offset(i) bytes
  // from here. Taken by initialize(); nullptr before, or if no memory could
  // be mapped.
  std::atomic<internal::reader_word*> words_{nullptr};
  // The counts of threads without a word (beyond the thread slots).
  counter locks_;
  // Writers' side, on its own line, with the unlock count, which writers
  // read first and which only those threads write (the mutex fits in two
  // lines).
  alignas(64) counter unlocks_;
  std::atomic<std::uint32_t> writers_{0};  // futex mutex: 0 free, 1 held, 2 contended
  // Advanced by readers that leave while a writer is announced; the writer
  // sleeps on it.
  std::atomic<std::uint32_t> drained_{0};
  // Readers asleep behind a writer; the next writer lets them in first.
  std::atomic<std::uint32_t> waiting_readers_{0};
  // When the last writer unlocked, in milliseconds of CLOCK_MONOTONIC_COARSE
  // (wrapping): readers end kRecent once it is old enough.
  std::atomic<std::uint32_t> last_unlock_ms_{0};
  // pthread_self() of the thread holding the write lock, 0 if none: fork()
  // must not wait for writers_ on that thread's behalf.
  std::atomic<std::uintptr_t> writer_thread_{0};
  bool fork_took_writers_ = false;  // between before_fork and after_fork
};
static_assert(sizeof(shared_mutex) == 128, "two cache lines: the readers', the writers'");

// The reader fast path. The ordering argument is in shared_mutex.cpp
// ("Why a reader and a writer never both get in").
//
// words_ with acquire order: initialize() sets g_reader_line_tls_offset before
// it publishes the words, so a reader that sees them reads a real offset.
inline shared_mutex::word* shared_mutex::reader_word() const noexcept {
  internal::reader_word* words = words_.load(std::memory_order_acquire);
  if (__builtin_expect(words == nullptr, 0)) return nullptr;
  PERCPU_TSAN_ACQUIRE(&words_);  // initialize() mapped them on another thread
  const int line_plus_one = internal::load_tp_relative_i32(
      __atomic_load_n(&internal::g_reader_line_tls_offset, __ATOMIC_RELAXED));
  if (__builtin_expect(line_plus_one <= 0, 0)) return nullptr;
  return &reinterpret_cast<internal::reader_word*>(reinterpret_cast<char*>(words) +
                                                   (line_plus_one - 1))
              ->count;
}

// Only the owning thread writes its word, so a load and a store make the
// add. A signal handler that interrupts them between the load and the store
// and takes and releases read locks leaves the word as it found it (its
// adds sum to zero), so the interrupted store writes the right value.
inline void shared_mutex::add(word* w, std::int64_t step) noexcept {
  w->store(w->load(std::memory_order_relaxed) + step, std::memory_order_relaxed);
}

inline void shared_mutex::lock_shared() noexcept {
  word* w = reader_word();
  if (__builtin_expect(w != nullptr, 1)) {
    add(w, 1);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    const std::uint32_t seen = state_.load(std::memory_order_acquire);
    if (__builtin_expect((seen & kSlowBits) != 0, 0)) lock_shared_slow(seen, w);
  } else {
    lock_shared_counted();
  }
  PERCPU_TSAN_ACQUIRE(this);
#ifndef NDEBUG
  internal::note_read_locked(this);
#endif
}

inline bool shared_mutex::try_lock_shared() noexcept {
  word* w = reader_word();
  if (__builtin_expect(w != nullptr, 1)) {
    add(w, 1);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    const std::uint32_t seen = state_.load(std::memory_order_acquire);
    if (__builtin_expect((seen & kSlowBits) != 0, 0) && !try_lock_shared_slow(seen, w)) {
      return false;
    }
  } else if (!try_lock_shared_counted()) {
    return false;
  }
  PERCPU_TSAN_ACQUIRE(this);
#ifndef NDEBUG
  internal::note_read_locked(this);
#endif
  return true;
}

inline void shared_mutex::unlock_shared() noexcept {
#ifndef NDEBUG
  internal::note_read_unlocked(this);
#endif
  PERCPU_TSAN_RELEASE(readers_released());  // the next writer's lock() acquires it
  word* w = reader_word();
  if (__builtin_expect(w == nullptr, 0)) {
    unlock_shared_counted();
    return;
  }
  // Release: the reads of the critical section stay before the -1 (see
  // "Why the writer sees what readers read").
  w->store(w->load(std::memory_order_relaxed) - 1, std::memory_order_release);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint32_t seen = state_.load(std::memory_order_relaxed);
  if (__builtin_expect((seen & kWriter) != 0, 0)) unlock_shared_slow();
}

}  // namespace percpu
#pragma GCC visibility pop
