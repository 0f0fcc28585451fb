// Do not include directly; not a stable API (internal to percpu).
//
// The per-CPU list: what percpu::free_list and percpu::object_pool are made
// of. One LIFO list of nodes per possible CPU (a head and its locker on the
// per-CPU memory), one per thread index for threads without rseq (on the
// thread-index memory), and an overflow stack; the ways a thread reaches
// them, written once here; and their part of fork(). The pool's depot,
// batching and depths stay the pool's.
//
// Nodes
//   A node's first word is its link: the next node's address, or 0 at the end
//   of a list. The users' node types begin with their `next` pointer
//   (static_assert'ed beside them); this file reads and writes that word
//   through node_link(), a may_alias access, as the sections do through their
//   operand.
//
// The ladder (at_home)
//   Where a thread's operation on "its" list goes, in order:
//   1. A thread that runs owner sections (section_area() answered an area):
//      its CPU's list, in the caller's own section loop (cpu_slots.hpp), and
//      nowhere else: a failed section means empty, full, locked or aborted
//      too often, and the caller goes on to its own fallback.
//   2. A thread without rseq: its own list, a thread slot (no atomic, no
//      system call; thread_slots.hpp), while it has one and no other thread
//      has revoked it;
//   3. then, under the lock, the list of the CPU its fallback last reported
//      (cpu_hint()), a few tries, never waiting (cpu_slots.hpp, lock_slot);
//   4. then nothing: the caller puts what it holds on the overflow stack (or
//      the pool's depot) and takes from there, which never blocks.
//   Steps 2 and 3 hand the caller's `exclusive` step the head of a list that
//   no other thread can touch until it returns: the same code for a thread's
//   own list and for a locked CPU's.
//
// Remote access (take_from_cpu, take_from_thread, drain)
//   Every list but the caller's own is reached under its lock (lock_slot, or
//   lock_thread_slot, which revokes the thread's slot); empty lists are
//   peeked at first and skipped, so a walk fills no page of a CPU or thread
//   that never touched the structure.
//
// Spares
//   Each CPU's slot also has two spares: a stack of up to two more lists,
//   the newer first, in the words after the slot's (cpu_slot_spare), read
//   and written only by a holder of that CPU's slot lock (its own CPU's,
//   lock_local_slot, or a remote locker's), and peeked at by walks with
//   relaxed loads. An older spare is in use only while the newer one is
//   (set_aside and take_spare keep it so). The owner says what goes there
//   (the pool: a full cache set aside whole, taken back when the cache runs
//   empty; free_list: nothing, so its spares stay empty); drain() empties
//   spares with their lists. The spares are why a slot takes 32 bytes of
//   per-CPU memory, not 16: a flag saying which owners want them would
//   change the layout of the public classes that hold a cpu_lists.
//   A thread's slot has one spare word (thread_slot_with_spare), which the owner
//   reads and writes inside on_own_slot() in an order of its choosing
//   (thread_slots.hpp, "Fork"), and whose meaning is the owner's alone (the
//   pool: a stack of whole caches, linked as its depot links them): drain()
//   hands it over as it is, to a callback of its own.
// Fork
//   before_fork / after_fork are the lists' part of their owner's
//   fork_participant handlers: they wait for lockers without writing them
//   (cpu_slots.hpp, wait_for_slot_lockers; thread_slots.hpp, "Fork").
//
// Memory: 40 bytes inside the owner (two pointers, the count, the overflow
// stack's head and consumer flag); 32 bytes per CPU that used the lists
// with rseq; 32 bytes per thread without rseq that used them.
//
// Async-signal-safe: everything but the constructor and the destructor.
#pragma once

#include <cstddef>
#include <cstdint>

#include "percpu/internal/cpu_slots.hpp"
#include "percpu/internal/rseq_cs.hpp"
#include "percpu/internal/side_stack.hpp"
#include "percpu/internal/stride_arena.hpp"
#include "percpu/internal/thread_slots.hpp"

namespace percpu {
namespace internal {

// A node's link word (see "Nodes").
typedef std::intptr_t __attribute__((may_alias)) node_link_word;
[[nodiscard]] inline node_link_word& node_link(std::intptr_t node) noexcept {
  return *reinterpret_cast<node_link_word*>(node);
}

// How often steps 3 (and the remote lockers) try a busy lock before they
// give up: a busy slot usually frees up within a few instructions.
constexpr int kListLockTries = 3;

// How many spares a CPU's slot has (see "Spares").
constexpr int kSpares = 2;

// A CPU's slot with its spares (see "Spares"): the slot's words, then the
// spares' heads, the newer first.
struct cpu_slot_spare {
  cpu_slot_words words;
  std::intptr_t spares[kSpares];
};
static_assert(offsetof(cpu_slot_spare, words) == 0,
              "the sections see a slot with spares as a slot");
static_assert(sizeof(cpu_slot_spare) == 32, "a slot with its spares fills its size class");

class cpu_lists {
 public:
  // One list per possible CPU (max_cpus()), every one empty, and its spares
  // (see "Spares"); throws std::bad_alloc when no memory can be mapped for
  // them.
  cpu_lists();
  ~cpu_lists();
  cpu_lists(const cpu_lists&) = delete;
  cpu_lists& operator=(const cpu_lists&) = delete;

