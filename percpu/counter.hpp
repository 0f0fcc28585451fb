// percpu/counter.hpp: a counter that many threads bump without sharing a
// cache line.
//
// What it is for
//   Statistics, reference-count-like tallies and rate counters that are
//   written far more often than read. add() touches only the slot of the CPU
//   it runs on, with no atomic instruction: a restartable sequence (rseq)
//   adds to that slot and the kernel restarts it if the thread is preempted,
//   migrated or interrupted by a signal before the single committing store.
//   load() sums every slot.
//
// When not to use it
//   When you need the total on every update (use std::atomic), when reads
//   are as frequent as writes (load() reads max_cpus() slots, each in
//   another CPU's memory; cid_counter's reads the slots of the concurrency
//   ids used so far, see below), or for
//   a value that must never be observed half-updated across slots, such as a
//   gauge that goes up and down: see "What load() returns".
//
// What load() returns
//   load() reads the slots one after another while adds go on, so it is not
//   a snapshot. Each add is counted whole or not at all, and the result is the
//   sum of every add that happened before load() began plus some subset of
//   the adds that overlap it. Any subset: a thread migrating between slots
//   can have a later add counted and an earlier one not. So when every delta
//   has the same sign, the result lies between the totals before and after
//   load(); with mixed signs it need not. A gauge whose threads each add +1
//   then -1 (never below zero at any instant) can read negative: the -1 of a
//   thread was counted and its +1, made on a slot the walk had already
//   passed, was not. It can likewise read above any total it ever had.
//   There is no exact snapshot read: one would need every add to tell
//   readers it is under way (a second store, which breaks the single
//   committing store of the rseq section, or a shared cache line) or the
//   reader to stop the writers of every CPU. Once the adding threads are done
//   (joined or otherwise synchronised with), load() is exact.
//
// Without rseq
//   Threads that have no rseq area (old kernel, seccomp, valgrind, qemu-user,
//   a forced fallback backend) add with an atomic fetch_add to a second word
//   of the slot of the CPU the fallback reports. Where the fallback is the
//   getcpu system call (arm64 without rseq: no RDPID, no vDSO getcpu), the
//   CPU is asked only once every so many adds and the last answer used in
//   between (internal::cpu_hint()), so no add makes a system call; slot()
//   then shows adds on a CPU the thread ran on a moment before. A thread
//   found to have no rseq is remembered as such, so its adds do not ask
//   about its registration again. The rseq word of a slot is
//   only ever written by rseq sections on that slot's CPU and the atomic
//   word only by atomic read-modify-writes, so the two paths never lose each
//   other's updates. A thread whose rseq section keeps aborting uses the
//   atomic word after a bounded number of tries: add() never spins forever.
//
// Memory
//   16 bytes per CPU that adds to it, plus the counter itself (16 bytes):
//   the first add() takes the counter's per-CPU words from percpu's per-CPU
//   memory (internal/stride_arena.hpp), where CPU c's words of every counter
//   sit together in CPU c's region and no two CPUs' words share a cache
//   line; a page of a CPU's region fills only when that CPU first adds to
//   one of the counters on it (load() and the destructor only read the
//   other CPUs' words, which a stock kernel answers with its shared zero
//   page; a kernel without one, as some VM platforms run, fills a page
//   there too). 100,000 counters used on 2 CPUs take about 3 MB, where a
//   page each would take 400 MB. The memory is mapped without malloc and
//   without a lock, so the first add is async-signal-safe too; the
//   destructor gives the words back for reuse. If no memory can be mapped,
//   adds go to a single shared atomic and stay exact. A cid_counter is the
//   same: 16 bytes per concurrency id that adds to it, plus 16.
//
// Indexed by concurrency id: cid_counter
//   percpu::cid_counter is the same counter with its slots indexed by the
//   thread's concurrency id (concurrency_id(): the kernel's mm_cid, Linux
//   6.3+) instead of its CPU. The kernel keeps those ids dense, below the
//   number of possible CPUs and unique among the process's running threads,
//   so a process of a few threads uses a few slots whatever the host's
//   possible-CPU list says. What that changes:
//     - load() reads only the slots of ids some cid_counter has used so far
//       (internal/concurrency_limit.hpp: one limit for the process, raised
//       out of line when a thread first adds under an id at or above it),
//       not max_cpus() slots. On a host whose possible list is 0-4095, a
//       2-thread process reads about 2 slots instead of 4,096.
//     - slot(i) is what adds made under concurrency id i; threads without
//       rseq add under their CPU's id, as concurrency_id() answers them.
//       slots() is still max_cpus(); slots at or above the limit read 0.
//     - The memory is the same per slot used; fewer slots get used (the
//       ids that ran, not the CPUs), and the destructor reads only those.
//     - add() is one section with one committing add, as counter::add(),
//       which also reads the id's word and the limit and tests the id
//       against it: measured at 1.4 to 1.6 times counter::add()'s time on
//       one x86-64 host (docs/results.md, "Concurrency id"). Prefer counter
//       where adds dominate and the possible list is short.
//   Where the kernel keeps no mm_cid (before Linux 6.3, or an rseq area
//   registered by another library that says it is shorter), the
//   concurrency id is the CPU id, decided once at start-up
//   (percpu-bench prints which): a cid_counter is then a counter whose
//   load() reads the CPUs used so far. Without rseq it adds as counter does,
//   by CPU, with an atomic. The choice is per counter, by type, so that
//   neither add pays a test for the other; use counter where threads
//   outnumber CPUs and cid_counter where a process runs a few threads on a
//   host with many possible CPUs, or reads often.
//
// Thread safety and signals
//   add(), increment() and decrement(): thread-safe, async-signal-safe and
//   exact, including from a signal handler that interrupted another add() on
//   the same thread, and in a forked child.
//   load(), slot() and slots(): thread-safe and async-signal-safe; exact once
//   the adding threads are done (joined or otherwise synchronised with).
//   Construction is constexpr, so a global counter is constant-initialised
//   and usable from static constructors. Destroying a counter while another
//   thread still adds to it is undefined, as for any object. The destructor
//   returns the counter to its constant-initialised state, so a late use
//   from another static destructor reads zero, and a late add() takes fresh
//   words (never given back) instead of writing freed ones.
//   No member changes errno, even when the slots cannot be mapped.
//   No member is a cancellation point. An add() that a signal handler leaves
//   with siglongjmp (or pthread_exit) either counted or did not: it is one
//   committing store or one atomic add, and holds nothing.
//   ThreadSanitizer in your build reports no race inside a counter; it
//   orders nothing between threads, so it states no edge to TSan (README,
//   "Sanitizers in your build").
//   All of this holds for cid_counter as well.
#pragma once

