// The side stack of percpu/internal/side_stack.hpp.

#include "percpu/internal/side_stack.hpp"

#include <cstdint>

namespace percpu {
namespace internal {

void wait_for_consumer(side_stack* stack) noexcept { fork_wait_for_flag(&stack->consumer); }

void release_consumer(side_stack* stack) noexcept { fork_release_flag(&stack->consumer); }

void side_push(side_stack* stack, side_node* first, side_node* last) noexcept {
  std::intptr_t head = __atomic_load_n(&stack->head, __ATOMIC_RELAXED);
  do {
    last->next = reinterpret_cast<side_node*>(head);
  } while (!__atomic_compare_exchange_n(&stack->head, &head, reinterpret_cast<std::intptr_t>(first),
                                        true, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
}

side_node* side_pop(side_stack* stack) noexcept {
  if (__atomic_load_n(&stack->head, __ATOMIC_RELAXED) == 0) return nullptr;
  if (!try_take_flag(&stack->consumer)) return nullptr;
  std::intptr_t head = __atomic_load_n(&stack->head, __ATOMIC_ACQUIRE);
  side_node* node = nullptr;
  while (head != 0) {
    node = reinterpret_cast<side_node*>(head);
    // Safe to read: only the consumer removes nodes, so `node` stays in the
    // stack (possibly below newer pushes) until this CAS.
    const std::intptr_t next = reinterpret_cast<std::intptr_t>(node->next);
    if (__atomic_compare_exchange_n(&stack->head, &head, next, true, __ATOMIC_ACQUIRE,
                                    __ATOMIC_ACQUIRE)) {
      break;
    }
    node = nullptr;
  }
  release_flag(&stack->consumer);
  return node;
}

side_node* side_take_all(side_stack* stack) noexcept {
  if (__atomic_load_n(&stack->head, __ATOMIC_RELAXED) == 0) return nullptr;
  if (!try_take_flag(&stack->consumer)) return nullptr;
  const std::intptr_t head = __atomic_exchange_n(&stack->head, 0, __ATOMIC_ACQUIRE);
  release_flag(&stack->consumer);
  return reinterpret_cast<side_node*>(head);
}

}  // namespace internal
}  // namespace percpu