  // How many per-CPU lists there are.
  int count() const noexcept { return count_; }
  // CPU `cpu`'s slot, cpu in [0, count()).
  cpu_slot_words* slot_of(int cpu) const noexcept {
    return stride_copy(slots_, static_cast<unsigned>(cpu));
  }

  // Under CPU `cpu`'s slot lock (see "Spares"). take_spare: the newer
  // spare's head (0 when there is none), the older spare becoming the newer.
  // set_aside: `head` (not 0) becomes the newer spare, the newer the older; the
  // older one's head, if both were in use, is returned, and it is the
  // caller's now (0 when there was room).
  [[nodiscard]] std::intptr_t take_spare(int cpu) const noexcept {
    std::intptr_t* spares = spares_of(cpu);
    const std::intptr_t newer = spares[0];
    if (newer != 0) {
      __atomic_store_n(&spares[0], spares[1], __ATOMIC_RELAXED);
      __atomic_store_n(&spares[1], 0, __ATOMIC_RELAXED);
    }
    return newer;
  }
  [[nodiscard]] std::intptr_t set_aside(int cpu, std::intptr_t head) const noexcept {
    std::intptr_t* spares = spares_of(cpu);
    const std::intptr_t newer = spares[0];
    const std::intptr_t older = spares[1];
    if (newer != 0) __atomic_store_n(&spares[1], newer, __ATOMIC_RELAXED);
    __atomic_store_n(&spares[0], head, __ATOMIC_RELAXED);
    return newer != 0 ? older : 0;
  }
  // The bytes of per-CPU memory each CPU's slot takes (its arena's size
  // class).
  static std::size_t slot_bytes() noexcept {
    return stride_arena_for(sizeof(cpu_slot_spare)).object_size();
  }

  // Where the words are, for tests that count the pages they fill: CPU 0's
  // slot, and thread index 0's (nullptr without thread slots).
  const void* cpu_words() const noexcept { return slots_; }
  const void* thread_words() const noexcept { return thread_slots_; }

  // ---- The hot paths: one started section (cpu_slots.hpp) ----
  [[nodiscard]] bool pop_started(std::intptr_t* popped) const noexcept {
    return internal::pop_started(slots_, 0, popped);
  }
  template <class Node>
  [[nodiscard]] bool push_started(Node* first, Node* last) const noexcept {
    return internal::push_started(slots_, first, last);
  }

  // ---- The ladder (see above) ----
  // `section(area)` is step 1, `exclusive(&head)` steps 2 and 3: it may
  // change the head it is handed, and says whether it did what the caller
  // wanted (false goes on to step 3 after step 2, to step 4 after step 3).
  template <class Section, class Exclusive>
  bool at_home(rseq_area* area, Section&& section, Exclusive&& exclusive) noexcept;
  // Its steps 2 and 3 alone. Step 3 is out of line, so that a caller's
  // common cases (a section, the thread's own list) keep a small frame.
  template <class Exclusive>
  bool on_own_list(Exclusive&& exclusive) noexcept;
  // Step 2 for work on the thread's own slot as a whole, its list and its
  // spare word: `exclusive(slot)` while the slot is the thread's (entered,
  // not revoked), reading and writing both through thread_slot_head() /
  // thread_slot_spare() and their setters. False when the thread has no
  // slot or could not enter it (`exclusive` did not run), or when
  // `exclusive` said so.
  template <class Exclusive>
  bool on_own_slot(Exclusive&& exclusive) noexcept;
  template <class Exclusive>
  __attribute__((noinline)) bool on_hint_cpu_list(Exclusive&& exclusive) noexcept;
  // Step 1 for work one section cannot do: `exclusive(&head, cpu)` on the
  // list of the CPU the thread runs on, `cpu`, locked from a section
  // (cpu_slots.hpp, lock_local_slot: no fence), so it may also work on that
  // CPU's spares. False when it could not be locked now (`exclusive` did not
  // run), or when `exclusive` said so.
  template <class Exclusive>
  bool on_local_cpu_slot(rseq_area* area, Exclusive&& exclusive) noexcept;

