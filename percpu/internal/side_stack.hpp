// Do not include directly; not a stable API (internal to percpu).
//
// The side stack.
//
//   A lock-free stack for nodes that cannot go to a slot right now (the slot
//   is locked, possibly by the thread a signal handler interrupted). Any
//   thread pushes with a CAS; only the holder of its `consumer` flag pops or
//   takes everything, and it takes the flag with an exchange and never waits.
//   With one consumer at a time, a pop's CAS cannot suffer ABA: the node it
//   read as the head cannot leave the stack without that consumer.
//
// Async-signal-safe: yes.
#pragma once

#include <cstdint>

#include "percpu/internal/cpu_slots.hpp"

namespace percpu {
namespace internal {

// A node as the side stack sees it: the successor at offset 0.
struct side_node {
  side_node* next;
};

// Not on a line of its own: it is the structures' rare path (a list locked
// by another thread, a depot busy under a signal handler), so sharing the
// line of their read-mostly words costs the hot paths a miss only after it
// was used, and keeps every free_list within one line (cpu_lists.hpp).
struct side_stack {
  std::intptr_t head;  // side_node*, 0 when empty; atomics only
  int consumer;        // a flag (cpu_slots.hpp)
};

// Pushes first..last (already linked through next) in one step.
void side_push(side_stack* stack, side_node* first, side_node* last) noexcept;
// Pops one node, or nullptr when empty or when another consumer is active.
[[nodiscard]] side_node* side_pop(side_stack* stack) noexcept;
// Takes every node, or nullptr (empty, or another consumer is active).
[[nodiscard]] side_node* side_take_all(side_stack* stack) noexcept;

// The fork handler's waits (R3): take the consumer flag even while holding
// others (fork_wait_for_flag / fork_release_flag of cpu_slots.hpp).
void wait_for_consumer(side_stack* stack) noexcept;
void release_consumer(side_stack* stack) noexcept;

}  // namespace internal
}  // namespace percpu
