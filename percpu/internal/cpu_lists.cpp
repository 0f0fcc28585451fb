// The per-CPU list's out-of-line parts: making and freeing the lists, the
// ladder's pop and push, remote access, the overflow stack and fork. The
// protocol is argued in cpu_slots.hpp and thread_slots.hpp.

#include "percpu/internal/cpu_lists.hpp"

#include <sched.h>

#include <new>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"

namespace percpu {
namespace internal {

namespace {

side_node* as_side(std::intptr_t node) { return reinterpret_cast<side_node*>(node); }

// Walks `batch` nodes down from `first` (at least one, at most the list):
// the last one taken.
std::intptr_t batch_end(std::intptr_t first, long batch) noexcept {
  std::intptr_t last = first;
  for (long taken = 1; taken < batch && node_link(last) != 0; ++taken) last = node_link(last);
  return last;
}

}  // namespace

cpu_lists::cpu_lists() : count_(max_cpus()) {
  overflow_.head = 0;
  overflow_.consumer = kFlagFree;
  // Every copy zero: every CPU's list (and spares) empty, its locker free.
  slots_ = static_cast<cpu_slot_words*>(stride_arena_for(slot_bytes()).allocate());
  if (slots_ == nullptr) throw std::bad_alloc();
  thread_slots_ = new_thread_slot_copies();
}

cpu_lists::~cpu_lists() {
  delete_thread_slot_copies(thread_slots_);
  stride_arena_for(slot_bytes()).deallocate(slots_);
}

int cpu_lists::hint_cpu() const noexcept { return cpu_hint() % count_; }

std::intptr_t cpu_lists::take_from_cpu(int cpu, long batch, std::intptr_t* last) noexcept {
  std::intptr_t head = 0;
  if (lock_slot(slot_of(cpu), cpu, &head) != lock_result::acquired) return 0;
  if (head == 0) {
    unlock_slot(slot_of(cpu), head);
    return 0;
  }
  *last = batch_end(head, batch);
  const std::intptr_t rest = node_link(*last);
  node_link(*last) = 0;
  unlock_slot(slot_of(cpu), rest);
  return head;
}

std::intptr_t cpu_lists::take_from_thread(int index, long batch, std::intptr_t* last) noexcept {
  thread_slot* ts = thread_slot_at(thread_slots_, index);
  if (lock_thread_slot(ts) != lock_result::acquired) return 0;
  const std::intptr_t head = thread_slot_head(ts);
  if (head == 0) {
    unlock_thread_slot(ts);
    return 0;
  }
  *last = batch_end(head, batch);
  set_thread_slot_head(ts, node_link(*last));
  node_link(*last) = 0;
  unlock_thread_slot(ts);
  return head;
}

std::intptr_t cpu_lists::drain_cpu(int cpu, int tries, std::intptr_t (&spares)[kSpares]) noexcept {
  for (int t = 0; t < tries; ++t) {
    std::intptr_t head = 0;
    const lock_result r = lock_slot(slot_of(cpu), cpu, &head);
    if (r == lock_result::refused) return 0;
    if (r == lock_result::acquired) {
      for (std::intptr_t& spare : spares) spare = take_spare(cpu);
      unlock_slot(slot_of(cpu), 0);
      return head;
    }
    sched_yield();
  }
  return 0;
}

std::intptr_t cpu_lists::drain_thread(int index, int tries, std::intptr_t* spare) noexcept {
  thread_slot* ts = thread_slot_at(thread_slots_, index);
  for (int t = 0; t < tries; ++t) {
    const lock_result r = lock_thread_slot(ts);
    if (r == lock_result::refused) return 0;
    if (r == lock_result::acquired) {
      const std::intptr_t head = thread_slot_head(ts);
      if (head != 0) set_thread_slot_head(ts, 0);
      *spare = thread_slot_spare(ts);
      if (*spare != 0) set_thread_slot_spare(ts, 0);
      unlock_thread_slot(ts);
      return head;
    }
    sched_yield();
  }
  return 0;
}

void cpu_lists::to_overflow(std::intptr_t first, std::intptr_t last) noexcept {
  side_push(&overflow_, as_side(first), as_side(last));
}

std::intptr_t cpu_lists::overflow_pop() noexcept {
  return reinterpret_cast<std::intptr_t>(side_pop(&overflow_));
}

std::intptr_t cpu_lists::overflow_take_all() noexcept {
  return reinterpret_cast<std::intptr_t>(side_take_all(&overflow_));
}

// Waits for every locker while holding the flags already taken: safe by
// rule R3 of cpu_slots.hpp (every holder finishes without waiting for
// anything). The CPUs' and the threads' lockers it waits for without
// writing them: a fork fills no page of a CPU or thread that never touched
// the lists.
void cpu_lists::before_fork() noexcept {
  wait_for_slot_lockers(slots_, count_);
  wait_for_consumer(&overflow_);
  if (thread_slots_ != nullptr) wait_for_thread_slot_lockers(thread_slots_);
}

void cpu_lists::after_fork(bool child) noexcept {
  if (child && thread_slots_ != nullptr) clear_thread_slots_in_child(thread_slots_);
  release_consumer(&overflow_);
  if (child) slot_lockers_in_child(slots_, count_);
}

}  // namespace internal
}  // namespace percpu