  // The ladder's pop: a node from the caller's list (its CPU's, or for a
  // thread without rseq its own or its hint CPU's), 0 when none is there or
  // none can be reached without waiting.
  [[nodiscard]] std::intptr_t pop_home(rseq_area* area) noexcept;
  // Step 2 of that pop alone, for a caller that knows the thread has no
  // rseq: a node from the thread's own list, 0 when it has none there.
  [[nodiscard]] std::intptr_t pop_own() noexcept;
  // The ladder's push of the chain first..last (linked, last's link
  // whatever); false when no list took it (the caller still holds it).
  [[nodiscard]] bool push_home(rseq_area* area, std::intptr_t first, std::intptr_t last) noexcept;

  // The calling thread's own list (step 2); nullptr when it has none: no
  // thread slots here, no index left (thread_slots.hpp), or the test seam
  // that sends it to the locked per-CPU path (which keeps it there, so the
  // mixed stress tests still exercise that protocol).
  [[nodiscard]] thread_slot* own_thread_slot() const noexcept {
    if (thread_slots_ == nullptr || t_section_state == section_user::forced_locked) return nullptr;
    const int index = thread_index();
    return index >= 0 ? thread_slot_at(thread_slots_, index) : nullptr;
  }

  // ---- Remote access ----
  // Up to `batch` nodes from the top of CPU `cpu`'s list / thread index
  // `index`'s list, under its lock: the first (0 when the list was empty or
  // could not be locked now), linked to *last, whose link is 0.
  [[nodiscard]] std::intptr_t take_from_cpu(int cpu, long batch, std::intptr_t* last) noexcept;
  [[nodiscard]] std::intptr_t take_from_thread(int index, long batch, std::intptr_t* last) noexcept;
  // Empties every list it can lock within `tries` tries each (yielding the
  // CPU between tries) and hands each non-empty one to `each(head)`, each
  // of a CPU's spares as a list of its own, and each thread's non-zero
  // spare word to `each_thread_spare(word)` (see "Spares"); lists that stay
  // busy, or cannot be fenced, keep their nodes. The overflow stack is the
  // caller's.
  template <class Each, class EachThreadSpare>
  void drain(int tries, Each&& each, EachThreadSpare&& each_thread_spare) noexcept;

  // Racy peeks, for walks and diagnostics: CPU `cpu`'s head (kSlotLocked
  // while locked), and thread index `index`'s (index < thread_limit()).
  [[nodiscard]] std::intptr_t head_of(int cpu) const noexcept {
    return __atomic_load_n(&slot_of(cpu)->head, __ATOMIC_RELAXED);
  }
  // CPU `cpu`'s spare's head: the newer (which 0) or the older (which 1).
  [[nodiscard]] std::intptr_t spare_head_of(int cpu, int which = 0) const noexcept {
    return __atomic_load_n(&spares_of(cpu)[which], __ATOMIC_RELAXED);
  }
  [[nodiscard]] std::intptr_t thread_head_of(int index) const noexcept {
    return thread_slot_head(thread_slot_at(thread_slots_, index));
  }
  [[nodiscard]] std::intptr_t thread_spare_of(int index) const noexcept {
    return thread_slot_spare(thread_slot_at(thread_slots_, index));
  }
  // Every thread index whose list may hold nodes is below it (0 without
  // thread slots).
  [[nodiscard]] int thread_limit() const noexcept {
    return thread_slots_ != nullptr ? thread_index_limit() : 0;
  }

  // ---- The overflow stack (side_stack.hpp): step 4 ----
  void to_overflow(std::intptr_t first, std::intptr_t last) noexcept;
  [[nodiscard]] std::intptr_t overflow_pop() noexcept;
  [[nodiscard]] std::intptr_t overflow_take_all() noexcept;

  // ---- Fork: the lists' part of the owner's handlers ----
  void before_fork() noexcept;
  void after_fork(bool child) noexcept;

 private:
  // The list step 3 locks: the CPU the fallback last reported (cpu_hint()).
  [[nodiscard]] int hint_cpu() const noexcept;
  std::intptr_t* spares_of(int cpu) const noexcept {
    return reinterpret_cast<cpu_slot_spare*>(slot_of(cpu))->spares;
  }
  // Empties CPU `cpu`'s list, and its spares into spares[].
  [[nodiscard]] std::intptr_t drain_cpu(int cpu, int tries,
                                        std::intptr_t (&spares)[kSpares]) noexcept;
  // Empties thread index `index`'s list, and its spare word into *spare.
  [[nodiscard]] std::intptr_t drain_thread(int index, int tries, std::intptr_t* spare) noexcept;

