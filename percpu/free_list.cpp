// Slow paths of percpu::free_list: what the started sections leave (an
// abort, an empty or locked list, a thread without rseq), steals, take_all
// and fork, on the lists of percpu/internal/cpu_lists.hpp. The protocol is
// argued in percpu/internal/cpu_slots.hpp.

#include "percpu/free_list.hpp"
#include "percpu/internal/fallback.hpp"

#include <cstdint>

#include "percpu/cpu.hpp"

namespace percpu {

namespace {

std::intptr_t word(free_list_node* node) { return reinterpret_cast<std::intptr_t>(node); }
free_list_node* as_node(std::intptr_t node) { return reinterpret_cast<free_list_node*>(node); }

}  // namespace

free_list::free_list() {
  register_for_fork();
  // Cheap now if the program has not started threads yet; see cpu_slots.hpp.
  (void)internal::prepare_remote_fences();
}

free_list::~free_list() { unregister_for_fork(); }

void free_list::before_fork() noexcept { lists_.before_fork(); }

void free_list::after_fork(bool child) noexcept { lists_.after_fork(child); }

// The started section did not commit: retry it (an abort), or take the path
// of a thread without rseq; push_chain_home says which.
void free_list::push_slow(free_list_node* node) noexcept { push_chain_home(node, node); }

// Puts first..last on the caller's list (cpu_lists.hpp, the ladder), or on
// the overflow stack when no list can take it now (locked by another
// thread, maybe the one this handler interrupted, or sections kept
// aborting): the overflow stack never blocks.
void free_list::push_chain_home(free_list_node* first, free_list_node* last) noexcept {
  if (lists_.push_home(internal::section_area(), word(first), word(last))) return;
  last->next = nullptr;
  lists_.to_overflow(word(first), word(last));
}

free_list_node* free_list::pop_slow(bool local_only) noexcept {
  internal::rseq_area* area = internal::section_area();
  // The started section aborted (the ladder tries again, a bounded number of
  // times), or found the list empty or locked (then this fails at once
  // too); or the thread has no rseq.
  if (const std::intptr_t node = lists_.pop_home(area)) return as_node(node);
  if (local_only) return nullptr;
  if (const std::intptr_t node = lists_.overflow_pop()) return as_node(node);
  const int home = (area != nullptr ? cpu_id() : internal::cpu_hint()) % lists_.count();
  if (free_list_node* node = steal(home, area != nullptr)) return node;
  // A last look at the overflow stack: a concurrent consumer may have been
  // holding it a moment ago.
  return as_node(lists_.overflow_pop());
}

// A batch from the next CPU that has nodes (after `home`, or from it too for
// a thread without rseq, whose home list the ladder only locked), then from
// other threads' own lists (each costs a membarrier): one node for the
// caller, the rest to the caller's own list so the next pops are local again.
free_list_node* free_list::steal(int home, bool has_sections) noexcept {
  const int count = lists_.count();
  std::intptr_t first = 0;
  std::intptr_t last = 0;
  for (int i = has_sections ? 1 : 0; first == 0 && i < count; ++i) {
    const int victim = (home + i) % count;
    // Peek first: an empty list is not worth a lock and a fence.
    const std::intptr_t peek = lists_.head_of(victim);
    if (peek == 0 || peek == internal::kSlotLocked) continue;
    first = lists_.take_from_cpu(victim, kStealBatch, &last);
  }
  const int self = has_sections ? -1 : internal::thread_index();
  for (int i = 0; first == 0 && i < lists_.thread_limit(); ++i) {
    if (i == self || lists_.thread_head_of(i) == 0) continue;
    first = lists_.take_from_thread(i, kStealBatch, &last);
  }
  if (first == 0) return nullptr;
  free_list_node* node = as_node(first);
  if (first != last) push_chain_home(node->next, as_node(last));
  node->next = nullptr;
  return node;
}

free_list_node* free_list::take_all() noexcept {
  free_list_node* first = nullptr;
  free_list_node* last = nullptr;
  auto append = [&](std::intptr_t chain) {
    if (last == nullptr) {
      first = as_node(chain);
    } else {
      last->next = as_node(chain);
    }
    last = as_node(chain);
    while (last->next != nullptr) last = last->next;
  };
  // A free_list never writes a thread's spare word, so none is handed over.
  lists_.drain(internal::kListLockTries, append, [](std::intptr_t) {});
  if (const std::intptr_t chain = lists_.overflow_take_all()) append(chain);
  if (internal::tsan_present()) {
    for (free_list_node* n = first; n != nullptr; n = n->next) internal::tsan_acquire(n);
  }
  return first;
}

}  // namespace percpu
