// Do not include directly; not a stable API (internal to percpu).
//
// Thread slots: the path of threads without rseq.
//
// Why
//   A thread without rseq cannot update a shared per-CPU slot without atomic
//   read-modify-writes (two exchanges per lock_slot), which makes every
//   operation slower than a mutex or malloc's thread cache. So each such
//   thread gets a slot of its own in every structure, indexed by a small
//   per-process thread index, and updates it with plain loads and stores.
//
// The owner protocol (thread_slot_enter / thread_slot_leave)
//   The owner stores busy = 1, then (a compiler barrier only) reads revoked;
//   if it is set, or busy was already 1 (a signal handler that interrupted
//   its own thread's operation), the owner leaves the slot alone and takes
//   the shared path. It ends with a release store of busy = 0.
//
// Remote access (lock_thread_slot / unlock_thread_slot)
//   Steals, take_all and trim take the slot's locker flag, store
//   revoked = 1, issue barrier_all() (membarrier PRIVATE_EXPEDITED), then
//   read busy. This is the asymmetric Dekker of shared_mutex: after the
//   barrier, either the owner's busy = 1 is visible here or the owner's later
//   read of revoked sees 1. busy = 1: report busy (never wait; the owner may
//   be the thread this handler interrupted), clearing revoked. busy = 0: the
//   slot is the locker's until unlock_thread_slot clears revoked.
//   Without the membarrier command, thread slots are not used at all
//   (thread_slots_usable() is false) and threads without rseq keep the
//   locked per-CPU path. Under ThreadSanitizer, which cannot see membarrier
//   order, they are not used either.
//
// Thread indexes
//   thread_index() hands each thread an index of a process-wide table once,
//   with a compare-and-swap: first a free one or one whose thread has
//   exited (tgkill(pid, tid, 0) fails with ESRCH) among a few of those
//   handed out so far, looked at from a cursor that moves on with every
//   claim; else the lowest never-used one; when none is left, any exited
//   thread's. So the indexes in use stay near the most threads alive at
//   once, and a claim makes at most a few tgkill calls while indexes
//   remain. An exited thread's index is taken over along with what its
//   slots hold in every structure, which is exactly what a new owner of
//   those slots should get. A forked child's thread keeps its index (a
//   fork handler records its new tid); the parent's other indexes are free to be taken there.
//   Beyond kThreadSlots live threads, later ones get -1 and keep the locked per-CPU path.
//
// Stopping every owner for good (wait_for_thread_slot_owners)
//   ref::kill() needs no lock: it stores a flag of its own that owners read
//   after entering, and one barrier, then waits for the owners inside.
//
// Where the slots are
//   A structure's slots are one object of the thread-index memory
//   (new_thread_slot_copies): index i's slot is thread_slot_at(copies, i),
//   kStride bytes after index i - 1's, so the slots of one index in every
//   structure share that index's pages, and a structure pays only for the
//   indexes whose threads write to it. A new slot is all zero: an empty
//   list (the structures' lists end in nullptr), nobody busy, nothing
//   revoked, the locker free.
//   Walks over every thread's slot stop at thread_index_limit().
//
// Fork
//   Nothing is written before a fork. Every owner update of a slot's head is
//   one store (the nodes it links are written before it), so the child sees
//   the head before or after it, a whole list either way; owners need not
//   be stopped. An owner that moves nodes between its head and its spare
//   word stores first the word they leave, then the one they join, so the
//   child may miss them (lost to it, as a batch a thread was carrying), but
//   never finds them in both. Lockers, which move nodes in several steps, must be: the
//   fork registry's hold on every flag (begin_fork_flags in cpu_slots.hpp)
//   keeps new lockers out, lock_thread_slot checking it again after it took
//   the flag, and wait_for_thread_slot_lockers waits, reading only, for
//   those inside. In the child, clear_thread_slots_in_child clears the busy
//   flags and lockers of threads that do not exist there.
//
// Async-signal-safe: everything.
#pragma once

#include <cstddef>
#include <cstdint>

#include "percpu/internal/cpu_slots.hpp"
#include "percpu/internal/stride_arena.hpp"

