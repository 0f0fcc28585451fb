// percpu/free_list.hpp: a per-CPU intrusive free list (a LIFO stack of nodes).
//
// What it is for
//   Recycling things without a shared hot spot: each CPU has its own list, and
//   push and pop on the calling thread's CPU are rseq critical sections, with
//   no atomic instruction and no lock. The user embeds a free_list_node in
//   each object and owns the memory; the list only links nodes.
//   pop() falls back, when the local list is empty, to the overflow stack and
//   then to stealing a small batch from another CPU's list.
//
// Why it is ABA-safe
//   Only sections running on a list's CPU modify that list, and each reads
//   the head and stores the new head within one section: preemption,
//   migration or a signal in between restart it. Other threads reach a list
//   only by locking it (percpu/internal/cpu_slots.hpp: exchange with a locked
//   marker, then a membarrier RSEQ fence on that CPU, then a re-check), which
//   makes the owner sections bail out rather than race.
//
// When not to use it
//   When order matters (it is LIFO per CPU, unordered overall), or to count
//   things exactly at a point in time (nodes being moved by a steal are in no
//   list for that moment). pop() may return nullptr while nodes exist if they
//   are momentarily held by another thread's steal or by a locked slot; it
//   never waits for them.
//
// Without rseq
//   A thread without rseq (seccomp, valgrind, qemu-user, a forced fallback)
//   keeps a list of its own in each free_list, a thread slot
//   (percpu/internal/thread_slots.hpp): push and pop there are plain loads and
//   stores between a "busy" store and a check that no other thread has
//   revoked the slot, with no atomic instruction and no system call. Other
//   threads reach those nodes by stealing, which revokes the slot with one
//   membarrier system call per batch. Where the membarrier command is
//   missing, or beyond the thread slots' number of live threads, such a
//   thread locks the slot of a CPU it ran on recently, with atomics; a
//   membarrier fence is then added per operation only once some thread of
//   the process has run a section. If sections may run and membarrier's
//   RSEQ fence is missing, other CPUs' lists are never touched by non-owners:
//   steals are refused and non-owner pushes go to the overflow stack. No
//   operation ever spins on a lock another thread holds, and none makes a
//   system call in the common case: the CPU to try first is a per-thread
//   hint (internal::cpu_hint()), not a getcpu per operation.
//
// Memory
//   The list itself (64 bytes), plus 32 bytes for each CPU whose threads
//   used it with rseq (that CPU's list head and lock, and two spare words
//   the list leaves empty, shared with object_pool's layout; on percpu's per-CPU
//   memory, internal/stride_arena.hpp), plus 32 bytes for each thread without rseq
//   that used it (its own list's head, on percpu's memory laid out by
//   thread index, internal/thread_slots.hpp). A CPU or a thread that never
//   touches a list costs it nothing, however many CPUs the machine may have
//   (a possible list of 0-4095 costs what 0-1 does), and no two CPUs' or
//   threads' heads share a cache line. 100,000 lists, each used once on
//   one CPU, take about 32 bytes each of per-CPU memory beside the list
//   (percpu-bench --structures, the memory table). Walks over every CPU
//   (steals, take_all(), fork()) read the heads of CPUs that never ran,
//   which the kernel maps to its shared zero page without filling a page.
//
// By CPU only: no concurrency-id form
//   Unlike counter and per_cpu<T> (cid_counter, cid_per_cpu<T>), a list
//   has no form indexed by concurrency id. A thread that takes from
//   another list locks it and fences its CPU (one CPU, with membarrier's
//   CPU flag), so that no section started there before the lock can
//   commit; a list indexed by id has no CPU to fence, so every steal would
//   fence every CPU the process runs on. What that leaves: the walks (a
//   steal finding nothing nearby, take_all(), fork()) read one head per
//   possible CPU, 4,096 on a host whose possible list is 0-4095, where an
//   id-indexed list would read one per id used. Memory is not affected (a
//   head no CPU touched costs nothing, see Memory).
//
// Thread safety and signals
//   push, pop and try_pop_local are thread-safe and async-signal-safe (a
//   handler may push and pop while the interrupted thread was doing the
//   same). take_all is thread-safe and async-signal-safe. Construction and
//   destruction are neither; destroy only when no other thread uses the list.
//   fork() is supported: the child keeps every node the parent had listed.
//   No member is a cancellation point (deferred pthread_cancel() never acts
//   inside one).
//   Leaving an operation by a jump: a signal handler may leave a push, pop,
//   try_pop_local or take_all it interrupted with siglongjmp, or end the
//   thread there with pthread_exit(). On the rseq fast paths nothing is
//   held (the kernel aborted the section). On the slow paths (stealing,
//   the overflow stack, threads without rseq) the operation may keep one
//   list locked for ever, with the nodes it was moving: those are lost to
//   the list, the other lists keep working, and pop() may return nullptr
//   where it would have found them. Nothing waits for such a lock: fork()
//   keeps a lock the forking thread's own left frame holds as it is (in
//   both processes); a lock held by a thread that has since exited is
//   reported by the fork() or take_all() that meets it (one line on
//   stderr; debug builds then abort, release builds go on without it).
//   pthread_exit() in a handler unwinds the interrupted operation's
//   noexcept frame, where C++ may call std::terminate.
//   ThreadSanitizer in your build sees each push() happen before the pop(),
//   try_pop_local() or take_all() that returns the node, however percpu was
//   built (README, "Sanitizers in your build").
#pragma once

