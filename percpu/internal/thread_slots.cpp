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

// Where the next claim starts looking among the indexes handed out.
unsigned g_probe_cursor = 0;
// How many indexes below the limit a claim looks at before it takes a new
// one: each look at a held index is a tgkill(pid, tid, 0), a system call.
constexpr int kReuseProbes = 8;

bool exited(int pid, int owner) noexcept {
  return syscall(SYS_tgkill, pid, owner, 0) != 0 && errno == ESRCH;
}

bool try_claim(int index, int owner, int tid) noexcept {
  if (!__atomic_compare_exchange_n(&g_thread_owner[index], &owner, tid, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_RELAXED)) {
    return false;
  }
  raise_thread_index_limit(index);
  return true;
}

// Reusing the indexes of exited threads before new ones keeps
// thread_index_limit(), and with it every walk over the threads' words, near
// the most threads alive at once rather than the most ever started (a pool
// of worker threads made anew for each job). But telling an exited thread's
// index from a live one's costs a system call, so a claim looks at only
// kReuseProbes indexes below the limit, from a cursor that moves on with
// every claim: a free one or an exited thread's is taken. Else the lowest
// never-used index; when none is left, any exited thread's.
int claim_one_index() noexcept {
  const int saved_errno = errno;
  const int tid = static_cast<int>(syscall(SYS_gettid));
  const int pid = getpid();
  int found = -1;
  const int limit = __atomic_load_n(&g_thread_index_limit, __ATOMIC_ACQUIRE);
  const unsigned cursor = __atomic_fetch_add(&g_probe_cursor, kReuseProbes, __ATOMIC_RELAXED);
  for (int k = 0; k < kReuseProbes && k < limit && found < 0; ++k) {
    const int i =
        static_cast<int>((cursor + static_cast<unsigned>(k)) % static_cast<unsigned>(limit));
    const int owner = __atomic_load_n(&g_thread_owner[i], __ATOMIC_RELAXED);
    if ((owner == 0 || exited(pid, owner)) && try_claim(i, owner, tid)) found = i;
  }
  for (int i = 0; i < kThreadSlots && found < 0; ++i) {
    if (__atomic_load_n(&g_thread_owner[i], __ATOMIC_RELAXED) == 0 && try_claim(i, 0, tid)) {
      found = i;
    }
  }
  for (int i = 0; i < kThreadSlots && found < 0; ++i) {
    const int owner = __atomic_load_n(&g_thread_owner[i], __ATOMIC_RELAXED);
    if (owner != 0 && exited(pid, owner) && try_claim(i, owner, tid)) found = i;
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

namespace {
// Every structure's thread slots, one object of kThreadSlots copies each
// (the header asserts that a thread_slot fits the 32 bytes).
stride_arena g_thread_slot_copies(32, kThreadSlots);
}  // namespace

std::intptr_t g_thread_index_tls_offset = 0;

thread_slot* new_thread_slot_copies() noexcept {
  if (!thread_slots_usable()) return nullptr;
  __atomic_store_n(&g_thread_index_tls_offset,
                   reinterpret_cast<char*>(&t_thread_index_plus_one) - thread_pointer(),
                   __ATOMIC_RELAXED);
  return static_cast<thread_slot*>(g_thread_slot_copies.allocate());
}

void delete_thread_slot_copies(thread_slot* copies) noexcept {
  if (copies != nullptr) {
    g_thread_slot_copies.deallocate(copies, static_cast<unsigned>(thread_index_limit()));
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
  // A fork handler's hold makes it busy before anything is touched (see
  // "Fork").
  if (!try_take_locker_flag(&slot->locker)) return lock_result::busy;
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
    // An owner that left its slot and then exited, after the look at busy
    // above, is not an abandoned one: look again.
    if (v == holder_verdict::gone && __atomic_load_n(&slot->busy, __ATOMIC_ACQUIRE) == 0) break;
    if (v != holder_verdict::running) {
      *verdict = v;
      return false;
    }
  }
  return true;
}

}  // namespace

bool wait_for_thread_slot_owners(thread_slot* copies, int* indexes) noexcept {
  if (!barrier_all()) return false;
  const int limit = thread_index_limit();
  for (int i = 0; i < limit; ++i) {
    holder_verdict verdict = holder_verdict::running;
    if (!wait_until_idle(thread_slot_at(copies, i), i, &verdict)) {
      // Its owner left a get() or put() by a jump, or exited inside one:
      // it never writes this word again (its next operation finds busy set
      // and takes the atomic paths), so the word is final as it is.
      report_abandoned("a thread's word of a percpu::ref, at kill(),", verdict);
    }
  }
  *indexes = limit;
  return true;
}

void wait_for_thread_slot_lockers(thread_slot* copies) noexcept {
  const int limit = thread_index_limit();
  for (int i = 0; i < limit; ++i) {
    // One whose holder never comes back: the child clears it
    // (clear_thread_slots_in_child); the parent keeps it as its holder left it.
    fork_wait_until_free(&thread_slot_at(copies, i)->locker,
                         "a thread's slot of a percpu structure, at fork(),");
  }
}

// The child has no other thread, so every busy flag but its own is stale,
// and so is every locker but those of its own frames.
void clear_thread_slots_in_child(thread_slot* copies) noexcept {
  const int self = t_thread_index_plus_one - 1;
  const int limit = thread_index_limit();
  for (int i = 0; i < limit; ++i) {
    thread_slot* slot = thread_slot_at(copies, i);
    if (i != self && __atomic_load_n(&slot->busy, __ATOMIC_RELAXED) != 0) {
      __atomic_store_n(&slot->busy, 0, __ATOMIC_RELAXED);
    }
    clear_flag_in_child(&slot->locker);
  }
}

}  // namespace internal
}  // namespace percpu
