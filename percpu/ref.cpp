// percpu::ref: slot mapping, the atomic paths, kill() and the debug checks.
//
// Why kill() counts every reference exactly once
//   The true count is always
//     (count_ - kBias while not folded) + sum over slots of (rseq word / 2 +
//     atomic word).
//   kill() takes each slot for good. The rseq word it takes with lock_slot
//   (exchange with kSlotLocked, membarrier fence of that CPU, re-read): on
//   acquired, no owner section that read the old value can still commit, and
//   later sections see kSlotLocked, fail their compare and go to the atomic
//   word. The atomic word it takes by exchange with kPoisoned; every update
//   of it is a compare-exchange that refuses kPoisoned and goes to count_.
//   So after its slot is taken, no get or put lands in a slot, and each value
//   taken is final. kill() adds the values, takes away the bias and the
//   initial reference in one fetch_add: from then on count_ alone is the
//   count, and whoever moves it to zero runs the release function. Before
//   that fetch_add count_ holds the bias, so nobody else can see zero.

#include "percpu/ref.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/nocancel.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace percpu {

namespace {

[[noreturn]] void die(const char* message) noexcept {
  internal::nocancel_write_string(STDERR_FILENO, message);
  std::abort();
}

std::size_t slots_bytes(int count) { return 128 * static_cast<std::size_t>(count); }
constexpr std::size_t kThreadSlotsBytes = sizeof(internal::thread_slot) * internal::kThreadSlots;

}  // namespace

