// Slow paths of percpu::free_list: threads without rseq, the overflow stack,
// steals, take_all and fork. The protocol is argued in
// percpu/internal/cpu_slots.hpp.

#include "percpu/free_list.hpp"
#include "percpu/internal/fallback.hpp"

#include <cstdint>
#include <new>

#include "percpu/cpu.hpp"

namespace percpu {

namespace {

internal::side_node* as_side(free_list_node* node) {
  return reinterpret_cast<internal::side_node*>(node);
}

free_list_node* as_node(internal::side_node* node) {
  return reinterpret_cast<free_list_node*>(node);
}

// Tries a few times, because a busy slot usually frees up within a few
// instructions; never waits beyond that.
constexpr int kLockTries = 3;

}  // namespace

free_list::free_list() : slot_count_(max_cpus()) {
  overflow_.head = 0;
  overflow_.consumer = internal::kFlagFree;
  // Every copy zero: every CPU's list empty, its locker free.
  slots_ = static_cast<slot*>(internal::stride_arena_for(sizeof(slot)).allocate());
  if (slots_ == nullptr) throw std::bad_alloc();
  thread_slots_ = internal::new_thread_slot_copies();
  register_for_fork();
  // Cheap now if the program has not started threads yet; see cpu_slots.hpp.
  (void)internal::prepare_remote_fences();
}

free_list::~free_list() {
  unregister_for_fork();
  internal::delete_thread_slot_copies(thread_slots_);
  internal::stride_arena_for(sizeof(slot)).deallocate(slots_);
}

// Waits for every flag while holding the ones already taken: safe by rule
// R3 of percpu/internal/cpu_slots.hpp (every holder finishes without waiting
// for anything). The lockers of the CPUs' and the threads' lists it waits
// for without writing them: a fork fills no page of a CPU or thread that
// never touched the list.
void free_list::before_fork() noexcept {
  internal::wait_for_slot_lockers(slots_, slot_count_);
  internal::wait_for_consumer(&overflow_);
  if (thread_slots_ != nullptr) internal::wait_for_thread_slot_lockers(thread_slots_);
}

void free_list::after_fork(bool child) noexcept {
  if (child && thread_slots_ != nullptr) internal::clear_thread_slots_in_child(thread_slots_);
  internal::release_consumer(&overflow_);
  if (child) internal::slot_lockers_in_child(slots_, slot_count_);
}

void free_list::to_overflow(free_list_node* first, free_list_node* last) noexcept {
  internal::side_push(&overflow_, as_side(first), as_side(last));
}

// The calling thread's own list, for a thread without rseq; nullptr when it
// has none (see internal::thread_index()).
internal::thread_slot* free_list::own_thread_slot() noexcept {
  if (thread_slots_ == nullptr) return nullptr;
  // The test seam that sends a thread to the locked per-CPU path keeps it
  // there, so the mixed stress tests still exercise that protocol.
  if (internal::t_section_state == internal::section_user::forced_locked) return nullptr;
  const int index = internal::thread_index();
  return index >= 0 ? internal::thread_slot_at(thread_slots_, index) : nullptr;
}

// Puts first..last on the calling thread's own list; false when it has none,
// or when another thread holds it (a steal, take_all or fork) or a signal
// handler interrupted this thread's own use of it.
bool free_list::push_chain_own(free_list_node* first, free_list_node* last) noexcept {
  internal::thread_slot* own = own_thread_slot();
  if (own == nullptr || !internal::thread_slot_enter(own)) return false;
  last->next = reinterpret_cast<free_list_node*>(internal::thread_slot_head(own));
  internal::set_thread_slot_head(own, reinterpret_cast<std::intptr_t>(first));
  internal::thread_slot_leave(own);
  return true;
}

// The started section did not commit: retry it (an abort), or take the path
// of a thread without rseq; push_chain_home says which.
void free_list::push_slow(free_list_node* node) noexcept { push_chain_home(node, node); }

// Locks CPU `cpu`'s slot and detaches up to `batch` nodes from its top.
// Returns the first (nullptr if the slot was empty or not lockable); the
// detached nodes are linked first..*rest_last, ending in nullptr.
free_list_node* free_list::pop_locked(int cpu, int batch, free_list_node** rest_last) noexcept {
  std::intptr_t head = 0;
  if (internal::lock_slot(slot_of(cpu), cpu, &head) != internal::lock_result::acquired) {
    return nullptr;
  }
  if (head == 0) {
    internal::unlock_slot(slot_of(cpu), head);
    return nullptr;
  }
  free_list_node* first = reinterpret_cast<free_list_node*>(head);
  free_list_node* last = first;
  for (int taken = 1; taken < batch && last->next != nullptr; ++taken) last = last->next;
  const std::intptr_t rest = reinterpret_cast<std::intptr_t>(last->next);
  last->next = nullptr;
  internal::unlock_slot(slot_of(cpu), rest);
  *rest_last = last;
  return first;
}

// Like pop_locked, for thread slot `index` (revoking it: one membarrier).
free_list_node* free_list::pop_thread_slot(int index, int batch,
                                           free_list_node** rest_last) noexcept {
  internal::thread_slot* ts = internal::thread_slot_at(thread_slots_, index);
  if (internal::lock_thread_slot(ts) != internal::lock_result::acquired) return nullptr;
  const std::intptr_t head = internal::thread_slot_head(ts);
  if (head == 0) {
    internal::unlock_thread_slot(ts);
    return nullptr;
  }
  free_list_node* first = reinterpret_cast<free_list_node*>(head);
  free_list_node* last = first;
  for (int taken = 1; taken < batch && last->next != nullptr; ++taken) last = last->next;
  internal::set_thread_slot_head(ts, reinterpret_cast<std::intptr_t>(last->next));
  last->next = nullptr;
  internal::unlock_thread_slot(ts);
  *rest_last = last;
  return first;
}

// Puts first..last on the calling CPU's list (one section for the whole
// chain), or, for a thread without rseq, on its own list or under the lock
// of the list of the CPU its fallback reports; on the overflow stack when
// none of that is possible now (the list is locked by another thread, maybe
// the one this handler interrupted, or sections kept aborting): the
// overflow stack never blocks.
void free_list::push_chain_home(free_list_node* first, free_list_node* last) noexcept {
  if (internal::rseq_area* area = internal::section_area()) {
    if (internal::push_local_chain(area, slots_, slot_count_, first, last)) return;
  } else {
    if (push_chain_own(first, last)) return;
    const int cpu = internal::cpu_hint() % slot_count_;
    for (int tries = 0; tries < kLockTries; ++tries) {
      std::intptr_t head = 0;
      const internal::lock_result r = internal::lock_slot(slot_of(cpu), cpu, &head);
      if (r == internal::lock_result::acquired) {
        last->next = reinterpret_cast<free_list_node*>(head);
        internal::unlock_slot(slot_of(cpu), reinterpret_cast<std::intptr_t>(first));
        return;
      }
      if (r == internal::lock_result::refused) break;
    }
  }
  last->next = nullptr;
  to_overflow(first, last);
}

free_list_node* free_list::pop_slow(bool local_only) noexcept {
  internal::rseq_area* area = internal::section_area();
  const bool has_sections = area != nullptr;
  if (has_sections) {
    // The started section aborted (try again, a bounded number of times),
    // or found the list empty or locked (then this fails at once too).
    std::intptr_t popped = 0;
    if (internal::pop_local_head(area, slots_, slot_count_, offsetof(free_list_node, next),
                                 &popped)) {
      return reinterpret_cast<free_list_node*>(popped);
    }
  }
  const int home = (has_sections ? cpu_id() : internal::cpu_hint()) % slot_count_;
  if (!has_sections) {
    if (internal::thread_slot* own = own_thread_slot()) {
      if (internal::thread_slot_enter(own)) {
        const std::intptr_t head = internal::thread_slot_head(own);
        if (head != 0) {
          free_list_node* node = reinterpret_cast<free_list_node*>(head);
          internal::set_thread_slot_head(own, reinterpret_cast<std::intptr_t>(node->next));
          internal::thread_slot_leave(own);
          return node;
        }
        internal::thread_slot_leave(own);
      }
    }
    // Then the list of a CPU this thread ran on recently, under the lock.
    for (int tries = 0; tries < kLockTries; ++tries) {
      free_list_node* last = nullptr;
      if (free_list_node* node = pop_locked(home, 1, &last)) return node;
      if (__atomic_load_n(&slot_of(home)->head, __ATOMIC_RELAXED) == 0) break;
    }
  }
  if (local_only) return nullptr;
  if (internal::side_node* node = internal::side_pop(&overflow_)) return as_node(node);

  // Steal a batch from the next CPU that has nodes: one node for the caller,
  // the rest to the caller's own list so the next pops are local again.
  for (int i = has_sections ? 1 : 0; i < slot_count_; ++i) {
    const int victim = (home + i) % slot_count_;
    // Peek first: an empty list is not worth a lock and a fence.
    const std::intptr_t peek = __atomic_load_n(&slot_of(victim)->head, __ATOMIC_RELAXED);
    if (peek == 0 || peek == internal::kSlotLocked) continue;
    free_list_node* last = nullptr;
    free_list_node* first = pop_locked(victim, kStealBatch, &last);
    if (first == nullptr) continue;
    if (first != last) push_chain_home(first->next, last);
    first->next = nullptr;
    return first;
  }
  // Then other threads' own lists (each steal costs a membarrier).
  if (thread_slots_ != nullptr) {
    const int self = has_sections ? -1 : internal::thread_index();
    for (int i = 0; i < internal::thread_index_limit(); ++i) {
      if (i == self) continue;
      if (internal::thread_slot_head(internal::thread_slot_at(thread_slots_, i)) == 0) continue;
      free_list_node* last = nullptr;
      free_list_node* first = pop_thread_slot(i, kStealBatch, &last);
      if (first == nullptr) continue;
      if (first != last) push_chain_home(first->next, last);
      first->next = nullptr;
      return first;
    }
  }
  // A last look at the overflow stack: a concurrent consumer may have been
  // holding it a moment ago.
  return as_node(internal::side_pop(&overflow_));
}

free_list_node* free_list::take_all() noexcept {
  free_list_node* first = nullptr;
  free_list_node* last = nullptr;
  auto append = [&](free_list_node* chain) {
    if (chain == nullptr) return;
    if (last == nullptr) {
      first = chain;
    } else {
      last->next = chain;
    }
    last = chain;
    while (last->next != nullptr) last = last->next;
  };
  for (int cpu = 0; cpu < slot_count_; ++cpu) {
    // Peek first: an empty list is not worth a lock, and a CPU that never
    // touched the list keeps its page unfilled.
    if (__atomic_load_n(&slot_of(cpu)->head, __ATOMIC_RELAXED) == 0) continue;
    for (int tries = 0; tries < kLockTries; ++tries) {
      std::intptr_t head = 0;
      const internal::lock_result r = internal::lock_slot(slot_of(cpu), cpu, &head);
      if (r == internal::lock_result::refused) break;
      if (r == internal::lock_result::busy) continue;
      internal::unlock_slot(slot_of(cpu), 0);
      append(reinterpret_cast<free_list_node*>(head));
      break;
    }
  }
  for (int i = 0; thread_slots_ != nullptr && i < internal::thread_index_limit(); ++i) {
    if (internal::thread_slot_head(internal::thread_slot_at(thread_slots_, i)) == 0) continue;
    for (int tries = 0; tries < kLockTries; ++tries) {
      free_list_node* rest_last = nullptr;
      // A batch as large as the list: everything.
      free_list_node* chain = pop_thread_slot(i, INT32_MAX, &rest_last);
      if (chain != nullptr) {
        append(chain);
        break;
      }
      if (internal::thread_slot_head(internal::thread_slot_at(thread_slots_, i)) == 0) break;
    }
  }
  append(as_node(internal::side_take_all(&overflow_)));
  if (internal::tsan_present()) {
    for (free_list_node* n = first; n != nullptr; n = n->next) internal::tsan_acquire(n);
  }
  return first;
}

}  // namespace percpu