#include <cstddef>
#include <cstdint>

#include "percpu/internal/cpu_lists.hpp"
#include "percpu/internal/fork_registry.hpp"
#include "percpu/internal/sanitizers.hpp"

#pragma GCC visibility push(default)  // exported (see percpu/cpu.hpp)
namespace percpu {

// Embed one in each object that goes on a free_list. Its address is what the
// list stores; it must stay valid while the node is on a list.
struct free_list_node {
  free_list_node* next;
};

class free_list final : private internal::fork_participant {
 public:
  // One slot per possible CPU (max_cpus()), on the per-CPU memory; throws
  // std::bad_alloc when no memory can be mapped for it.
  free_list();
  ~free_list();
  free_list(const free_list&) = delete;
  free_list& operator=(const free_list&) = delete;

  // Adds `node` to the calling CPU's list. Never fails.
  void push(free_list_node* node) noexcept;

  // Removes and returns a node: the calling CPU's most recent one, else one
  // from the overflow stack, else one stolen from another CPU. nullptr when
  // none was available without waiting.
  free_list_node* pop() noexcept;

  // Like pop() but looks only at the calling CPU's list.
  free_list_node* try_pop_local() noexcept;

  // Removes every node it can reach (every slot it can lock, and the overflow
  // stack) and returns them linked through next, ending in nullptr. Slots that
  // are busy, or that cannot be fenced, keep their nodes.
  free_list_node* take_all() noexcept;

  // How many per-CPU lists there are.
  int slot_count() const noexcept { return lists_.count(); }

 private:
  static constexpr int kStealBatch = 16;

  void push_slow(free_list_node* node) noexcept;
  free_list_node* pop_slow(bool local_only) noexcept;
  PERCPU_LOCAL free_list_node* steal(int home, bool has_sections) noexcept;
  PERCPU_LOCAL void push_chain_home(free_list_node* first, free_list_node* last) noexcept;
  void before_fork() noexcept override;
  void after_fork(bool child) noexcept override;

  // The lists (internal/cpu_lists.hpp): one per possible CPU, one per
  // thread without rseq, and the overflow stack.
  internal::cpu_lists lists_;
};
static_assert(offsetof(free_list_node, next) == 0,
              "a node's link is its first word (cpu_lists.hpp)");

// TSan (internal/sanitizers.hpp): push releases the node, and whoever pops
// it (pop, try_pop_local, take_all) acquires it.
// The hot paths are one started section each (cpu_slots.hpp, "The started
// form"); anything else (an abort, an empty or locked list, no rseq) goes
// out of line.
inline void free_list::push(free_list_node* node) noexcept {
  PERCPU_TSAN_RELEASE(node);
  if (__builtin_expect(lists_.push_started(node, node), 1)) return;
  push_slow(node);
}

inline free_list_node* free_list::try_pop_local() noexcept {
  std::intptr_t popped = 0;
  if (__builtin_expect(lists_.pop_started(&popped), 1)) {
    PERCPU_TSAN_ACQUIRE(reinterpret_cast<free_list_node*>(popped));
    return reinterpret_cast<free_list_node*>(popped);
  }
  free_list_node* node = pop_slow(true);
  if (node != nullptr) PERCPU_TSAN_ACQUIRE(node);
  return node;
}

inline free_list_node* free_list::pop() noexcept {
  std::intptr_t popped = 0;
  if (__builtin_expect(lists_.pop_started(&popped), 1)) {
    PERCPU_TSAN_ACQUIRE(reinterpret_cast<free_list_node*>(popped));
    return reinterpret_cast<free_list_node*>(popped);
  }
  // Empty here, or this CPU's list is unavailable, or the section aborted.
  free_list_node* node = pop_slow(false);
  if (node != nullptr) PERCPU_TSAN_ACQUIRE(node);
  return node;
}

}  // namespace percpu
#pragma GCC visibility pop