ref::ref(release_function release, void* context) noexcept
    : count_(kBias + 1), release_(release), context_(context) {
  const int count = max_cpus();
  const int saved_errno = errno;
  void* memory =
      mmap(nullptr, slots_bytes(count), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  errno = saved_errno;
  if (memory != MAP_FAILED) {
    slots_ = static_cast<slot*>(memory);
    slot_count_ = count;
    // Owner sections may write a slot only if kill() will be able to fence
    // its CPU; otherwise the words start locked and gets use the atomics.
    rseq_on_slots_ = internal::kHaveRseqSections && internal::slot_fence_available();
    if (!rseq_on_slots_) {
      for (int i = 0; i < count; ++i) slots_[i].rseq.head = internal::kSlotLocked;
    }
  } else {
    count_.store(1, std::memory_order_relaxed);  // no slots: exact from the start
  }
  if (slots_ != nullptr && internal::thread_slots_usable()) {
    const int saved = errno;
    void* words = mmap(nullptr, kThreadSlotsBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    errno = saved;
    // Zero-filled: every share 0, nothing folded, nobody busy.
    if (words != MAP_FAILED) thread_slots_ = static_cast<internal::thread_slot*>(words);
  }
  register_for_fork();
}

ref::~ref() {
  unregister_for_fork();
#ifndef NDEBUG
  if (killed() ? !released() : count() != 1) {
    die(killed() ? "percpu::ref: destroyed after kill() with references outstanding\n"
                 : "percpu::ref: destroyed with references taken by get() and not put\n");
  }
#endif
  if (slots_ != nullptr) munmap(slots_, slots_bytes(slot_count_));
  if (thread_slots_ != nullptr) munmap(thread_slots_, kThreadSlotsBytes);
}

void ref::release_now() noexcept {
  if (released_.exchange(1, std::memory_order_acq_rel) != 0) {
    die("percpu::ref: the count reached zero twice (put without get)\n");
  }
  internal::tsan_acquire(this);  // every put(), and kill()
  if (release_ != nullptr) release_(context_);
}

// The count_ path: exact once kill() folded the slots in, biased before.
void ref::add_to_count(std::int64_t delta, bool only_if_alive, bool* added) noexcept {
  if (only_if_alive) {
    std::int64_t seen = count_.load(std::memory_order_relaxed);
    do {
      if (seen <= 0) {
        *added = false;
        return;
      }
    } while (!count_.compare_exchange_weak(seen, seen + delta, std::memory_order_acq_rel,
                                           std::memory_order_relaxed));
    *added = true;
    return;
  }
  const std::int64_t before = count_.fetch_add(delta, std::memory_order_acq_rel);
  const std::int64_t after = before + delta;
#ifndef NDEBUG
  if (delta > 0 && before <= 0) die("percpu::ref::get: the ref was already released\n");
  if (after < 0) die("percpu::ref::put: more puts than gets\n");
#endif
  if (after == 0) release_now();
  if (added != nullptr) *added = true;
}

void ref::add_slow(std::int64_t delta, bool only_if_alive, bool* added) noexcept {
  using internal::index_kind;
  const unsigned count = static_cast<unsigned>(slot_count_);
  if (count != 0) {
    internal::rseq_area* area = rseq_on_slots_ ? internal::section_area() : nullptr;
    if (area == nullptr && thread_slots_ != nullptr &&
        internal::t_section_state != internal::section_user::forced_locked) {
      // A thread without rseq: its own word, until kill() folds it.
      const int index = internal::thread_index();
      internal::thread_slot* own = index >= 0 ? &thread_slots_[index] : nullptr;
      if (own != nullptr && internal::thread_slot_enter(own)) {
        const bool folded = __atomic_load_n(&own->aux, __ATOMIC_RELAXED) != 0;
        if (!folded) {
          __atomic_store_n(&own->head, __atomic_load_n(&own->head, __ATOMIC_RELAXED) + delta,
                           __ATOMIC_RELAXED);
        }
        internal::thread_slot_leave(own);
        if (!folded) {
          if (added != nullptr) *added = true;
          return;
        }
      }
    }
    if (area != nullptr) {
      for (int tries = 0; tries < internal::kSectionTries; ++tries) {
        const int cpu = internal::rseq_current_index<index_kind::cpu_id>(area);
        if (static_cast<unsigned>(cpu) >= count) break;
        std::intptr_t* word = &slots_[cpu].rseq.head;
        const std::intptr_t seen = __atomic_load_n(word, __ATOMIC_RELAXED);
        if (seen == internal::kSlotLocked) break;
        if (internal::rseq_cmpeqv_storev<index_kind::cpu_id>(area, word, seen, seen + 2 * delta,
                                                             cpu) == 0) {
          if (added != nullptr) *added = true;
          return;
        }
      }
    }
    // Any slot's atomic word is correct; a recent CPU of this thread's keeps
    // the line local (internal::cpu_hint(): no fallback query per call).
    const unsigned cpu = static_cast<unsigned>(internal::cpu_hint());
    std::atomic<std::int64_t>& word = slots_[cpu < count ? cpu : cpu % count].by_atomic;
    std::int64_t seen = word.load(std::memory_order_relaxed);
    while (seen != kPoisoned) {
      if (word.compare_exchange_weak(seen, seen + delta, std::memory_order_acq_rel,
                                     std::memory_order_relaxed)) {
        if (added != nullptr) *added = true;
        return;
      }
    }
  }
  add_to_count(delta, only_if_alive, added);
}

bool ref::try_get() noexcept {
  // Before kill() folds the slots in, the initial reference keeps the count
  // above zero, so the per-CPU paths may add; after, every slot is taken and
  // add_slow ends at count_, which refuses zero.
  using internal::index_kind;
  if (internal::rseq_area* area = internal::section_area()) {
    const int cpu = internal::rseq_current_index<index_kind::cpu_id>(area);
    if (static_cast<unsigned>(cpu) < static_cast<unsigned>(slot_count_)) {
      std::intptr_t* word = &slots_[cpu].rseq.head;
      const std::intptr_t seen = *reinterpret_cast<volatile std::intptr_t*>(word);
      if (seen != internal::kSlotLocked &&
          internal::rseq_cmpeqv_storev<index_kind::cpu_id>(area, word, seen, seen + 2, cpu) == 0) {
        return true;
      }
    }
  }
  bool added = false;
  add_slow(1, true, &added);
  return added;
}

void ref::kill() noexcept {
  internal::tsan_release(this);  // drops the owner's reference, as put() does (ref.hpp)
  if (killed_.exchange(1, std::memory_order_acq_rel) != 0) {
#ifndef NDEBUG
    die("percpu::ref::kill: called twice\n");
#else
    return;
#endif
  }
  // Waits for a fork in progress. Only a fork handler holds kill_busy_
  // besides this kill, so false means one was left by a jump (reported).
  const bool took_kill_flag = internal::wait_for_flag(&kill_busy_);
  // The fork handler waits for kill_busy_, so this kill must finish while
  // a fork is pending, taking the locks below (see begin_fork_flags).
  internal::exempt_from_fork_pending(true);
  std::int64_t sum = 0;
  for (int cpu = 0; cpu < slot_count_; ++cpu) {
    slot& s = slots_[cpu];
    if (rseq_on_slots_) {
      std::intptr_t value = 0;
      for (;;) {
        const internal::lock_result r = internal::lock_slot(&s.rseq, cpu, &value);
        if (r == internal::lock_result::acquired) break;
        if (r == internal::lock_result::refused) {
          // Sections may have written the word and cannot be fenced now
          // (membarrier went away after construction): no exact count.
          die("percpu::ref::kill: cannot fence the CPUs any more (membarrier failed)\n");
        }
        sched_yield();
      }
      // Taken for good: the word keeps kSlotLocked and the locker flag.
      sum += value / 2;
    }
    sum += s.by_atomic.exchange(kPoisoned, std::memory_order_acq_rel);
  }
  if (thread_slots_ != nullptr) {
    // Every thread's word at once, with one barrier (see
    // internal::revoke_all_thread_slots), then folded.
    if (!internal::revoke_all_thread_slots(thread_slots_)) {
      die("percpu::ref::kill: cannot revoke the threads' words (membarrier failed, or a kill() or "
          "fork handler was left by a jump)\n");
    }
    for (int i = 0; i < internal::kThreadSlots; ++i) {
      internal::thread_slot* ts = &thread_slots_[i];
      sum += __atomic_load_n(&ts->head, __ATOMIC_RELAXED);
      __atomic_store_n(&ts->head, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&ts->aux, 1, __ATOMIC_RELAXED);  // from now on its owner uses count_
    }
    internal::restore_all_thread_slots(thread_slots_);
  }
#if !defined(__x86_64__)
  // A put's earlier loads must not be satisfied after the release function
  // runs; on weakly ordered machines its plain store does not order them.
  if (rseq_on_slots_) (void)internal::barrier_all();
#endif
  const std::int64_t fold = slots_ != nullptr ? sum - kBias - 1 : -1;
  const std::int64_t after = count_.fetch_add(fold, std::memory_order_acq_rel) + fold;
  internal::exempt_from_fork_pending(false);
  if (took_kill_flag) internal::release_flag(&kill_busy_);
#ifndef NDEBUG
  if (after < 0) die("percpu::ref::put: more puts than gets\n");
#endif
  if (after == 0) release_now();
}

std::int64_t ref::count() const noexcept {
  std::int64_t total = count_.load(std::memory_order_acquire);
  // Without the bias, count_ alone is the count: folded, or no slots.
  if (total < kBias / 2) return total;
  total -= kBias;
  for (int cpu = 0; cpu < slot_count_; ++cpu) {
    const std::intptr_t word = __atomic_load_n(&slots_[cpu].rseq.head, __ATOMIC_RELAXED);
    if (word != internal::kSlotLocked) total += word / 2;
    const std::int64_t atomic = slots_[cpu].by_atomic.load(std::memory_order_relaxed);
    if (atomic != kPoisoned) total += atomic;
  }
  for (int i = 0; thread_slots_ != nullptr && i < internal::kThreadSlots; ++i) {
    total += __atomic_load_n(&thread_slots_[i].head, __ATOMIC_RELAXED);
  }
  return total;
}

// The threads' words are revoked across the fork, so the child never
// inherits one in the middle of a get or put (which its kill() would wait
// for forever).
void ref::before_fork() noexcept {
  internal::fork_wait_for_flag(&kill_busy_);
  if (thread_slots_ != nullptr) internal::revoke_thread_slots_for_fork(thread_slots_);
}

void ref::after_fork() noexcept {
  if (thread_slots_ != nullptr) internal::restore_thread_slots_after_fork(thread_slots_);
  internal::fork_release_flag(&kill_busy_);
}

}  // namespace percpu
