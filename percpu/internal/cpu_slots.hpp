// Do not include directly; not a stable API (internal to percpu).
//
// Per-CPU slots: the owner sections that update a slot on its own CPU, and
// how a thread that is not running one may touch the slot (the remote-access
// protocol shared by percpu::free_list and percpu::object_pool), with the
// membarrier fences and the flags that protocol and its neighbours stand on
// (side_stack.hpp, thread_slots.hpp, fork_registry.hpp).
//
// The problem
//   A slot's head word is written by rseq sections of its CPU with plain
//   stores (the "owners"). A section that read the head just before another
//   CPU's atomic exchange can still commit its plain store afterwards and
//   silently overwrite what the other thread wrote. So nobody else may write
//   the head unless every such section is known to be over.
//
// The protocol (lock_slot / unlock_slot)
//   1. Take the slot's `locker` flag with an atomic exchange; if it was held,
//      report busy (never wait: the holder may be the thread this signal
//      handler interrupted). The flag makes the locker the only thread that
//      ever writes kSlotLocked into this head.
//   2. Exchange the head with kSlotLocked (sequentially consistent).
//   3. If no thread of the process has ever been able to run an owner section
//      (see section users below), the exchange alone gives ownership.
//   4. Otherwise fence the CPU: membarrier(PRIVATE_EXPEDITED_RSEQ, FLAG_CPU,
//      cpu). On return, every section that was running on that CPU has been
//      aborted (the IPI makes the kernel restart it on return to user space),
//      every section that was preempted there was already restarted, and every
//      store such a section committed before the IPI is visible here. Owner
//      sections for this slot can only commit while on this CPU, because each
//      re-checks cpu_id inside; so after the fence no owner section that
//      loaded the head before step 2 can still commit.
//   5. Re-read the head. Still kSlotLocked: no owner committed between step 2
//      and the fence, so the exchanged value is the list and the locker owns
//      it. Anything else: an owner committed over kSlotLocked, its value is the
//      truth (it was computed from the very value we took, which we did not
//      modify), so go back to step 2. A bounded number of rounds, then busy.
//   6. While locked, owner sections see kSlotLocked: their compare fails (a
//      push expects the head it read, a pop refuses every head up to
//      kSlotLocked: the empty list and the marker), and they take their slow
//      path. They never wait for the lock.
//   7. unlock_slot stores the new head with release order, then frees the
//      flag. Owners read the head and then the node it points to, an address
//      dependency, so they see the nodes the locker wrote.
//   If rseq sections may run and membarrier with the RSEQ command is not
//   available, lock_slot refuses before step 2: remote access would be unsafe.
//   A thread on the slot's own CPU needs neither step 2's exchange nor the
//   fence: lock_local_slot stores kSlotLocked from one of that CPU's owner
//   sections, after step 1.
//
// Section users (the Dekker count that lets fallback threads skip the fence)
//   Before any owner section can commit, the process's section users count
//   (g_section_users, registration.hpp) is above zero and a sequentially
//   consistent fence has followed the addition: start-up counts the threads
//   glibc (or a library percpu serves) registers, each of percpu's own
//   registrations counts itself before its system call, and a thread's
//   first section through section_area() counts itself (mark_section_user).
//   A locker reads the count after its exchange (both seq_cst). If it reads
//   0, its exchange precedes every such fence in the single total order, so
//   every later section reads kSlotLocked or a later value: nothing to
//   fence. Otherwise it fences. The count never returns to 0 once a kept
//   addition is made (a failed registration takes back only its own).
//   This is what makes threads without rseq (seccomp, valgrind, forced
//   backend) cheap and correct: in a process where no thread has rseq they
//   lock with atomics only.
//
// Flags, waiting, and why nothing deadlocks
//   Every flag of every structure (slot lockers, side-stack consumers,
//   thread-slot lockers, the object_pool depot) is taken through take_flag /
//   try_take_flag and given back through release_flag, which keep a
//   per-thread count of the flags the thread holds. Three rules:
//   R1. A thread waits for a flag only while it holds none (take_flag checks
//       the count; with one held it makes a single attempt and reports
//       failure). A signal handler that interrupted a holder therefore never
//       waits: its thread's count is not zero. Callers have a non-waiting
//       fallback for that failure (the side stack, or nullptr where the
//       header allows it).
//   R2. A holder does a bounded amount of work and releases: it never waits
//       for anything while holding (by R1), and nothing it does blocks (the
//       only system calls under a flag are membarrier and mmap).
//   R3. The fork handler is the one exception to R1: it waits for every flag
//       while holding those it already took. It is safe because every thread
//       it can wait for is a holder, and by R2 (and R1 for any handler
//       stacked on that holder) the holder releases without waiting for
//       anything, in particular not for a flag the fork handler holds.
//   While the fork handler runs, other threads' attempts to take a flag
//   fail (so it waits only for the holders of that moment, not for threads
//   that keep re-taking flags); a thread that waits meanwhile holds nothing.
//   So no cycle exists in the waits-for graph: the only threads that wait
//   hold nothing (no one can wait for them), except the fork handler, which
//   waits only for threads that do not wait. A signal handler on the forking
//   thread that interrupted a holder and calls fork() would wait for its own
//   thread: the fork handler skips the flags that thread holds (see below).
//   The lockers of CPU slots and of thread slots, which live on per-CPU and
//   per-thread-index memory, it waits for without taking them, so that a
//   fork writes none of them and fills no page of a CPU or thread that
//   never touched the structure (fork_wait_until_free; thread_slots.hpp,
//   "Fork"): a locker that took one after the handler read it free finds
//   the hold (fork_holds_flags) and lets go before it touches the slot.
//   ref::kill() holds its kill flag, which the fork handler waits for, while
//   it takes the slots' lockers; it exempts itself from the refusal above
//   (exempt_from_fork_pending), so it finishes and the fork goes on.
//
// Abandoned holders (operations left by a jump, or a thread that exited)
//   R2 assumes the holder's frame runs to its release. A signal handler that
//   leaves with siglongjmp, or calls pthread_exit(), abandons the operation
//   it interrupted: the flag stays held for ever and the count of flags its
//   thread holds stays above zero (so that thread never waits again, by R1).
//   Waiting for such a flag would never end, so a wait (take_flag's, the
//   fork handler's, kill's) watches the holder, whose id the flag holds:
//   - the calling thread itself (held by one of its own frames, interrupted
//     or left): the fork handler skips the flag silently (the child's one
//     thread is this one, with the same frames, so the flag is in the same
//     state there); any other wait reports it;
//   - a thread that has exited (tgkill(pid, tid, 0) answers ESRCH): the
//     flag becomes kFlagAbandoned, so later waiters give up at once, and the
//     wait reports it;
//   - the same live thread for kAbandonedHolderNs: reported as stuck.
//   Reporting is one line on stderr (report_abandoned); debug builds then
//   abort, release builds (once per process) go on without what the flag
//   guards, as for a busy slot: trim() and take_all() skip it, the depot's
//   users take their non-waiting paths (allocate() may return nullptr), the
//   fork leaves it as it is in both processes. Thread slots' busy words are
//   watched the same way, through the owner's id (thread_slots.cpp).
//   Nothing here is a cancellation point: the waits sleep with the raw
//   system call (nocancel.hpp).
//
// Async-signal-safe: everything here except prepare_remote_fences.
#pragma once

