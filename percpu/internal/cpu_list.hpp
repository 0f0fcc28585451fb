// The two owner sections every per-CPU list of percpu is made of (the
// free_list's lists and the object_pool's caches): pop the calling CPU's head,
// and push a chain onto it. Each retries a bounded number of times and never
// waits for a slot another thread holds. Both are async-signal-safe.
//
// A slot's head holds a node address, the list's own end marker, or
// kSlotLocked while a non-owner holds it (percpu/internal/slot_lock.hpp).
#pragma once

#include <cstdint>

#include "percpu/internal/rseq_cs.hpp"
#include "percpu/internal/slot_lock.hpp"

namespace percpu {
namespace internal {

// Aborts (preemption, migration, signals) are rare, so a few tries almost
// always commit; the bound keeps a thread that keeps being hit from spinning.
constexpr int kListSectionTries = 16;

// Pops the head of the list of the CPU `area`'s thread runs on, in one
// section. True when it committed: *popped is the old head (the list's end
// marker if it was empty). False when the thread cannot use its CPU's list
// now: its CPU has no slot, a non-owner holds the slot, or every try aborted.
inline bool pop_local_head(rseq_area* area, cpu_slot* slots, int slot_count, long next_offset,
                           std::intptr_t* popped) noexcept {
  for (int tries = 0; tries < kListSectionTries; ++tries) {
    const int cpu = rseq_current_index<index_kind::cpu_id>(area);
    if (static_cast<unsigned>(cpu) >= static_cast<unsigned>(slot_count)) return false;
    const int rc = rseq_cmpnev_storeoffp_load<index_kind::cpu_id>(area, &slots[cpu].head,
                                                                  kSlotLocked, next_offset, popped, cpu);
    if (rc == 0) return true;
    if (rc == 1) return false;  // locked by a non-owner
  }
  return false;
}

// Pushes the chain first..last (linked through Node::next) onto the list of
// the CPU `area`'s thread runs on, in one section. True when it committed;
// false as for pop_local_head.
template <class Node>
inline bool push_local_chain(rseq_area* area, cpu_slot* slots, int slot_count, Node* first,
                             Node* last) noexcept {
  for (int tries = 0; tries < kListSectionTries; ++tries) {
    const int cpu = rseq_current_index<index_kind::cpu_id>(area);
    if (static_cast<unsigned>(cpu) >= static_cast<unsigned>(slot_count)) return false;
    std::intptr_t* head = &slots[cpu].head;
    const std::intptr_t expect = __atomic_load_n(head, __ATOMIC_RELAXED);
    if (expect == kSlotLocked) return false;
    // Read outside the section, so it may be stale: the section's compare
    // makes it commit only if the head is still `expect`.
    last->next = reinterpret_cast<Node*>(expect);
    if (rseq_cmpeqv_storev<index_kind::cpu_id>(area, head, expect,
                                               reinterpret_cast<std::intptr_t>(first), cpu) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace internal
}  // namespace percpu
