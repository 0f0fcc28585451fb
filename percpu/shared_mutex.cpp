// percpu::shared_mutex: slow paths, writers, fork, and the debug checks.
//
// Why a reader and a writer never both get in
//
//   reader (lock_shared)                  writer (lock)
//   R1  own word += 1                     W1  state_ |= kWriter
//       (or locks_[cpu] += 1)
//   R2  compiler barrier                  W2  membarrier(PRIVATE_EXPEDITED)
//   R3  read state_                       W3  U = sum of unlocks_; fence;
//                                             T = sum of the words;
//                                             L = sum of locks_;
//                                             wait until T + L - U == 0
//
//   membarrier returns only after every thread of the process that was
//   running has executed a full memory barrier, and a thread that was not
//   running passes through the scheduler (a full barrier) before it runs
//   again. So on each reader thread there is a point B, somewhere between
//   the start and the end of W2, that acts as a full barrier between the
//   reader's accesses before it and after it, and W1 is visible to all at
//   the start of W2 (the system call entry is a full barrier).
//   - If R3 comes after B, it sees kWriter: the reader backs out.
//   - If R3 comes before B, so does R1 (program order, and the compiler
//     barrier keeps the compiler from sinking R1 below R3). Then R1 is
//     visible to every thread by the end of W2, and W3 counts it.
//   Either the reader sees the writer or the writer sees the reader: never
//   neither. This is Dekker's pattern with the reader's half of the fence
//   paid by the writer's system call. In fence mode R2 is a real sequentially
//   consistent fence and W2 is the fence in W3, which comes after W1 and
//   before the reads of the words and locks_ (on x86-64, W1 itself: a
//   locked instruction is a full barrier): the same argument, symmetric.
//
// Why a zero sum means no reader is inside
//   Call a reader that passed R3 without seeing kWriter "in". Each in
//   reader's +1 (on its thread's word or its CPU's locks_) is visible to W3
//   (above). Its -1 (on the word of whichever thread unlocks, or on the
//   unlocks_ of whichever CPU) may or may not be seen. So each in reader
//   adds 1 (inside) or 0 or 1 (left) to the sum, never less, provided no
//   unlock is seen without its lock. For in readers that holds (their lock
//   is always seen). A reader that backs out does its +1 and -1 in one
//   call, on one thread, in one place:
//   - on a word: W3 reads one value of that word, which only its thread
//     writes, so it sees a prefix of that thread's updates: +1 without -1,
//     both, or neither. Never the -1 alone.
//   - on the per-CPU counts, the +1 and the -1 may land on two CPUs, so one
//     signed count per CPU could show the -1 alone. Locks and unlocks are
//     therefore separate monotonic counts; the reader fences between its
//     +1 and its back-out -1, and W3 reads all unlocks first, fences, then
//     all locks: an unlock it counted has its lock visible by then.
//   A word may also hold the -1 of a read lock taken on another thread (a
//   coroutine resumed elsewhere): that lock was in, so its +1 is seen. So
//   the sum is at least the number of readers inside, and zero means none
//   (readers that come after W1 back out). A negative sum can only come
//   from an unlock_shared() without its lock_shared().
//
// Why the writer sees what readers read, and readers what writers wrote
//   A reader's loads inside its critical section must not return a value
//   the next writer stores after it saw that reader's unlock. The unlock's
//   -1 on a word is a release store, and a per-CPU unlock count follows a
//   release fence, so the writer, which reads the counts and then fences,
//   sees the reader's loads done before it writes. (On weaker architectures
//   than x86-64 the writer also issues a second membarrier after the counts
//   balance, as a belt and braces for the per-CPU counts, whose rseq stores
//   carry no order of their own.) Writer to reader: unlock() stores state_
//   with release order, readers read it with acquire.
//
// Writers in bursts
//   The membarrier in W2 is what lets readers skip a fence between R1 and R3;
//   a writer needs it only while readers may be on that fence-free path. So
//   W1 also sets kRecent, which sends readers to the slow path, where they
//   fence between R1 and R3 as in fence mode, and unlock() leaves it set. A
//   writer whose W1 finds kRecent already set (the fetch_or returns the state
//   it replaced) does W2 with a fence instead: every reader that can still
//   be on the fence-free path read state_ before the writer that set kRecent
//   issued its membarrier, so its R1 was visible by the end of that call,
//   and that writer finished before this one began (writers_ orders them).
//   A reader that sees kRecent and no kWriter fences and reads state_ again
//   before it counts itself in, so the same Dekker argument holds with two
//   real fences. kRecent ends when a reader on the slow path finds that the
//   last writer unlocked kRecentMs or more ago: it clears the bit with a
//   compare-and-swap that fails if a writer announced itself meanwhile, and
//   the next writer pays the membarrier again. So a burst of writers pays
//   one membarrier, and readers pay a fence each for kRecentMs after the
//   last writer of a burst; with no writer for longer, they are back on the
//   fast path. This is the kernel's percpu_rw_semaphore keeping readers on
//   their slow path for a grace period after a writer (rcu_sync), with a
//   coarse clock for the grace period.
//   W3 walks the words of the thread indexes claimed so far
//   (thread_index_limit()): a thread raises the limit before its first R1,
//   so a writer that sees an R1 sees a limit that covers it.
//
// Waiting
//   A reader that sees kWriter backs out (its -1, then a fence), wakes the
//   writer, and sleeps on state_ (a futex) until the generation changes.
//   Writers sleep on drained_, which every reader that leaves while kWriter
//   is set advances. In fence mode an unlock does not fence, so it may miss
//   the writer's kWriter and not advance drained_; that writer's sleeps are
//   bounded. Nobody spins on a flag another thread owns.

