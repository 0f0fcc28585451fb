// percpu/ref.hpp: a reference count whose get() and put() touch only the
// calling CPU's cache line until its owner kills it.
//
// What it is for
//   Objects that many threads pin briefly (a module, a device, a cgroup in
//   the kernel, a connection table here) and that one owner tears down once.
//   Until kill(), get() and put() add to the CPU's slot with an rseq
//   compare-and-store, no atomic read-modify-write. kill() drops the owner's
//   initial reference and folds every slot into one atomic count; from then
//   on get() and put() use that count, and the release function runs exactly
//   once, when it reaches zero: after the last put, whichever CPU or thread
//   makes it, and even if that put is on another CPU than its get.
//
// When not to use it
//   When the count must be known while the object is alive (there is no
//   cheap total before kill()), or when kill() is frequent (it fences each
//   CPU with a membarrier system call).
//
// Without rseq
//   A thread without rseq adds to a word of its own, a thread slot
//   (percpu/internal/thread_slots.hpp), inline: a plain add between a "busy"
//   store and a check that kill() has not begun, no atomic instruction, no
//   system call (its first get() or put() claims the thread's index).
//   kill() stops every thread's word with one membarrier PRIVATE_EXPEDITED,
//   waits for the threads inside one, and folds the words in; from then on
//   such a thread's get() and put() are the atomic count's one
//   read-modify-write, inline, as a registered thread's are. Where that
//   command is missing,
//   or beyond the thread slots' number of live threads, such a thread adds
//   to an atomic word in the slot of a CPU it ran on recently (one
//   compare-exchange on a line no other CPU writes). kill() takes each CPU
//   slot with the remote-access protocol of percpu/internal/cpu_slots.hpp:
//   the rseq word by exchange and a membarrier fence of its CPU, the atomic
//   word by exchange. Where the fence is unavailable (old kernel, seccomp,
//   valgrind) the ref keeps rseq off its slots from construction and uses
//   the atomic words only. If the slots cannot be mapped, everything goes to
//   the single atomic count; still exact.
//
// Memory
//   The ref itself (104 bytes, 28 of them a gap that keeps the count,
//   which every get() and put() writes after kill(), off the cache line
//   holding what they read first), plus 32 bytes per possible CPU and 32 per
//   thread without rseq that used it: its words come from percpu's per-CPU
//   memory (internal/stride_arena.hpp, one copy per CPU) and from memory
//   laid out the same way by thread index (internal/thread_slots.hpp), so a
//   CPU or a thread that never touches a ref costs it nothing, and no two
//   CPUs' or threads' words share a cache line. 100,000 refs, each taken,
//   dropped and killed once on a 2-CPU machine with rseq, take about 175
//   bytes each, where each took a page of its own before.
//   kill() writes every possible CPU's words (it takes them for good), so a
//   killed ref costs 32 bytes per possible CPU even where only some CPUs
//   ran. Construction makes no system call (a new chunk of the per-CPU
//   memory, once per 2,000 refs or so, makes one); if no memory can be
//   mapped, the ref counts with its single atomic from the start.
//
// By CPU only: no concurrency-id form
//   A ref has no form indexed by concurrency id (as cid_counter is
//   counter's). get() and put() would pay the id's read and its test
//   against the concurrency limit in their sections (1.3 to 1.5 times a
//   counter add by CPU, docs/results.md), and kill() would have to fence
//   every CPU the process runs on, since an id names no CPU. What by-CPU
//   indexing costs instead is kill()'s walk and its memory: it takes every
//   possible CPU's words, so on a host whose possible list is 0-4095 a
//   killed ref has written 4,096 of them (about 128 KiB of per-CPU memory
//   for that ref, see Memory), where one indexed by id would write those of
//   the ids used. Many refs killed on such a host cost that much each.
//
// Thread safety and signals
//   get(), try_get() and put() are thread-safe and async-signal-safe (put()
//   as long as the release function is, since it may run inside it); a
//   reference may be put by another thread or on another CPU than its get.
//   kill() is thread-safe but not async-signal-safe (it may wait for a fork
//   in progress). The release function runs on the thread whose put() or
//   kill() dropped the last reference. No member is a cancellation point.
//   A get() or put() that a signal handler leaves with siglongjmp (or ends
//   with pthread_exit()) may or may not have counted, so the count is no
//   longer exact; on a thread without rseq it also leaves that thread's
//   word busy for ever. kill() does not wait for such a word: it reports it
//   (one line on stderr; debug builds then abort) and folds it as it is.
//   kill() itself must not be left by a jump.
//   ThreadSanitizer in your build sees every put() and the kill() happen
//   before the release function, however percpu was built (README,
//   "Sanitizers in your build").
//
// Misuse (debug builds, NDEBUG not defined: one line on stderr, then abort)
//   kill() twice; a put() that takes the count below zero (seen once the
//   count is atomic: at kill() or after it); get() after the release (use
//   try_get()); destroying a ref with references outstanding.
//
// Fork
//   The child gets the ref with the counts it had at the fork, as they were:
//   references held by the parent's other threads stay counted. A kill() in
//   progress in another thread finishes before the fork happens.
#pragma once

