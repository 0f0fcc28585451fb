// Thread slots of percpu/internal/thread_slots.hpp: thread indexes, the
// remote lock of a thread's slot, and the fork handler's helpers.

#include "percpu/internal/thread_slots.hpp"
#include "percpu/internal/nocancel.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace percpu {
namespace internal {

namespace {

// tid of the thread holding each index, 0 when free.
int g_thread_owner[kThreadSlots];
// See thread_index_limit().
int g_thread_index_limit = 0;

void raise_thread_index_limit(int index) noexcept {
  int limit = __atomic_load_n(&g_thread_index_limit, __ATOMIC_RELAXED);
  while (limit <= index && !__atomic_compare_exchange_n(&g_thread_index_limit, &limit, index + 1,
                                                        true, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
}

// The lowest index that is free or whose thread has exited: reusing the
// indexes of exited threads before fresh ones keeps thread_index_limit(),
// and with it every walk over the threads' words, at the most threads
// alive at once, not the most ever started (a pool of worker threads made
// anew for each job). A look at a held index is a tgkill(pid, tid, 0).
int claim_one_index() noexcept {
  const int saved_errno = errno;
  const int tid = static_cast<int>(syscall(SYS_gettid));
  const int pid = getpid();
  int found = -1;
  for (int i = 0; i < kThreadSlots && found < 0; ++i) {
    int owner = __atomic_load_n(&g_thread_owner[i], __ATOMIC_RELAXED);
    if (owner != 0 && !(syscall(SYS_tgkill, pid, owner, 0) != 0 && errno == ESRCH)) continue;
    if (__atomic_compare_exchange_n(&g_thread_owner[i], &owner, tid, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)) {
      found = i;
      raise_thread_index_limit(i);
    }
  }
  errno = saved_errno;
  return found;
}

// In a forked child the thread is new (a new tid) but keeps its TLS, so its
// index must name it, or another thread of the child would take it over.
void thread_index_after_fork_in_child() noexcept {
  const int plus_one = t_thread_index_plus_one;
  if (plus_one > 0) {
    const int saved_errno = errno;
    __atomic_store_n(&g_thread_owner[plus_one - 1], static_cast<int>(syscall(SYS_gettid)),
                     __ATOMIC_RELEASE);
    errno = saved_errno;
  }
}

__attribute__((constructor(102))) void thread_slots_at_load() {
  pthread_atfork(nullptr, nullptr, &thread_index_after_fork_in_child);
}

}  // namespace

// The calling thread's index plus one; 0 not asked yet, -1 none available.
__thread int t_thread_index_plus_one PERCPU_STATIC_TLS = 0;

__thread int t_thread_group_offset_plus_one PERCPU_STATIC_TLS = 0;

int claim_thread_index() noexcept {
  const int index = claim_one_index();
  t_thread_group_offset_plus_one =
      index >= 0 ? static_cast<int>(thread_group_offset(index)) + 1 : -1;
  t_thread_index_plus_one = index >= 0 ? index + 1 : -1;
  return index;
}

int thread_index_limit() noexcept { return __atomic_load_n(&g_thread_index_limit, __ATOMIC_ACQUIRE); }

bool thread_slots_usable() noexcept {
#if defined(__SANITIZE_THREAD__)
  return false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return false;
#else
  return barrier_available();
#endif
#else
  return barrier_available();
#endif
}

thread_slot* new_thread_slots(std::intptr_t empty) {
  if (!thread_slots_usable()) return nullptr;
  thread_slot* slots = new thread_slot[kThreadSlots];
  for (int i = 0; i < kThreadSlots; ++i) slots[i] = thread_slot{empty, 0, 0, 0, 0};
  return slots;
}

namespace {
// Every ref's thread slots, one object of kThreadSlots copies each.
stride_arena g_thread_slot_copies(sizeof(thread_slot), kThreadSlots);
}  // namespace

thread_slot* new_thread_slot_copies() noexcept {
  if (!thread_slots_usable()) return nullptr;
  return static_cast<thread_slot*>(g_thread_slot_copies.allocate());
}

void delete_thread_slot_copies(thread_slot* copy0) noexcept {
  if (copy0 != nullptr) {
    g_thread_slot_copies.deallocate(copy0, static_cast<unsigned>(thread_index_limit()));
  }
}

namespace {
static_assert(kThreadSlots % kThreadGroup == 0, "whole groups");
// Every shared_mutex's reader words: kThreadGroup lines, one copy per group.
constexpr std::size_t kThreadGroupBytes = kThreadGroup * kThreadGroupLine;
stride_arena g_thread_group_copies(kThreadGroupBytes, kThreadSlots / kThreadGroup);
}  // namespace

void* new_thread_group_copies() noexcept { return g_thread_group_copies.allocate(); }

void delete_thread_group_copies(void* copy0) noexcept {
  if (copy0 != nullptr) {
    // Only the groups of indexes handed out so far can have been written.
    const unsigned groups =
        static_cast<unsigned>((thread_index_limit() + kThreadGroup - 1) / kThreadGroup);
    g_thread_group_copies.deallocate(copy0, groups);
  }
}

lock_result lock_thread_slot(thread_slot* slot) noexcept {
  if (!try_take_flag(&slot->locker)) return lock_result::busy;
  __atomic_store_n(&slot->revoked, 1, __ATOMIC_SEQ_CST);
  if (!barrier_all()) {
    __atomic_store_n(&slot->revoked, 0, __ATOMIC_RELEASE);
    release_flag(&slot->locker);
    return lock_result::refused;
  }
  if (__atomic_load_n(&slot->busy, __ATOMIC_ACQUIRE) != 0) {
    __atomic_store_n(&slot->revoked, 0, __ATOMIC_RELEASE);
    release_flag(&slot->locker);
    return lock_result::busy;
  }
  return lock_result::acquired;
}

void unlock_thread_slot(thread_slot* slot) noexcept {
  __atomic_store_n(&slot->revoked, 0, __ATOMIC_RELEASE);
  release_flag(&slot->locker);
}

namespace {

// Waits until no owner is inside slot `index` of `slots` (owners never wait
// while inside, rule R2). False when its owner will never leave it: a frame
// of the owner's thread that was left by a jump, or a thread that exited
// inside (see "Abandoned holders" in cpu_slots.hpp); *verdict says which.
// The sleep is the raw system call, never a cancellation point.
bool wait_until_idle(thread_slot* slot, int index, holder_verdict* verdict) noexcept {
  int watched = kFlagFree;
  long watched_since = 0;
  for (int spins = 0; __atomic_load_n(&slot->busy, __ATOMIC_ACQUIRE) != 0; ++spins) {
    if (!back_off(spins)) continue;
    const int owner = __atomic_load_n(&g_thread_owner[index], __ATOMIC_RELAXED);
    const holder_verdict v =
        owner == 0 ? holder_verdict::gone : judge_holder(owner, &watched, &watched_since);
    if (v != holder_verdict::running) {
      *verdict = v;
      return false;
    }
  }
  return true;
}

}  // namespace

bool wait_for_thread_slot_owners(thread_slot_table slots, int* indexes) noexcept {
  if (!barrier_all()) return false;
  const int limit = thread_index_limit();
  for (int i = 0; i < limit; ++i) {
    holder_verdict verdict = holder_verdict::running;
    if (!wait_until_idle(slots.at(i), i, &verdict)) {
      // Its owner left a get() or put() by a jump, or exited inside one:
      // it never writes this word again (its next operation finds busy set
      // and takes the atomic paths), so the word is final as it is.
      report_abandoned("a thread's word of a percpu::ref, at kill(),", verdict);
    }
  }
  *indexes = limit;
  return true;
}

void revoke_thread_slots_for_fork(thread_slot_table table) noexcept {
  for (int i = 0; i < kThreadSlots; ++i) {
    fork_wait_for_flag(&table.at(i)->locker);
    // A locker this handler could not take keeps the revoked flag its
    // holder set (or cleared).
    if (__atomic_load_n(&table.at(i)->locker, __ATOMIC_RELAXED) == kFlagForked) {
      __atomic_store_n(&table.at(i)->revoked, 1, __ATOMIC_SEQ_CST);
    }
  }
  if (!barrier_all()) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  const int self = t_thread_index_plus_one - 1;  // its own slot may be busy below this handler
  for (int i = 0; i < kThreadSlots; ++i) {
    if (i == self) continue;
    holder_verdict verdict = holder_verdict::running;
    if (!wait_until_idle(table.at(i), i, &verdict) && verdict != holder_verdict::self) {
      // The child clears it (restore_thread_slots_after_fork); the parent
      // keeps it as its owner left it.
      report_abandoned("a thread's slot of a percpu structure, at fork(),", verdict);
    }
  }
}

void restore_thread_slots_after_fork(thread_slot_table table, bool child) noexcept {
  // An owner that found its slot revoked stores busy = 1 and then 0 again;
  // a fork between the two leaves busy set in the child, where that thread
  // does not exist, and lockers there would find the slot busy for ever.
  if (child) clear_thread_slots_in_child(table);
  for (int i = 0; i < kThreadSlots; ++i) {
    if (__atomic_load_n(&table.at(i)->locker, __ATOMIC_RELAXED) == kFlagForked) {
      __atomic_store_n(&table.at(i)->revoked, 0, __ATOMIC_RELEASE);
    }
    fork_release_flag(&table.at(i)->locker);
  }
}

// The child has no other thread, so every busy flag but its own is stale.
void clear_thread_slots_in_child(thread_slot_table slots) noexcept {
  const int self = t_thread_index_plus_one - 1;
  for (int i = 0; i < kThreadSlots; ++i) {
    if (i != self && __atomic_load_n(&slots.at(i)->busy, __ATOMIC_RELAXED) != 0) {
      __atomic_store_n(&slots.at(i)->busy, 0, __ATOMIC_RELAXED);
    }
  }
}

}  // namespace internal
}  // namespace percpu