#include "percpu/shared_mutex.hpp"

#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "percpu/internal/futex.hpp"
#include "percpu/internal/nocancel.hpp"

namespace percpu {

namespace {

// Checks of state before a writer sleeps: a reader's critical section is
// usually short, so a few yields often end the wait without a system call.
constexpr int kWriterYields = 16;
// How long, in total, a writer lets the readers woken by the previous
// writer's unlock get in before it announces itself.
constexpr int kReaderTurnWaits = 4;
constexpr long kReaderTurnWaitNs = 250 * 1000;
// The longest sleep of a fence-mode writer between two looks at the counts.
constexpr long kFenceModeWaitNs = 1000 * 1000;
// How long after the last writer's unlock readers keep fencing (kRecent),
// so that the next writer needs no membarrier.
constexpr std::uint32_t kRecentMs = 10;

// CLOCK_MONOTONIC_COARSE in milliseconds, wrapping: a read of the vDSO's
// clock, a few nanoseconds, not a cancellation point, async-signal-safe.
// False if the clock cannot be read (readers then end kRecent at once).
bool coarse_ms(std::uint32_t* ms) noexcept {
  struct timespec now;
  const int saved_errno = errno;
  const bool ok = clock_gettime(CLOCK_MONOTONIC_COARSE, &now) == 0;
  errno = saved_errno;
  if (ok) *ms = static_cast<std::uint32_t>(now.tv_sec * 1000 + now.tv_nsec / 1000000);
  return ok;
}

[[noreturn]] void die(const char* message) noexcept {
  internal::nocancel_write_string(STDERR_FILENO, message);
  std::abort();
}

#ifndef NDEBUG
// The read locks the calling thread holds, for the debug checks. Entries
// beyond the array are counted but not remembered; checks that would need
// them are skipped.
constexpr int kHeldSlots = 8;
struct held_read_locks {
  const void* mutex[kHeldSlots];
  int count;
};
__thread held_read_locks t_held __attribute__((tls_model("initial-exec")));

bool holds_read_lock(const void* mutex) noexcept {
  const int stored = t_held.count < kHeldSlots ? t_held.count : kHeldSlots;
  for (int i = 0; i < stored; ++i) {
    if (t_held.mutex[i] == mutex) return true;
  }
  return false;
}
#endif

}  // namespace

namespace internal {

std::intptr_t g_reader_line_tls_offset = 0;

void note_read_locked(const void* mutex) noexcept {
#ifndef NDEBUG
  const int n = t_held.count;
  if (n < kHeldSlots) t_held.mutex[n] = mutex;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_held.count = n + 1;
#else
  (void)mutex;
#endif
}

void note_read_unlocked(const void* mutex) noexcept {
#ifndef NDEBUG
  const int n = t_held.count;
  const int stored = n < kHeldSlots ? n : kHeldSlots;
  for (int i = stored - 1; i >= 0; --i) {
    if (t_held.mutex[i] == mutex) {
      t_held.mutex[i] = t_held.mutex[stored - 1];
      std::atomic_signal_fence(std::memory_order_seq_cst);
      t_held.count = n - 1;
      return;
    }
  }
  if (n > kHeldSlots) {  // may be one of the entries not remembered
    t_held.count = n - 1;
    return;
  }
  die("percpu::shared_mutex::unlock_shared: this thread holds no read lock on this mutex\n");
#else
  (void)mutex;
#endif
}

}  // namespace internal

shared_mutex::~shared_mutex() {
  if ((state_.load(std::memory_order_acquire) & kUninit) == 0) unregister_for_fork();
  internal::delete_thread_group_copies(words_.load(std::memory_order_relaxed));
}

// Chooses the mode once per mutex: membarrier if the process can use it,
// fences otherwise, and takes the reader words (every one zero: nobody
// counted), unless another thread did first. Threads keep the per-CPU
// counts if no memory can be mapped. The winner of the race registers the
// mutex for fork.
std::uint32_t shared_mutex::initialize() noexcept {
  if (words_.load(std::memory_order_acquire) == nullptr) {
    void* memory = internal::new_thread_group_copies();
    if (memory != nullptr) {
      // Every thread's line offset lives at this one offset in static TLS.
      __atomic_store_n(&internal::g_reader_line_tls_offset,
                       reinterpret_cast<char*>(&internal::t_thread_group_offset_plus_one) -
                           internal::thread_pointer(),
                       __ATOMIC_RELAXED);
      internal::tsan_release(&words_);  // readers acquire it in reader_word()
      internal::reader_word* expected = nullptr;
      if (!words_.compare_exchange_strong(expected, static_cast<internal::reader_word*>(memory),
                                          std::memory_order_acq_rel, std::memory_order_acquire)) {
        internal::delete_thread_group_copies(memory);
      }
    }
  }
  const std::uint32_t mode = internal::barrier_available() ? 0 : kFences;
  std::uint32_t seen = state_.load(std::memory_order_acquire);
  while ((seen & kUninit) != 0) {
    const std::uint32_t next = (seen & ~kUninit) | mode;
    if (state_.compare_exchange_weak(seen, next, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      register_for_fork();
      return next;
    }
  }
  return seen;
}

void shared_mutex::count_lock(word* w) noexcept {
  if (w != nullptr) {
    add(w, 1);
  } else {
    locks_.increment();
  }
}

void shared_mutex::count_unlock(word* w) noexcept {
  if (w != nullptr) {
    add(w, -1);
  } else {
    unlocks_.increment();
  }
}

// Undoes a lock count that met a writer, in the same place. The first fence
// makes a per-CPU lock count visible before the unlock that cancels it (see
// "Why a zero sum"); a word needs none, but this is the slow path.
void shared_mutex::back_out(word* w) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  count_unlock(w);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  drained_.fetch_add(1, std::memory_order_seq_cst);
  internal::futex_wake_all(&drained_);
}

// The thread has no word to count on yet (its first read lock, or the
// mutex's first use) or none at all (beyond the thread slots).
void shared_mutex::lock_shared_counted() noexcept {
  if (words_.load(std::memory_order_acquire) != nullptr && internal::t_thread_index_plus_one == 0) {
    (void)internal::thread_index();  // claims one for this and later calls
  }
  word* w = reader_word();
  count_lock(w);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint32_t seen = state_.load(std::memory_order_acquire);
  if ((seen & kSlowBits) != 0) lock_shared_slow(seen, w);
}

bool shared_mutex::try_lock_shared_counted() noexcept {
  if (words_.load(std::memory_order_acquire) != nullptr && internal::t_thread_index_plus_one == 0) {
    (void)internal::thread_index();
  }
  word* w = reader_word();
  count_lock(w);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint32_t seen = state_.load(std::memory_order_acquire);
  return (seen & kSlowBits) == 0 || try_lock_shared_slow(seen, w);
}

void shared_mutex::unlock_shared_counted() noexcept {
  std::atomic_thread_fence(std::memory_order_release);  // as the word's release store
  unlocks_.increment();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint32_t seen = state_.load(std::memory_order_relaxed);
  if ((seen & kWriter) != 0) unlock_shared_slow();
}

void shared_mutex::wait_for_writer(std::uint32_t seen) noexcept {
#ifndef NDEBUG
  if (holds_read_lock(this)) {
    die("percpu::shared_mutex::lock_shared: this thread already holds a read lock and a writer "
        "waits for it: deadlock\n");
  }
#endif
  waiting_readers_.fetch_add(1, std::memory_order_seq_cst);
  while ((seen & kWriter) != 0) {
    internal::futex_wait(&state_, seen);
    seen = state_.load(std::memory_order_acquire);
  }
  if (waiting_readers_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
    internal::futex_wake_all(&waiting_readers_);
  }
}

// A reader that counted itself in and saw kRecent with no writer: ends
// kRecent if the last writer left long enough ago (see "Writers in bursts").
void shared_mutex::end_recent_if_quiet(std::uint32_t seen) noexcept {
  if ((seen & (kRecent | kWriter)) != kRecent) return;
  std::uint32_t now = 0;
  if (coarse_ms(&now) &&
      now - last_unlock_ms_.load(std::memory_order_relaxed) < kRecentMs) {
    return;
  }
  // Fails, harmlessly, if a writer announced itself or another reader won.
  state_.compare_exchange_strong(seen, seen & ~kRecent, std::memory_order_relaxed);
}

void shared_mutex::lock_shared_slow(std::uint32_t seen, word* w) noexcept {
  // Our count is already in w (or locks_ when w is nullptr).
  if ((seen & (kUninit | kWriter)) == 0) {  // fence mode or kRecent, no writer seen
    std::atomic_thread_fence(std::memory_order_seq_cst);
    seen = state_.load(std::memory_order_seq_cst);
    if ((seen & kWriter) == 0) {
      end_recent_if_quiet(seen);
      return;
    }
  }
  back_out(w);
  for (;;) {
    seen = state_.load(std::memory_order_acquire);
    if ((seen & kUninit) != 0) seen = initialize();
    if ((seen & kWriter) != 0) {
      wait_for_writer(seen);
      continue;
    }
    // initialize() may have just mapped the words.
    if (words_.load(std::memory_order_acquire) != nullptr &&
        internal::t_thread_index_plus_one == 0) {
      (void)internal::thread_index();
    }
    w = reader_word();
    count_lock(w);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    seen = state_.load(std::memory_order_seq_cst);
    // As on the inline path: a state that makes writers rely on readers'
    // fences (kFences, kRecent) needs the fence before the check counts.
    if ((seen & (kFences | kRecent)) != 0 && (seen & kWriter) == 0) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      seen = state_.load(std::memory_order_seq_cst);
    }
    if ((seen & kWriter) == 0) {
      end_recent_if_quiet(seen);
      return;
    }
    back_out(w);
  }
}