#include <atomic>
#include <cstdint>

#include "percpu/cpu.hpp"
#include "percpu/internal/cpu_slots.hpp"
#include "percpu/internal/fork_registry.hpp"
#include "percpu/internal/rseq_cs.hpp"
#include "percpu/internal/sanitizers.hpp"
#include "percpu/internal/stride_arena.hpp"
#include "percpu/internal/thread_slots.hpp"

#pragma GCC visibility push(default)  // exported (see percpu/cpu.hpp)
namespace percpu {

class ref : private internal::fork_participant {
 public:
  using release_function = void (*)(void* context);

  // Starts alive, in per-CPU mode, holding the owner's initial reference.
  explicit ref(release_function release, void* context = nullptr) noexcept;
  ~ref();
  ref(const ref&) = delete;
  ref& operator=(const ref&) = delete;

  // Takes a reference. Before kill() it always succeeds; after it, only
  // while references remain (else: debug builds abort; use try_get()).
  void get() noexcept;
  // Takes a reference unless the count already reached zero.
  [[nodiscard]] bool try_get() noexcept;
  // Drops a reference; runs the release function if it was the last one
  // after kill().
  void put() noexcept;

  // Drops the owner's initial reference and switches to the atomic count.
  void kill() noexcept;

  bool killed() const noexcept { return killed_.load(std::memory_order_acquire) != 0; }
  bool released() const noexcept { return released_.load(std::memory_order_acquire) != 0; }
  // The number of references held. Exact once killed, or when nobody gets
  // or puts meanwhile; otherwise somewhere between the counts before and after.
  std::int64_t count() const noexcept;

 private:
  // One per CPU, CPU c's at internal::stride_copy(slots_, c), in CPU c's
  // region of the per-CPU memory (internal/stride_arena.hpp). The rseq word
  // holds twice the CPU's share of the count, so it is always even and
  // never internal::kSlotLocked, which kill() leaves in it. by_atomic is for
  // threads without rseq that have no thread slot.
  struct slot_words {
    internal::cpu_slot_words rseq;
    std::atomic<std::int64_t> by_atomic;
  };
  static_assert(sizeof(slot_words) == 24, "an object of the arena's 32-byte class");

  // While per-CPU slots exist, the atomic count carries this bias, so gets
  // and puts that reach it before kill() folds the slots in cannot make it
  // touch zero.
  static constexpr std::int64_t kBias = std::int64_t{1} << 60;
  static constexpr std::int64_t kPoisoned = INT64_MIN;

  // What add_local() found: committed, the CPU's word taken (kill() took it,
  // or the ref keeps sections off its slots), or anything else.
  enum class local_result { added, word_locked, other };
  local_result add_local(std::intptr_t step) noexcept;
  bool add_own(std::int64_t delta) noexcept;
  void add_slow(std::int64_t delta, bool only_if_alive, bool* added) noexcept;
  // get() or put() made `delta` on the count after kill() and left it at
  // `after`, not above zero (or a get found it not above zero): runs the
  // release function at zero, and in debug builds aborts on misuse, as
  // add_to_count() does.
  void count_reached(std::int64_t delta, std::int64_t after) noexcept;
  PERCPU_LOCAL void add_to_count(std::int64_t delta, bool only_if_alive, bool* added) noexcept;
  PERCPU_LOCAL void release_now() noexcept;
  void before_fork() noexcept override;
  void after_fork(bool child) noexcept override;