namespace percpu {
namespace internal {

constexpr int kThreadSlots = 128;

struct thread_slot {
  std::intptr_t head;  // owner: relaxed atomics while busy; lockers while revoked
  int busy;            // written only by the owning thread (and its handlers)
  int revoked;         // written only by the holder of locker
  int locker;          // a flag (cpu_slots.hpp)
};
// ABI: ref's inline get() and put() use head, busy and revoked (docs/abi.md).
static_assert(offsetof(thread_slot, head) == 0 && offsetof(thread_slot, busy) == 8 &&
                  offsetof(thread_slot, revoked) == 12,
              "the words inline code compiled against this header uses");

// A slot with the word after it in its 32-byte object: a word the structure
// keeps beside its list, under the same protocol as head, 0 in a new slot
// (object_pool's spares, object_pool.cpp; unused by the other structures).
// Outside thread_slot, as cpu_slot_spare is outside cpu_slot_words
// (cpu_lists.hpp), so that the type public classes point to keeps the
// layout compiled programs were built with.
struct thread_slot_with_spare {
  thread_slot slot;
  std::intptr_t spare;
};
static_assert(offsetof(thread_slot_with_spare, slot) == 0, "a slot with its spare is a slot");

// An object of the thread-index memory's 32-byte class. Two indexes' slots
// are kStride apart, so never on one cache line; one index's slots of
// several structures may be, which only the remote paths write.
static_assert(sizeof(thread_slot_with_spare) <= 32, "a thread's slot in the 32-byte class");

// Index `index`'s slot of the structure whose slots begin at `copies`.
[[nodiscard]] inline thread_slot* thread_slot_at(thread_slot* copies, int index) noexcept {
  return stride_copy(copies, static_cast<unsigned>(index));
}

// A slot's list head: a node address, or 0 for the empty list.
[[nodiscard]] inline std::intptr_t thread_slot_head(const thread_slot* slot) noexcept {
  return __atomic_load_n(&slot->head, __ATOMIC_RELAXED);
}
inline void set_thread_slot_head(thread_slot* slot, std::intptr_t head) noexcept {
  __atomic_store_n(&slot->head, head, __ATOMIC_RELAXED);
}
// Its spare word (see thread_slot_with_spare).
[[nodiscard]] inline std::intptr_t thread_slot_spare(const thread_slot* slot) noexcept {
  return __atomic_load_n(&reinterpret_cast<const thread_slot_with_spare*>(slot)->spare,
                         __ATOMIC_RELAXED);
}
inline void set_thread_slot_spare(thread_slot* slot, std::intptr_t spare) noexcept {
  __atomic_store_n(&reinterpret_cast<thread_slot_with_spare*>(slot)->spare, spare,
                   __ATOMIC_RELAXED);
}

// The calling thread's index in [0, kThreadSlots), or -1.
// Async-signal-safe (the first call on a thread makes a few system calls:
// see "Thread indexes").
// Only for out-of-line slow paths: it reads TLS the compiler's way, which a
// coroutine resumed on another thread must not have cached (cpu.hpp).
extern PERCPU_EXPORT __thread int t_thread_index_plus_one PERCPU_STATIC_TLS;
PERCPU_EXPORT int claim_thread_index() noexcept;
[[nodiscard]] inline int thread_index() noexcept {
  const int plus_one = t_thread_index_plus_one;
  if (__builtin_expect(plus_one > 0, 1)) return plus_one - 1;
  return plus_one < 0 ? -1 : claim_thread_index();
}
// The offset of t_thread_index_plus_one from the thread pointer, the same
// in every thread; set (relaxed) by new_thread_slot_copies() before it first
// returns copies, so code that reads a structure's copies pointer, which
// reached it with the structure, reads a set offset. The inline paths of a
// thread without rseq read the index through it and a fresh thread pointer
// (own_slot_if_no_rseq()), never by the TLS address a coroutine's frame may
// have kept from another thread.
extern PERCPU_EXPORT std::intptr_t g_thread_index_tls_offset;

// The calling thread's slot in `copies` for the inline paths of a thread
// known to have no rseq (its section state is section_user::no_rseq, which
// also excludes the test seam: cpu_slots.hpp, section_area()) that has
// claimed its index; nullptr otherwise (no copies, a thread with rseq, an
// index not claimed yet or none left: the slow paths, which claim it).
// The state and the index are read through a fresh thread pointer.
[[nodiscard]] inline thread_slot* own_slot_if_no_rseq(thread_slot* copies) noexcept {
  if (__builtin_expect(copies == nullptr, 0) ||
      load_tp_relative_i32(g_fast_path.section_state) != static_cast<int>(section_user::no_rseq)) {
    return nullptr;
  }
  const int plus_one =
      load_tp_relative_i32(__atomic_load_n(&g_thread_index_tls_offset, __ATOMIC_RELAXED));
  return __builtin_expect(plus_one > 0, 1) ? thread_slot_at(copies, plus_one - 1) : nullptr;
}

// One more than the highest index any thread of this process (or of the
// parent before a fork) has claimed: every index a thread holds or held is
// below it, so a walk over every thread's slot may stop there. It only
// grows. A thread publishes it (release) before claim_thread_index()
// returns, so before the thread's first write to a slot of that index: a
// walker that sees such a write through a fence or a barrier sees the bound
// that covers it.
[[nodiscard]] int thread_index_limit() noexcept;
// Whether structures may use thread slots in this process.
[[nodiscard]] bool thread_slots_usable() noexcept;
// A structure's thread slots (see "Where the slots are"), every word zero,
// or nullptr where thread_slots_usable() is false or no memory can be
// mapped. No malloc. Give them back with delete_thread_slot_copies once
// nobody uses them: it zeroes the slots of the indexes handed out so far
// (only those can have been written) and keeps the object for reuse.
thread_slot* new_thread_slot_copies() noexcept;
void delete_thread_slot_copies(thread_slot* copies) noexcept;

// A cache line per thread index, in groups: a structure whose words a
// walker sums often (shared_mutex's writer, over every reader's word) wants
// the lines of the first indexes side by side, where one copy per index
// (above) puts each in a page of its own; and it wants to pay only for the
// indexes that touch it, where an array of kThreadSlots lines costs a page
// for the first. So an object holds kThreadGroup lines, those of
// kThreadGroup consecutive indexes, with one copy per group, kStride apart:
// index i's line is thread_group_offset(i) bytes after the object's first
// copy. A process with at most kThreadGroup thread indexes walks one run of
// lines; an instance takes kThreadGroup lines per group whose threads touch
// it. Every line zero; nullptr where no memory can be mapped.
// Async-signal-safe, no malloc. delete_thread_group_copies: once nobody
// uses it; it zeroes the copies of the groups handed out so far and keeps
// the object for reuse.
inline constexpr int kThreadGroup = 4;
inline constexpr std::size_t kThreadGroupLine = 64;
[[nodiscard]] inline std::uintptr_t thread_group_offset(int index) noexcept {
  const unsigned i = static_cast<unsigned>(index);
  return (static_cast<std::uintptr_t>(i / kThreadGroup) << kStrideShift) +
         (i % kThreadGroup) * kThreadGroupLine;
}
void* new_thread_group_copies() noexcept;
void delete_thread_group_copies(void* copy0) noexcept;
// The calling thread's thread_group_offset() plus one, set with its index
// (0: not asked yet, -1: none available), so that a hot path reaches the
// thread's line with one load relative to the thread pointer and an add.
// Static TLS (internal/config.hpp), read by shared_mutex's inline readers
// through its offset from the thread pointer, never through the symbol.
extern __thread int t_thread_group_offset_plus_one PERCPU_STATIC_TLS;
static_assert((std::uintptr_t{kThreadSlots / kThreadGroup} << kStrideShift) < (1u << 31),
              "every thread's group offset fits the int of t_thread_group_offset_plus_one");

[[nodiscard]] inline bool thread_slot_enter(thread_slot* slot) noexcept {
  if (__atomic_load_n(&slot->busy, __ATOMIC_RELAXED) != 0) return false;
  __atomic_store_n(&slot->busy, 1, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);  // the barrier_all() of a locker makes it a full fence
  if (__builtin_expect(__atomic_load_n(&slot->revoked, __ATOMIC_RELAXED) == 0, 1)) return true;
  __atomic_store_n(&slot->busy, 0, __ATOMIC_RELEASE);
  return false;
}
inline void thread_slot_leave(thread_slot* slot) noexcept {
  __atomic_store_n(&slot->busy, 0, __ATOMIC_RELEASE);
}

[[nodiscard]] lock_result lock_thread_slot(thread_slot* slot) noexcept;
void unlock_thread_slot(thread_slot* slot) noexcept;
// Stops every owner of `slots` without touching them, for a structure that
// has stored a flag of its own before the call (ref's killed_) which owners
// read after thread_slot_enter() and, seeing it set, leave their slot
// alone. One barrier, then: every owner that enters from then on reads the
// flag; every owner inside is seen busy, and waited for (owners never wait,
// rule R2). *indexes: every index whose slot can have been written is below
// it. Why the indexes read after the barrier suffice: a thread publishes
// its index (thread_index_limit) before it first enters a slot, so one whose
// publication that read misses passed its barrier point before publishing,
// and reads the flag. Nothing is written, so a slot that no thread touched
// keeps its page unfilled. False when the barrier fails. Not from a signal
// handler (it may wait).
[[nodiscard]] bool wait_for_thread_slot_owners(thread_slot* copies, int* indexes) noexcept;
// The fork handler's half (see "Fork"), between begin_fork_flags and the
// fork: waits, reading only, until no other thread holds the locker of any
// slot of `copies` below thread_index_limit(). A locker the forking
// thread's own frames hold is left as it is; one whose thread exited inside
// is reported (cpu_slots.hpp, "Abandoned holders").
void wait_for_thread_slot_lockers(thread_slot* copies) noexcept;
// The child's half: clears the busy flags and the lockers that threads
// which do not exist in the child left set (a locker the forking thread's
// frames hold gets its new thread id). Reads every handed-out index's
// slot, writes only those, so no page of an untouched slot fills.
void clear_thread_slots_in_child(thread_slot* copies) noexcept;

}  // namespace internal
}  // namespace percpu