bool shared_mutex::try_lock_shared_slow(std::uint32_t seen, word* w) noexcept {
  if ((seen & kUninit) != 0) {
    // Nobody can have relied on a mode yet; choose it, then decide as the
    // chosen mode would have. Our count stays where it is: the words being
    // mapped now changes where later counts go, not where this one went.
    (void)initialize();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    seen = state_.load(std::memory_order_seq_cst);
  } else if ((seen & kWriter) == 0) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    seen = state_.load(std::memory_order_seq_cst);
  }
  if ((seen & kWriter) == 0) {
    end_recent_if_quiet(seen);
    return true;
  }
  back_out(w);
  return false;
}

// An unlock that saw the writer: wake it. In fence mode an unlock does not
// fence before it reads state_, so it may miss a writer that announced
// itself meanwhile; such a writer bounds its sleeps instead (lock()).
void shared_mutex::unlock_shared_slow() noexcept {
  drained_.fetch_add(1, std::memory_order_seq_cst);
  internal::futex_wake_all(&drained_);
}

// Writers exclude each other with a three-state futex mutex.
void shared_mutex::lock_writers() noexcept {
  std::uint32_t expected = 0;
  if (writers_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
  while (writers_.exchange(2, std::memory_order_acquire) != 0) internal::futex_wait(&writers_, 2);
}

void shared_mutex::unlock_writers() noexcept {
  if (writers_.exchange(0, std::memory_order_release) == 2) internal::futex_wake(&writers_, 1);
}

namespace {

// W2 of the proof while readers may skip their fence.
void membarrier_readers() noexcept {
  if (!internal::barrier_all()) {
    // Readers rely on it and nothing else can stand in for it.
    die("percpu::shared_mutex: membarrier failed after it was registered\n");
  }
}

}  // namespace

// W1 and W2. Sets kRecent too. A writer that finds it set already, or fence
// mode, relies on the readers' fences (see "Writers in bursts"): its own
// half of Dekker's pattern is then the fence in readers_gone() between this
// read-modify-write and its reads of the counts (on x86-64, the
// read-modify-write itself). Returns whether it issued
// no membarrier.
bool shared_mutex::announce_writer() noexcept {
  const std::uint32_t before = state_.fetch_or(kWriter | kRecent, std::memory_order_seq_cst);
  const bool fenced_only = (before & (kFences | kRecent)) != 0;
  if (!fenced_only) membarrier_readers();
  return fenced_only;
}

// On weakly ordered machines, after the counts balance: belt and braces for
// the per-CPU counts, whose rseq stores carry no order of their own.
void shared_mutex::fence_after_readers_gone(bool fenced_only) noexcept {
#if defined(__x86_64__)
  (void)fenced_only;
#else
  if (fenced_only) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  } else {
    membarrier_readers();
  }
#endif
}