#include <cstddef>
#include <cstdint>

#include "percpu/internal/rseq_cs.hpp"
#include "percpu/internal/sanitizers.hpp"

namespace percpu {
namespace internal {

// The value a locker leaves in a head. Odd, so never a node address (nodes
// are at least pointer-aligned). Every list ends in 0 (nullptr), so a
// zeroed head is an empty list, and the pop section refuses both values
// with one unsigned compare against kSlotLocked.
constexpr std::intptr_t kSlotLocked = 1;

// A flag's values (see "Flags, waiting, and why nothing deadlocks"): free,
// the id (gettid) of the thread holding it, or kFlagForked while a fork
// handler holds it. Flags are ints touched with atomics only, so they stay
// plain words that a fork handler and a signal handler can take without any
// other state; the holder's id is what lets a waiter tell a holder that will
// never come back ("Abandoned holders").
constexpr int kFlagFree = 0;
constexpr int kFlagForked = -1;
// A flag whose holder's thread has exited while holding it: never free again,
// and a waiter that finds it gives up at once.
constexpr int kFlagAbandoned = -2;

// How long a waiter watches one live holder keep a flag before it calls the
// holder abandoned (see "Abandoned holders"): far beyond any hold percpu
// makes (a bounded batch move, membarrier, mmap), even preempted.
constexpr long kAbandonedHolderNs = 10L * 1000 * 1000 * 1000;

// One CPU's slot: the head owner sections update and the locker flag. The
// structures keep one per CPU on the per-CPU memory
// (internal/stride_arena.hpp), which keeps two CPUs' copies apart; all zero
// is an empty list with its locker free, so a CPU that never touches a
// structure costs it nothing.
struct cpu_slot_words {
  std::intptr_t head;  // plain stores by owner sections; atomics by lockers
  int locker;          // a flag
};

enum class lock_result {
  acquired,  // the caller owns the list and must call unlock_slot
  busy,      // another thread holds it, or owners kept committing
  refused,   // rseq sections may run and membarrier cannot fence them
};

// Locks `slot`, the slot of CPU `cpu`, for a thread that is not its owner
// section. On acquired, *value is the list's head. Busy while a fork
// handler runs on another thread (it waits for lockers without taking
// their flags: wait_for_slot_lockers).
[[nodiscard]] lock_result lock_slot(cpu_slot_words* slot, int cpu, std::intptr_t* value) noexcept;
// Publishes `value` as the new head and releases the slot.
void unlock_slot(cpu_slot_words* slot, std::intptr_t value) noexcept;
// False when lock_slot would refuse: sections may run and there is no fence.
[[nodiscard]] bool remote_access_possible() noexcept;
// Whether lock_slot can fence a CPU (membarrier with the RSEQ command),
// whatever the section users: a structure that cannot count on it keeps its
// owner sections off its slots from the start.
[[nodiscard]] bool slot_fence_available() noexcept;

// Registers the process for membarrier's RSEQ fence now, when that is cheap,
// and reports whether the fence is ready.
//
// Why: the fence needs a one-time registration per process
// (MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ). In a process with more
// than one thread the kernel makes that registration wait for an RCU grace
// period (sync_runqueues_membarrier_state in kernel/sched/membarrier.c), which
// on a loaded machine stalls the caller for a long, visible time; with a
// single user of the address space it skips the wait and costs a system call.
// Registered lazily, the first trim(), steal or take_all() paid the stall.
//
// Where: percpu registers at load, from a constructor in cpu_slots.cpp, which
// is linked in exactly when a program uses free_list or object_pool (in a
// shared build, always); a program is single-threaded then. The structures'
// constructors call this again, for programs that create their first
// structure before starting threads but were loaded without the constructor
// registering (an unknown thread count). The registration survives fork()
// (the child's address space copies it) and is undone by exec(), whose new
// image runs the constructor again.
//
// This function registers only when it knows the process has one thread;
// otherwise it does nothing and the first remote access registers, as
// before: a stall is better than a wrong fence, and starting a thread behind
// the program's back to absorb it is not this library's call. (The load-time
// constructor also registers when the count is unknown, e.g. a static binary
// without /proc, since a program is almost always single-threaded then.)
// Cheap once the state is known (one atomic load). Not async-signal-safe:
// the first call may look a symbol up with dlsym.
[[nodiscard]] bool prepare_remote_fences() noexcept;

// Marks the calling thread as a section user (t_section_state, see
// registration.hpp) and returns its new state: marked, or forced_locked
// under the test seam below.
[[nodiscard]] PERCPU_EXPORT section_user mark_section_user() noexcept;

// The area for owner sections of the calling thread, or nullptr when it must
// use the locked path (no rseq, or the seam says so). The state word is read
// through a fresh thread pointer (see t_section_state). It is only read once
// rseq_area_for_sections() has answered, that is after start-up has aimed
// g_fast_path.section_state; a stale offset 0 would read the thread control
// block's first word, a pointer, which is never 1, and so only costs a call.
//
// A thread without rseq is answered inline too, from the same state word
// (section_user::no_rseq, set by section_area_slow() once it has found no
// area after start-up), so its operations do not call out to ask again each
// time. Before start-up the area check fails and the state offset is 0: the
// word there is a pointer, which is never no_rseq, so that costs a call.
[[nodiscard]] PERCPU_EXPORT rseq_area* section_area_slow() noexcept;
[[nodiscard]] inline rseq_area* section_area() noexcept {
  rseq_area* area = sections_area_if_registered();
  if (__builtin_expect(area != nullptr, 1)) {
    if (__builtin_expect(load_tp_relative_i32(g_fast_path.section_state) ==
                             static_cast<int>(section_user::marked),
                         1)) {
      return area;
    }
    return mark_section_user() == section_user::marked ? area : nullptr;
  }
  if (load_tp_relative_i32(g_fast_path.section_state) == static_cast<int>(section_user::no_rseq)) {
    return nullptr;
  }
  return section_area_slow();
}

// The process-wide barrier of percpu::shared_mutex and percpu::ref:
// membarrier(PRIVATE_EXPEDITED), registered once per process (and again in a
// forked child, where the registration does not survive). On return every
// thread of the process that was running has executed a full memory barrier,
// and every thread that was not running will pass through the scheduler,
// which is one, before it runs again. So a thread's compiler barrier acts as
// a full barrier against this call: the asymmetric Dekker both rely on.
// barrier_available() is false without the command (old kernel, seccomp,
// valgrind) or under simulate_missing_membarrier(); then barrier_all()
// returns false and callers must make their readers fence for themselves.
[[nodiscard]] bool barrier_available() noexcept;
[[nodiscard]] bool barrier_all() noexcept;

// Test seam: from now on the calling thread takes the locked per-CPU path
// (the path of a thread without rseq that has no thread slot), even though
// other threads run sections. The hot paths test only the started area's
// cpu_id before their sections, so on also pauses the thread's rseq registration (registration.hpp,
// pause_rseq_for_this_thread()) and off restores it; meanwhile cpu_id() on
// this thread answers from the fallback. Aborts with a line on stderr when the
// registration cannot be paused. Call off on the thread that called on.
void force_locked_path_for_this_thread(bool on) noexcept;
// Test seam: how many membarrier fences this process issued.
unsigned long fence_count() noexcept;
// Test seam: pretend membarrier is missing (lock_slot then refuses whenever
// sections may run).
void simulate_missing_membarrier(bool on) noexcept;

// The flags (see "Flags, waiting, and why nothing deadlocks" above): ints
// touched with atomics only.
// One attempt; true when the caller now holds the flag.
[[nodiscard]] bool try_take_flag(int* flag) noexcept;
// Waits for the flag if the calling thread holds no flag (R1); otherwise one
// attempt. True when the caller now holds the flag; false also when the
// holder was abandoned (reported: see "Abandoned holders").
[[nodiscard]] bool take_flag(int* flag) noexcept;
void release_flag(int* flag) noexcept;
// How many flags the calling thread holds (0 outside percpu's slow paths).
int flags_held() noexcept;
// The calling thread's id (gettid), cached per thread; what its flags hold.
int current_tid() noexcept;

// Waits for the flag whatever the calling thread holds, for callers that
// know no holder waits for them (ref::kill: its thread slots' lockers and
// its kill flag). False when the holder was abandoned (reported).
[[nodiscard]] bool wait_for_flag(int* flag) noexcept;

// What a waiter concludes about a flag's holder (see "Abandoned holders").
enum class holder_verdict {
  running,  // may still release it: keep waiting
  self,     // the calling thread: a frame of its own holds it
  gone,     // its thread has exited (tgkill answers ESRCH)
  stuck,    // held by the same live thread for kAbandonedHolderNs
};
// Judges `holder` (a flag's value, or a thread slot owner's id). *watched
// and *watched_since carry the holder seen last and since when; start with
// *watched = kFlagFree.
[[nodiscard]] holder_verdict judge_holder(int holder, int* watched, long* watched_since) noexcept;

// The back-off step of every wait for a holder, at the waiter's `spins`-th
// look: spin, then yield, then sleep 50 us through the raw system call (never
// a cancellation point). True every 16th sleep, when the waiter should judge
// its holder (judge_holder).
[[nodiscard]] bool back_off(int spins) noexcept;

// One line on stderr naming `what` and why it will never be released; then,
// in debug builds (NDEBUG not defined), abort.
void report_abandoned(const char* what, holder_verdict verdict) noexcept;
// Test seam: the time after which a live holder counts as stuck (0: the
// default, kAbandonedHolderNs).
void set_abandoned_holder_limit_for_testing(long ns) noexcept;

// The fork handler's waits (R3): take the flag (as kFlagForked) even while
// holding others; give up on a flag the forking thread's own frames hold
// (silently: it is in the same state in the child, whose one thread that
// is) or whose holder was abandoned (reported). fork_release_flag releases
// only what fork_wait_for_flag took, and in the child gives the flags the
// forking thread's own frames hold its new id.
void fork_wait_for_flag(int* flag) noexcept;
void fork_release_flag(int* flag) noexcept;
// The fork handler's wait that writes nothing, for flags on per-CPU or
// per-thread-index memory, where taking every flag would fill the pages of
// every CPU or index: waits until `flag` is free or held by the forking
// thread's own frames. Sound because every taker checks fork_holds_flags()
// again after taking one and lets go before it touches anything (a taker
// the handler saw free leaves); a holder that will never release it is
// reported, naming `what`.
void fork_wait_until_free(const int* flag, const char* what) noexcept;
// Both halves for the per-CPU slots of a structure (CPU 0's copy `slots`,
// `count` CPUs): the wait above for every locker; and in the child, the
// lockers the forking thread's own frames hold get its new id, and those
// of threads the child does not have are freed unless their slot is locked
// (a holder the wait gave up on: it stays held). Neither writes a slot
// that does not change.
void wait_for_slot_lockers(const cpu_slot_words* slots, int count) noexcept;
void slot_lockers_in_child(cpu_slot_words* slots, int count) noexcept;

// The fork registry's hold on every flag (R3): between begin and end, other
// threads' attempts to take a flag fail, so the fork handler waits only for
// the holders of that moment; the calling thread's attempts succeed, and so
// do those of a thread that exempted itself: one that holds a flag the fork
// handler waits for and must take others to finish (ref::kill).
void begin_fork_flags() noexcept;
void end_fork_flags() noexcept;
void exempt_from_fork_pending(bool on) noexcept;
// Whether that hold applies to the calling thread now (a fork handler runs
// elsewhere, and this thread is neither forking nor exempt). Sequentially
// consistent: a thread that took a flag, then finds this false, is seen
// holding it by a fork handler that reads the flag after begin_fork_flags.
[[nodiscard]] bool fork_holds_flags() noexcept;
// One attempt at a locker's flag, as every locker takes it: try_take_flag,
// then, when a fork handler's hold applies (one that began meanwhile may
// have read the flag free), the flag given back before the caller touches
// what it guards. True when the caller holds the flag.
[[nodiscard]] inline bool try_take_locker_flag(int* flag) noexcept {
  if (!try_take_flag(flag)) return false;
  if (fork_holds_flags()) {
    release_flag(flag);
    return false;
  }
  return true;
}
// In the child after fork: a flag held by a thread that does not exist
// there is freed; one the forking thread's own frames hold gets its new
// id; free and abandoned flags stay. Writes only a flag that changes.
void clear_flag_in_child(int* flag) noexcept;

// ---- Owner sections on per-CPU lists --------------------------------------
//
// The two owner sections every per-CPU list of percpu is made of (the
// free_list's lists and the object_pool's caches): pop the calling CPU's head,
// and push a chain onto it. Each retries a bounded number of times and never
// waits for a slot another thread holds. Both are async-signal-safe. A slot's
// head holds a node address, 0 for an empty list (every list ends in
// nullptr), or kSlotLocked while a non-owner holds it.

// Pops the head of the list of the CPU `area`'s thread runs on, in one
// section. True when it committed: *popped is the old head, a node. False
// when it did not pop: the list is empty, its CPU has no slot, a non-owner
// holds the slot, or every try aborted (the caller's slow path tells which).
[[nodiscard]] inline bool pop_local_head(rseq_area* area, cpu_slot_words* slots, int slot_count,
                                         long next_offset, std::intptr_t* popped) noexcept {
  for (int tries = 0; tries < kSectionTries; ++tries) {
    const int cpu = rseq_current_index<index_kind::cpu_id>(area);
    if (static_cast<unsigned>(cpu) >= static_cast<unsigned>(slot_count)) return false;
    const int rc = rseq_cmpabovev_storeoffp_load<index_kind::cpu_id>(
        area, &stride_copy(slots, static_cast<unsigned>(cpu))->head, kSlotLocked, next_offset,
        popped, cpu);
    if (rc == 0) return true;
    if (rc == 1) return false;  // empty, or locked by a non-owner
  }
  return false;
}

// Pushes the chain first..last (linked through Node::next) onto the list of
// the CPU `area`'s thread runs on, in one section. True when it committed;
// false as for pop_local_head (but an empty list takes a push).
template <class Node>
[[nodiscard]] inline bool push_local_chain(rseq_area* area, cpu_slot_words* slots, int slot_count,
                                           Node* first, Node* last) noexcept {
  // The section stores the head it reads into last->next (sanitizers.hpp).
  PERCPU_TSAN_RELEASE(last);
  for (int tries = 0; tries < kSectionTries; ++tries) {
    const int cpu = rseq_current_index<index_kind::cpu_id>(area);
    if (static_cast<unsigned>(cpu) >= static_cast<unsigned>(slot_count)) return false;
    const int rc = rseq_cmpnev_trystorev_storev<index_kind::cpu_id>(
        area, &stride_copy(slots, static_cast<unsigned>(cpu))->head, kSlotLocked,
        reinterpret_cast<std::intptr_t*>(&last->next), reinterpret_cast<std::intptr_t>(first), cpu);
    if (rc == 0) return true;
    if (rc == 1) return false;  // locked by a non-owner
  }
  return false;
}

// Locks the slot of the CPU `area`'s thread runs on from one of that CPU's
// owner sections, for work one section cannot do (a spill that cuts a
// batch): the section stores kSlotLocked over the head it read, so no fence
// is needed. Every other owner section of this CPU that read the head
// before was preempted by this thread and restarts; owner sections of
// other CPUs never commit to this slot (they compare cpu_id). The flag is
// taken first, as lock_slot's step 1, so that only its holder writes
// kSlotLocked here, and a fork handler waits for it as for any locker. On
// acquired, *cpu is the CPU and *value the list's head: unlock_slot(that
// CPU's slot, the new head) ends it. Busy when another thread holds the
// slot, a fork is under way, or the section kept failing (aborts, owners
// committing in between, the thread moved off the CPU whose flag it took);
// refused when the CPU has no slot.
[[nodiscard]] inline lock_result lock_local_slot(rseq_area* area, cpu_slot_words* slots,
                                                 int slot_count, int* cpu,
                                                 std::intptr_t* value) noexcept {
  const int c = rseq_current_index<index_kind::cpu_id>(area);
  if (static_cast<unsigned>(c) >= static_cast<unsigned>(slot_count)) return lock_result::refused;
  cpu_slot_words* slot = stride_copy(slots, static_cast<unsigned>(c));
  if (!try_take_locker_flag(&slot->locker)) return lock_result::busy;
  for (int tries = 0; tries < kSectionTries; ++tries) {
    // Never kSlotLocked: only the flag's holder writes it, this thread.
    const std::intptr_t head = __atomic_load_n(&slot->head, __ATOMIC_RELAXED);
    if (rseq_cmpeqv_storev<index_kind::cpu_id>(area, &slot->head, head, kSlotLocked, c) == 0) {
      *cpu = c;
      *value = head;
      return lock_result::acquired;
    }
    if (rseq_current_index<index_kind::cpu_id>(area) != c) break;  // moved: it cannot commit
  }
  release_flag(&slot->locker);
  return lock_result::busy;
}

// ---- The started form (the lists' hot paths) -------------------------------
//
// One try of the pop or the push, started as counter::add's section is
// (rseq_cs.hpp, start_section()): no bound test, no second read of the CPU,
// and one test before the section, of the started area's cpu_id. What makes
// that enough:
//   - a thread whose sections must not commit fails inside the section, at
//     its compare of cpu_id with the cpu_id_start it was started from: the
//     area the sections' offset leads to shows no CPU (-1 or -2) while the
//     thread has no registration there (no rseq, start-up not done, a
//     forced fallback, the test seam that sends it to the locked path,
//     which unregisters it), and cpu_id_start then reads 0. The test before
//     the section is the same fact read early, from the line start_section()
//     has just read: it spares such a thread arming a section that must
//     fail, on every operation of the lists' paths without rseq (it costs a
//     thread with rseq a load it will hit and a branch it predicts);
//   - the lockers' Dekker needs no mark by the thread: the section users
//     count (registration.hpp) already counts every registration a started
//     section can commit under, from before it could;
//   - a section commits only on the CPU the kernel shows in cpu_id, which
//     is below max_cpus() wherever sections are on, so at a copy that
//     exists, and it reads the head only after that compare.
// False sends the caller to its slow path: retry with pop_local_head /
// push_local_chain (an abort), tell an empty list from a locked one, or
// take the path of a thread without rseq.

// Whether the started area shows no CPU: this thread has no registration
// there, and its section would abort.
[[nodiscard]] inline bool started_area_unregistered(section_start start) noexcept {
  return started_area_cpu_id(start) < 0;
}

// pop_local_head's one started try: true with *popped a node.
[[nodiscard]] inline bool pop_started(cpu_slot_words* slots, long next_offset,
                                      std::intptr_t* popped) noexcept {
  const section_start start = start_section();
  if (__builtin_expect(started_area_unregistered(start), 0)) return false;
  return rseq_cmpabovev_storeoffp_load_started(start, &stride_copy_at(slots, start)->head,
                                               kSlotLocked, next_offset, popped) == 0;
}

// push_local_chain's one started try.
template <class Node>
[[nodiscard]] inline bool push_started(cpu_slot_words* slots, Node* first, Node* last) noexcept {
  const section_start start = start_section();
  if (__builtin_expect(started_area_unregistered(start), 0)) return false;
  PERCPU_TSAN_RELEASE(last);
  return rseq_cmpnev_trystorev_storev_started(start, &stride_copy_at(slots, start)->head,
                                              kSlotLocked,
                                              reinterpret_cast<std::intptr_t*>(&last->next),
                                              reinterpret_cast<std::intptr_t>(first)) == 0;
}

}  // namespace internal
}  // namespace percpu