  // CPU 0's slot on the per-CPU memory (stride_arena.hpp); CPU c's is
  // slot_of(c). All zero when made: every list empty, no locker.
  cpu_slot_words* slots_;
  int count_;
  // One slot per thread index on the thread-index memory (a zeroed slot is
  // an empty list), or nullptr where thread slots are not usable
  // (thread_slots_usable()) or no memory could be mapped.
  thread_slot* thread_slots_;
  side_stack overflow_;
};

template <class Section, class Exclusive>
bool cpu_lists::at_home(rseq_area* area, Section&& section, Exclusive&& exclusive) noexcept {
  if (area != nullptr) return section(area);
  return on_own_list(exclusive) || on_hint_cpu_list(exclusive);
}

template <class Exclusive>
bool cpu_lists::on_own_list(Exclusive&& exclusive) noexcept {
  thread_slot* own = own_thread_slot();
  if (own == nullptr || !thread_slot_enter(own)) return false;
  std::intptr_t head = thread_slot_head(own);
  const std::intptr_t before = head;
  const bool done = exclusive(&head);
  if (head != before) set_thread_slot_head(own, head);
  thread_slot_leave(own);
  return done;
}

template <class Exclusive>
bool cpu_lists::on_own_slot(Exclusive&& exclusive) noexcept {
  thread_slot* own = own_thread_slot();
  if (own == nullptr || !thread_slot_enter(own)) return false;
  const bool done = exclusive(own);
  thread_slot_leave(own);
  return done;
}

template <class Exclusive>
bool cpu_lists::on_hint_cpu_list(Exclusive&& exclusive) noexcept {
  const int cpu = hint_cpu();
  for (int tries = 0; tries < kListLockTries; ++tries) {
    std::intptr_t head = 0;
    const lock_result r = lock_slot(slot_of(cpu), cpu, &head);
    if (r == lock_result::refused) break;
    if (r == lock_result::busy) continue;
    const bool done = exclusive(&head);
    unlock_slot(slot_of(cpu), head);
    return done;
  }
  return false;
}

template <class Exclusive>
bool cpu_lists::on_local_cpu_slot(rseq_area* area, Exclusive&& exclusive) noexcept {
  int cpu = 0;
  std::intptr_t head = 0;
  if (lock_local_slot(area, slots_, count_, &cpu, &head) != lock_result::acquired) return false;
  const bool done = exclusive(&head, cpu);
  unlock_slot(slot_of(cpu), head);
  return done;
}

// The exclusive step of a pop, on a list the caller holds.
[[nodiscard]] inline bool pop_held(std::intptr_t* head, std::intptr_t* popped) noexcept {
  if (*head == 0) return false;
  *popped = *head;
  *head = node_link(*popped);
  return true;
}

inline std::intptr_t cpu_lists::pop_home(rseq_area* area) noexcept {
  std::intptr_t popped = 0;
  // Only a step that says it popped has: a pop section that aborted after
  // reading the head (it stores it to `popped` before its commit) and then
  // failed leaves there a node that is still on the list.
  const bool done = at_home(
      area, [&](rseq_area* a) { return pop_local_head(a, slots_, count_, 0, &popped); },
      [&](std::intptr_t* head) { return pop_held(head, &popped); });
  return done ? popped : 0;
}

inline std::intptr_t cpu_lists::pop_own() noexcept {
  std::intptr_t popped = 0;
  on_own_list([&](std::intptr_t* head) { return pop_held(head, &popped); });
  return popped;
}

inline bool cpu_lists::push_home(rseq_area* area, std::intptr_t first,
                                 std::intptr_t last) noexcept {
  return at_home(
      area,
      [&](rseq_area* a) {
        return push_local_chain(a, slots_, count_, reinterpret_cast<side_node*>(first),
                                reinterpret_cast<side_node*>(last));
      },
      [&](std::intptr_t* head) {
        node_link(last) = *head;
        *head = first;
        return true;
      });
}

template <class Each, class EachThreadSpare>
void cpu_lists::drain(int tries, Each&& each, EachThreadSpare&& each_thread_spare) noexcept {
  for (int cpu = 0; cpu < count_; ++cpu) {
    // Peek first: an empty list is not worth a lock, and a CPU that never
    // touched it keeps its page unfilled.
    if (head_of(cpu) == 0 && spare_head_of(cpu, 0) == 0 && spare_head_of(cpu, 1) == 0) continue;
    std::intptr_t spares[kSpares] = {};
    if (const std::intptr_t head = drain_cpu(cpu, tries, spares)) each(head);
    for (std::intptr_t spare : spares) {
      if (spare != 0) each(spare);
    }
  }
  for (int i = 0; i < thread_limit(); ++i) {
    if (thread_head_of(i) == 0 && thread_spare_of(i) == 0) continue;
    std::intptr_t spare = 0;
    if (const std::intptr_t head = drain_thread(i, tries, &spare)) each(head);
    if (spare != 0) each_thread_spare(spare);
  }
}

}  // namespace internal
}  // namespace percpu