  // The fields get() and put() read inline, side by side at the start, and
  // count_ at least a cache line after the last of them, wherever the ref
  // sits (ref.cpp checks the distance): after kill() every get() and put()
  // writes count_, and a thread whose first access to count_'s line were a
  // read (the slots pointer, killed_) would fetch that line twice per
  // operation, shared and then owned, where the atomic it replaces fetches
  // it once.
  slot_words* slots_ = nullptr;  // CPU 0's copy; nullptr when no memory could be mapped
  std::atomic<std::uint8_t> killed_{0};
  std::atomic<std::uint8_t> released_{0};
  bool rseq_on_slots_ = false;
  int slot_count_ = 0;  // max_cpus(), or 0 without slots
  // The threads' words (internal/thread_slots.hpp), one copy per thread
  // index, for threads without rseq (head: the thread's share of the count,
  // until killed_), or nullptr where thread slots are not usable or could
  // not be mapped.
  internal::thread_slot* thread_slots_ = nullptr;
  release_function release_;
  void* context_;
  int kill_busy_ = 0;  // a flag (cpu_slots.hpp): held while kill() runs and across fork
  [[maybe_unused]] unsigned char count_line_gap_[28] = {};
  std::atomic<std::int64_t> count_;
};

// The hot path: a started compare-and-store of the CPU's rseq word
// (internal/rseq_cs.hpp, "The hot paths' form"), value plus `step` (+2 for
// get, -2 for put). It reports word_locked for a locked word (kill() took
// it, or the ref keeps sections off its slots: their words start locked),
// and other, for the caller's slow path, for a thread with no registration
// on the sections' area (no rseq, before start-up, the test seam), a ref
// without slots and an aborted section. The word is read before the
// section only once the started area shows a CPU: the kernel keeps
// cpu_id_start a CPU id there, below max_cpus(), so at a copy that exists.
// No mark of the thread is needed for kill()'s lockers: the section users
// count covers every registration a started section can commit under
// (cpu_slots.hpp, "The started form").
inline ref::local_result ref::add_local(std::intptr_t step) noexcept {
  const internal::section_start start = internal::start_section();
  if (__builtin_expect(internal::started_area_unregistered(start), 0)) return local_result::other;
  slot_words* s = slots_;
  if (__builtin_expect(s == nullptr, 0)) return local_result::other;
  std::intptr_t* word = &internal::stride_copy_at(s, start)->rseq.head;
  const std::intptr_t seen = *reinterpret_cast<volatile std::intptr_t*>(word);
  if (step < 0) PERCPU_TSAN_RELEASE(this);  // a put: after its last read of *this
  if (__builtin_expect(seen == internal::kSlotLocked, 0)) return local_result::word_locked;
  return __builtin_expect(internal::rseq_cmpeqv_storev_started(start, word, seen, seen + step) == 0,
                          1)
             ? local_result::added
             : local_result::other;
}

// A thread without rseq (its section state says so: cpu_slots.hpp,
// section_area()) adds to its own word inline, as add_slow()'s first step
// does and under the same protocol (thread_slots.hpp): false, for add_slow,
// where the ref has no thread words, the thread has not claimed its index
// yet, the word is busy or revoked, or kill() has begun (killed_ read after
// the enter, which kill()'s wait for the owners orders).
inline bool ref::add_own(std::int64_t delta) noexcept {
  internal::thread_slot* own = internal::own_slot_if_no_rseq(thread_slots_);
  if (__builtin_expect(own == nullptr || !internal::thread_slot_enter(own), 0)) return false;
  const bool folded = killed_.load(std::memory_order_relaxed) != 0;
  if (__builtin_expect(!folded, 1)) {
    __atomic_store_n(&own->head, __atomic_load_n(&own->head, __ATOMIC_RELAXED) + delta,
                     __ATOMIC_RELAXED);
  }
  internal::thread_slot_leave(own);
  return !folded;
}

// After kill() every thread adds to the count inline, one atomic as the
// kernel's percpu_ref after its kill: a registered thread once it finds its
// CPU's word locked, a thread without rseq (or a ref without slots) at once.
// An add there is right at any time (ref.cpp, add_slow), and killed_ set
// means the slots are being folded or are folded; only reading it unset
// needs the slow path's order. Before kill() a thread without rseq adds to
// its own word inline (add_own); a locked word (sections kept off the
// slots), an aborted section, or an own word not to be had now goes to
// add_slow(), which keeps the per-CPU atomic words and the threads' words.
inline void ref::get() noexcept {
  const local_result r = add_local(2);
  if (__builtin_expect(r == local_result::added, 1)) return;
  if (__builtin_expect(killed_.load(std::memory_order_relaxed) != 0, 1)) {
    const std::int64_t before = count_.fetch_add(1, std::memory_order_acq_rel);
    if (__builtin_expect(before > 0, 1)) return;
    count_reached(1, before + 1);  // a get after the release
    return;
  }
  if (add_own(1)) return;
  add_slow(1, false, nullptr);
}

// TSan (internal/sanitizers.hpp): put releases the ref after its last
// access to it that TSan sees (in add_local, or here before the library's
// slow path), and release_now() acquires it before it calls the release
// function.
inline void ref::put() noexcept {
  const local_result r = add_local(-2);
  if (__builtin_expect(r == local_result::added, 1)) return;
  if (__builtin_expect(killed_.load(std::memory_order_relaxed) != 0, 1)) {
    PERCPU_TSAN_RELEASE(this);  // where add_local left before its own
    const std::int64_t after = count_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if (__builtin_expect(after > 0, 1)) return;
    count_reached(-1, after);
    return;
  }
  PERCPU_TSAN_RELEASE(this);
  if (add_own(-1)) return;
  add_slow(-1, false, nullptr);
}

}  // namespace percpu
#pragma GCC visibility pop
