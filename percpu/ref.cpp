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
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace percpu {

namespace {

[[noreturn]] void die(const char* message) noexcept {
  internal::nocancel_write_string(STDERR_FILENO, message);
  std::abort();
}

}  // namespace

// The words come from the per-CPU memory (internal/stride_arena.hpp) and
// the thread-index memory (internal/thread_slots.hpp), zero in every copy:
// every share 0, nothing folded, nobody busy. Only copies that a CPU or a
// thread writes ever fill a page.
ref::ref(release_function release, void* context) noexcept
    : release_(release), context_(context), count_(kBias + 1) {
  // ref.hpp, beside the fields: no cache line holds both count_ and a field
  // the inline paths read, for a ref at any address aligned as it must be.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
  static_assert(offsetof(ref, slots_) < offsetof(ref, killed_) &&
                    offsetof(ref, count_) >= offsetof(ref, killed_) + 64,
                "count_ a cache line past the fields the inline paths read");
#pragma GCC diagnostic pop
  const int count = max_cpus();
  slots_ = static_cast<slot_words*>(internal::stride_arena_for(sizeof(slot_words)).allocate());
  if (slots_ != nullptr) {
    slot_count_ = count;
    // Owner sections may write a slot only if kill() will be able to fence
    // its CPU; otherwise the words start locked and gets use the atomics.
    rseq_on_slots_ = internal::kHaveRseqSections && internal::slot_fence_available();
    if (!rseq_on_slots_) {
      for (int i = 0; i < count; ++i) {
        internal::stride_copy(slots_, static_cast<unsigned>(i))->rseq.head = internal::kSlotLocked;
      }
    }
    thread_slots_ = internal::new_thread_slot_copies();
  } else {
    count_.store(1, std::memory_order_relaxed);  // no slots: exact from the start
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
  if (slots_ != nullptr) internal::stride_arena_for(sizeof(slot_words)).deallocate(slots_);
  internal::delete_thread_slot_copies(thread_slots_);
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
  const std::int64_t after = count_.fetch_add(delta, std::memory_order_acq_rel) + delta;
  if (after <= 0 || (delta > 0 && after <= delta)) count_reached(delta, after);
  if (added != nullptr) *added = true;
}

void ref::count_reached([[maybe_unused]] std::int64_t delta, std::int64_t after) noexcept {
#ifndef NDEBUG
  if (delta > 0 && after - delta <= 0) die("percpu::ref::get: the ref was already released\n");
  if (after < 0) die("percpu::ref::put: more puts than gets\n");
#endif
  if (after == 0) release_now();
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
      internal::thread_slot* own =
          index >= 0 ? internal::thread_slot_at(thread_slots_, index) : nullptr;
      if (own != nullptr && internal::thread_slot_enter(own)) {
        // After kill() the word is folded, or being folded: hands off
        // (internal::wait_for_thread_slot_owners says why this read, after
        // the enter, sees kill()'s store in time).
        const bool folded = killed_.load(std::memory_order_relaxed) != 0;
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
    // Killed (or being killed): the count is count_, one atomic. An add there
    // is right at any time, since count_ is always part of the total; kill()
    // folds into it whatever the slots and words hold, and takes each for
    // good, so the steps below would end here too, after a section that
    // fails on a locked word and a read of a poisoned one. A thread without
    // rseq asks only after its own word's step: that step's read of killed_,
    // after the enter, is the one kill()'s wait for the owners orders, and
    // this earlier read of an unentered word would not be.
    if (killed_.load(std::memory_order_relaxed) != 0) {
      add_to_count(delta, only_if_alive, added);
      return;
    }
    if (area != nullptr) {
      for (int tries = 0; tries < internal::kSectionTries; ++tries) {
        const int cpu = internal::rseq_current_index<index_kind::cpu_id>(area);
        if (static_cast<unsigned>(cpu) >= count) break;
        std::intptr_t* word = &internal::stride_copy(slots_, static_cast<unsigned>(cpu))->rseq.head;
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
    std::atomic<std::int64_t>& word =
        internal::stride_copy(slots_, internal::cpu_hint_index(count))->by_atomic;
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
  if (add_local(2) == local_result::added) return true;
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
    slot_words& s = *internal::stride_copy(slots_, static_cast<unsigned>(cpu));
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
    // killed_, stored above, keeps every thread off its word from now on
    // (add_slow); once the threads inside have left, the words are final.
    // Read only: a word no thread wrote keeps its page unfilled.
    int indexes = 0;
    if (!internal::wait_for_thread_slot_owners(thread_slots_, &indexes)) {
      die("percpu::ref::kill: cannot stop the threads' words (membarrier failed)\n");
    }
    for (int i = 0; i < indexes; ++i) {
      sum += __atomic_load_n(&internal::thread_slot_at(thread_slots_, i)->head, __ATOMIC_RELAXED);
    }
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
    const slot_words& s = *internal::stride_copy(slots_, static_cast<unsigned>(cpu));
    const std::intptr_t word = __atomic_load_n(&s.rseq.head, __ATOMIC_RELAXED);
    if (word != internal::kSlotLocked) total += word / 2;
    const std::int64_t atomic = s.by_atomic.load(std::memory_order_relaxed);
    if (atomic != kPoisoned) total += atomic;
  }
  // Only indexes below the limit can have been written.
  const int threads = thread_slots_ != nullptr ? internal::thread_index_limit() : 0;
  for (int i = 0; i < threads; ++i) {
    total += __atomic_load_n(&internal::thread_slot_at(thread_slots_, i)->head, __ATOMIC_RELAXED);
  }
  return total;
}

// Nothing stops the threads' words across the fork: each get or put
// changes its word with one store, which the child sees done or not, and
// the child clears the busy flags of threads it does not have (which its
// kill() would otherwise wait for forever).
void ref::before_fork() noexcept { internal::fork_wait_for_flag(&kill_busy_); }

void ref::after_fork(bool child) noexcept {
  if (thread_slots_ != nullptr && child) {
    internal::clear_thread_slots_in_child(thread_slots_);
  }
  internal::fork_release_flag(&kill_busy_);
}

}  // namespace percpu