// W3: unlocks first, then the words, then locks (see "Why a zero sum").
// Every caller has done W1, a read-modify-write of state_, before.
bool shared_mutex::readers_gone() const noexcept {
  const std::int64_t unlocks = unlocks_.load();
#if defined(__x86_64__)
  // The fence's two duties cost nothing here: W1's read-modify-write is a
  // locked instruction, a full barrier between it and these reads, and
  // x86-64 keeps loads in order (the unlocks before the locks).
  std::atomic_signal_fence(std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  std::int64_t sum = 0;
  const internal::reader_word* words = words_.load(std::memory_order_acquire);
  const int limit = words != nullptr ? internal::thread_index_limit() : 0;
  // A group's lines side by side, then the next group's copy.
  for (int group = 0; group * internal::kThreadGroup < limit; ++group) {
    const internal::reader_word* line = internal::stride_copy(words, static_cast<unsigned>(group));
    const int lines = std::min(internal::kThreadGroup, limit - group * internal::kThreadGroup);
    for (int j = 0; j < lines; ++j) sum += line[j].count.load(std::memory_order_relaxed);
  }
  sum += locks_.load() - unlocks;
#ifndef NDEBUG
  if (sum < 0) {
    die("percpu::shared_mutex: more read unlocks than read locks (unlock_shared() without "
        "lock_shared())\n");
  }
#endif
  return sum == 0;
}

void shared_mutex::lock() noexcept {
#ifndef NDEBUG
  if (holds_read_lock(this)) {
    die("percpu::shared_mutex::lock: this thread holds a read lock on this mutex: deadlock\n");
  }
#endif
  lock_writers();
  if ((state_.load(std::memory_order_acquire) & kUninit) != 0) (void)initialize();
  // The readers the previous writer woke get in before this one announces.
  for (int i = 0; i < kReaderTurnWaits; ++i) {
    const std::uint32_t waiting = waiting_readers_.load(std::memory_order_seq_cst);
    if (waiting == 0) break;
    internal::futex_wait(&waiting_readers_, waiting, kReaderTurnWaitNs);
  }
  const bool fenced_only = announce_writer();
  for (int round = 0;; ++round) {
    const std::uint32_t drained = drained_.load(std::memory_order_seq_cst);
    if (readers_gone()) break;
    if (round < kWriterYields) {
      sched_yield();
    } else if (fenced_only) {
      // A reader's unlock does not fence, so without the membarrier it may
      // not see this writer and not wake it (unlock_shared_slow): wake up
      // now and then to look again.
      internal::futex_wait(&drained_, drained, kFenceModeWaitNs);
    } else {
      internal::futex_wait(&drained_, drained);
    }
  }
  fence_after_readers_gone(fenced_only);
  internal::tsan_acquire(this);                // the previous writer's unlock()
  internal::tsan_acquire(readers_released());  // every reader's unlock_shared()
  writer_thread_.store(static_cast<std::uintptr_t>(pthread_self()), std::memory_order_relaxed);
}

bool shared_mutex::try_lock() noexcept {
#ifndef NDEBUG
  if (holds_read_lock(this)) {
    die("percpu::shared_mutex::try_lock: this thread holds a read lock on this mutex\n");
  }
#endif
  std::uint32_t expected = 0;
  if (!writers_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return false;
  if ((state_.load(std::memory_order_acquire) & kUninit) != 0) (void)initialize();
  const bool fenced_only = announce_writer();
  if (!readers_gone()) {
    unlock();  // lets in the readers that backed out meanwhile
    return false;
  }
  fence_after_readers_gone(fenced_only);
  internal::tsan_acquire(this);                // the previous writer's unlock()
  internal::tsan_acquire(readers_released());  // every reader's unlock_shared()
  writer_thread_.store(static_cast<std::uintptr_t>(pthread_self()), std::memory_order_relaxed);
  return true;
}

void shared_mutex::unlock() noexcept {
  internal::tsan_release(this);  // readers' lock_shared() and the next writer acquire it
  const std::uint32_t state = state_.load(std::memory_order_relaxed);
  if ((state & kWriter) == 0) {
#ifndef NDEBUG
    die("percpu::shared_mutex::unlock: the mutex is not locked for writing\n");
#else
    return;
#endif
  }
  writer_thread_.store(0, std::memory_order_relaxed);
  std::uint32_t now = 0;
  if (coarse_ms(&now)) last_unlock_ms_.store(now, std::memory_order_relaxed);
  // Only the writer changes state_ while kWriter is set; kRecent stays. The
  // release order publishes last_unlock_ms_ to readers that see the state.
  state_.store((state & ~kWriter) + kGeneration, std::memory_order_seq_cst);
  if (waiting_readers_.load(std::memory_order_seq_cst) != 0) internal::futex_wake_all(&state_);
  unlock_writers();
}

// fork() waits for a writer in progress, so the child never inherits a
// half-announced writer, but not for readers: a thread may fork (popen,
// system) inside its own read section. A thread that forks while it holds
// the write lock keeps it, in both processes.
void shared_mutex::before_fork() noexcept {
  const std::uintptr_t self = static_cast<std::uintptr_t>(pthread_self());
  fork_took_writers_ = writer_thread_.load(std::memory_order_relaxed) != self;
  if (fork_took_writers_) lock_writers();
}

void shared_mutex::after_fork(bool /*child*/) noexcept {
  if (fork_took_writers_) unlock_writers();
}

}  // namespace percpu