#include <atomic>
#include <cstdint>

#include "percpu/cpu.hpp"
#include "percpu/internal/concurrency_limit.hpp"
#include "percpu/internal/rseq_cs.hpp"
#include "percpu/internal/stride_arena.hpp"

#pragma GCC visibility push(default)  // exported (see percpu/cpu.hpp)
namespace percpu {
namespace internal {

// The sum of the words of indexes [0, count) from `s` on, read while adds
// go on (see "What load() returns").
template <class Words>
inline std::int64_t sum_counter_words(const Words* s, unsigned count) noexcept {
  std::int64_t sum = 0;
  const Words* const end = stride_copy(s, count);
  for (; s != end; s = stride_copy(s, 1)) {
    // by_rseq: plain stores of sections under this index; read as a relaxed atomic.
    sum += static_cast<std::int64_t>(__atomic_load_n(&s->by_rseq, __ATOMIC_RELAXED)) +
           s->by_atomic.load(std::memory_order_relaxed);
  }
  return sum;
}

}  // namespace internal

class counter {
 public:
  constexpr counter() noexcept = default;
  ~counter();
  counter(const counter&) = delete;
  counter& operator=(const counter&) = delete;

  // Adds `delta` to the calling CPU's slot.
  void add(std::int64_t delta) noexcept;
  void increment() noexcept { add(1); }
  void decrement() noexcept { add(-1); }

  // The sum over all slots, plus the adds made while no memory could be
  // mapped for them (see Memory), which no slot holds.
  std::int64_t load() const noexcept;

  // The part of the sum held by slot `cpu` (what adds made while running on
  // that CPU). Valid indexes are [0, slots()). Out of range: debug builds
  // (NDEBUG not defined) print the index and abort; release builds return 0.
  std::int64_t slot(int cpu) const noexcept;

  // The number of slots: max_cpus().
  int slots() const noexcept;

 private:
  friend class cid_counter;  // the same words, by concurrency id

  // One per CPU, CPU c's at internal::stride_copy(slots_, c): in CPU c's
  // region of the per-CPU memory, beside the words of other counters that
  // CPU writes. `by_rseq` is written only by rseq sections running on this
  // slot's CPU; `by_atomic` only by atomic read-modify-writes.
  struct slot_words {
    std::intptr_t by_rseq;
    std::atomic<std::int64_t> by_atomic;
  };
  static_assert(sizeof(slot_words) == 16, "one arena object of 16 bytes");

  PERCPU_LOCAL slot_words* allocate() noexcept;
  void add_slow(std::int64_t delta) noexcept;

  // CPU 0's slot, or nullptr until the first add() takes the slots. There
  // are always max_cpus() slots, and the hot path's section commits only on
  // a CPU below max_cpus() (internal/rseq_cs.hpp, start_section()).
  std::atomic<slot_words*> slots_{nullptr};
  // Adds made when no block could be mapped.
  std::atomic<std::int64_t> unmapped_{0};
};

// The hot path: one section, started with no test of the CPU (see
// start_section() in internal/rseq_cs.hpp), that commits with a single add
// to the slot's rseq word. Everything that is not a registered thread on a
// CPU below max_cpus() in a process whose sections are on (before start-up,
// no rseq, a forced fallback) aborts in the section and goes to add_slow(),
// as does the first add(), which finds no slots. The fall-through is the
// section, so the common case runs straight down with no taken branch.
//
// slots_ is loaded relaxed: the hot path reads nothing the allocating thread
// wrote (the slots are zero when handed out), and the slot address depends
// on the loaded pointer.
inline void counter::add(std::int64_t delta) noexcept {
  const internal::section_start start = internal::start_section();
  slot_words* s = slots_.load(std::memory_order_relaxed);
  if (__builtin_expect(s != nullptr, 1) &&
      __builtin_expect(internal::rseq_addv_started(start, &internal::stride_copy_at(s, start)->by_rseq,
                                                   static_cast<std::intptr_t>(delta)) == 0,
                       1)) {
    return;
  }
  add_slow(delta);
}

// Inline, as a reader of librseq's per-CPU counter sums its item: the slots
// exist only once start-up is over, which set g_fast_path.cpu_limit to
// max_cpus() for good before any slots could be taken, and the acquire load
// of slots_ makes that store visible.
inline std::int64_t counter::load() const noexcept {
  std::int64_t sum = unmapped_.load(std::memory_order_relaxed);
  const slot_words* s = slots_.load(std::memory_order_acquire);
  if (s == nullptr) return sum;
  // Start-up's max_cpus(), stored before any slots existed.
  return sum + internal::sum_counter_words(
                   s, __atomic_load_n(&internal::g_fast_path.cpu_limit, __ATOMIC_RELAXED));
}

// A counter whose slots are indexed by concurrency id (see "Indexed by
// concurrency id: cid_counter" above). The same members as counter, with
// the same contracts, except where that section says.
class cid_counter {
 public:
  constexpr cid_counter() noexcept = default;
  ~cid_counter();
  cid_counter(const cid_counter&) = delete;
  cid_counter& operator=(const cid_counter&) = delete;

  // Adds `delta` to the slot of the calling thread's concurrency id.
  void add(std::int64_t delta) noexcept;
  void increment() noexcept { add(1); }
  void decrement() noexcept { add(-1); }

  // The sum over the slots of the ids used so far, plus the adds made while
  // no memory could be mapped.
  std::int64_t load() const noexcept;

  // The part of the sum held by slot `id`. Valid indexes are [0, slots());
  // out of range as counter::slot().
  std::int64_t slot(int id) const noexcept;

  // The number of slots: max_cpus(), which bounds every concurrency id.
  int slots() const noexcept;

 private:
  // Concurrency id i's at internal::stride_copy(slots_, i); `by_rseq` is
  // written only by sections running under id i.
  using slot_words = counter::slot_words;

  PERCPU_LOCAL slot_words* allocate() noexcept;
  void add_slow(std::int64_t delta) noexcept;

  // Id 0's slot, or nullptr until the first add() takes the slots
  // (max_cpus() of them, as counter's).
  std::atomic<slot_words*> slots_{nullptr};
  std::atomic<std::int64_t> unmapped_{0};
};

// The hot path: one section that reads the thread's concurrency id, tests
// it against the concurrency limit (so the slot exists and readers walk it)
// and commits with a single add at that id's slot. An id at or above the
// limit (a new high), no slots yet, no registration on the sections' area
// (no rseq, before start-up) and an aborted section go to add_slow().
inline void cid_counter::add(std::int64_t delta) noexcept {
  const internal::cid_start start = internal::start_cid_section();
  slot_words* s = slots_.load(std::memory_order_relaxed);
  if (__builtin_expect(s != nullptr, 1) &&
      __builtin_expect(
          internal::rseq_addv_cid_started(start, &s->by_rseq, internal::concurrency_limit(),
                                          static_cast<std::intptr_t>(delta)) == 0,
          1)) {
    return;
  }
  add_slow(delta);
}

// Reads the slots below the concurrency limit: every add that happened
// before the call wrote below what it loads (internal/concurrency_limit.hpp).
inline std::int64_t cid_counter::load() const noexcept {
  std::int64_t sum = unmapped_.load(std::memory_order_relaxed);
  const slot_words* s = slots_.load(std::memory_order_acquire);
  if (s == nullptr) return sum;
  return sum + internal::sum_counter_words(s, internal::concurrency_limit());
}

}  // namespace percpu
#pragma GCC visibility pop
