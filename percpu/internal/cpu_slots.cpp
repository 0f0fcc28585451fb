// Per-CPU slots (percpu/internal/cpu_slots.hpp): membarrier fences, the
// flags, the section-user flag and the remote lock of a CPU's slot.

#include "percpu/internal/cpu_slots.hpp"
#include "percpu/internal/nocancel.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

extern "C" __attribute__((weak)) const char percpu_internal_no_fences_at_load;

namespace percpu {
namespace internal {

namespace {

enum fence_state : int { kFenceUnknown = 0, kFenceReady = 1, kFenceMissing = 2 };
std::atomic<int> g_fence_state{kFenceUnknown};
std::atomic<bool> g_simulate_missing{false};
std::atomic<unsigned long> g_fences{0};

// Rounds of exchange-fence-recheck before lock_slot reports busy. Each round
// that fails means an owner committed in the window, which is rare; a few
// rounds make giving up rarer still, and giving up is always safe.
constexpr int kFenceRounds = 4;

long sys_membarrier(int cmd, unsigned flags, int cpu) noexcept {
  return syscall(__NR_membarrier, cmd, flags, cpu);
}

// Registers the process for membarrier's `command` (through its
// `register_command`) and records in `state` whether it is ready. Idempotent,
// so a forked child or two racing threads may do it again.
int register_membarrier(int command, int register_command, std::atomic<int>* state) noexcept {
  const int saved_errno = errno;
  const long mask = sys_membarrier(MEMBARRIER_CMD_QUERY, 0, 0);
  int result = kFenceMissing;
  if (mask > 0 && (mask & command) != 0 && sys_membarrier(register_command, 0, 0) == 0) {
    result = kFenceReady;
  }
  errno = saved_errno;
  state->store(result, std::memory_order_release);
  return result;
}

// The RSEQ fence of one CPU (lock_slot).
int register_fence() noexcept {
  return register_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
                             MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, &g_fence_state);
}

enum class thread_count { one, more, unknown };

// Whether the process has a single thread: glibc's __libc_single_threaded
// (looked up, so older C libraries still load us), else the thread count in
// /proc/self/stat, else unknown (static binaries, no /proc).
thread_count process_threads() noexcept {
  if (const auto* flag =
          static_cast<const volatile char*>(dlsym(RTLD_DEFAULT, "__libc_single_threaded"))) {
    // Cleared by the first pthread_create: "more" may mean "had more".
    return *flag != 0 ? thread_count::one : thread_count::more;
  }
  const int saved_errno = errno;
  thread_count result = thread_count::unknown;
  const int fd = nocancel_open_read_only("/proc/self/stat");
  if (fd >= 0) {
    char buffer[512];
    const long n = nocancel_read(fd, buffer, sizeof(buffer) - 1);
    nocancel_close(fd);
    if (n > 0) {
      buffer[n] = '\0';
      // The command name may hold spaces and parentheses, so fields are
      // counted from the last ')'; num_threads (see proc(5)) follows the
      // eighteenth space after it.
      const char* p = strrchr(buffer, ')');
      for (int field = 0; p != nullptr && field < 18; ++field) p = strchr(p + 1, ' ');
      if (p != nullptr) {
        result = p[1] == '1' && p[2] == ' ' ? thread_count::one : thread_count::more;
      }
    }
  }
  errno = saved_errno;
  return result;
}

bool fence_available() noexcept {
  if (g_simulate_missing.load(std::memory_order_relaxed)) return false;
  int state = g_fence_state.load(std::memory_order_acquire);
  if (state == kFenceUnknown) state = register_fence();
  return state == kFenceReady;
}

// Aborts every owner section running on `cpu`; see step 4 in the header.
bool fence_cpu(int cpu) noexcept {
  const int saved_errno = errno;
  long rc = sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu);
  if (rc != 0 && errno == EPERM && register_fence() == kFenceReady) {
    // A registration that did not survive (e.g. into a forked child).
    rc = sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu);
  }
  errno = saved_errno;
  g_fences.fetch_add(1, std::memory_order_relaxed);
  return rc == 0;
}

// The plain expedited command has its own registration; same states.
std::atomic<int> g_barrier_state{kFenceUnknown};

int register_barrier() noexcept {
  return register_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED,
                             MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, &g_barrier_state);
}

bool section_users_possible() noexcept {
  return __atomic_load_n(&g_section_users, __ATOMIC_SEQ_CST) != 0;
}

// The number of flags this thread holds. A signal handler that takes and
// releases flags leaves it as it found it, so the interrupted code's plain
// read-modify-write stays right; the signal fences keep the compiler from
// moving the count past the flag's own atomics.
__thread int t_flags_held PERCPU_STATIC_TLS = 0;

// The calling thread's id, which a flag it holds contains: 0 until asked,
// and again in a forked child (the child's thread has a new id).
__thread int t_tid PERCPU_STATIC_TLS = 0;

}  // namespace

int current_tid() noexcept {
  int tid = t_tid;
  if (__builtin_expect(tid == 0, 0)) {
    const int saved_errno = errno;
    tid = static_cast<int>(syscall(SYS_gettid));
    errno = saved_errno;
    t_tid = tid;
  }
  return tid;
}

namespace {

// Set while a fork handler takes and holds every flag. Other threads then
// fail to take flags (every caller has a way not to wait, or holds nothing
// while it waits), so the fork handler waits only for the holders of the
// moment instead of competing with threads that keep re-taking the flags.
int g_fork_pending = 0;
__thread int t_forking PERCPU_STATIC_TLS = 0;
// See exempt_from_fork_pending() in the header.
__thread int t_fork_exempt PERCPU_STATIC_TLS = 0;
// The forking thread's id in the parent, so that the child can tell the
// flags that thread's own frames hold (see fork_release_flag).
int g_fork_tid = 0;

void tid_after_fork_in_child() noexcept { t_tid = 0; }

// Before any structure exists, so this child handler runs before the fork
// registry's (pthread_atfork runs child handlers in registration order).
__attribute__((constructor(102))) void flags_at_load() {
  pthread_atfork(nullptr, nullptr, &tid_after_fork_in_child);
}

bool try_take_as(int* flag, int value) noexcept {
  if (__atomic_load_n(flag, __ATOMIC_RELAXED) != kFlagFree) return false;
  if (__atomic_load_n(&g_fork_pending, __ATOMIC_RELAXED) != 0 && t_forking == 0 &&
      t_fork_exempt == 0) {
    return false;
  }
  // Counted before the exchange: a handler arriving right after it must see
  // that this thread holds the flag.
  t_flags_held = t_flags_held + 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  int expected = kFlagFree;
  if (__atomic_compare_exchange_n(flag, &expected, value, false, __ATOMIC_ACQUIRE,
                                  __ATOMIC_RELAXED)) {
    return true;
  }
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  t_flags_held = t_flags_held - 1;
  return false;
}

bool try_take(int* flag) noexcept { return try_take_as(flag, current_tid()); }

void release(int* flag) noexcept {
  __atomic_store_n(flag, kFlagFree, __ATOMIC_RELEASE);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  t_flags_held = t_flags_held - 1;
}

// Test seam: see set_abandoned_holder_limit_for_testing in the header.
long g_abandoned_after_ns = kAbandonedHolderNs;

long now_ns() noexcept {
  struct timespec t = {0, 0};
  // The vDSO's clock: no system call, not a cancellation point.
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

// Spins, then yields, then sleeps briefly: a holder that was preempted (many
// waiters on few CPUs, or an emulator) gets the CPU back sooner than under a
// storm of yields, which the scheduler may answer by running the yielder
// again. The sleep is the raw system call: glibc's nanosleep() is a
// cancellation point, and nothing here may be one (nocancel.hpp).
//
// Between sleeps it looks at the holder (see "Abandoned holders" in the
// header) and gives up, returning false, when the holder will never release
// the flag. `value` is what the flag holds once taken.
bool wait_for(int* flag, int value, holder_verdict* verdict) noexcept {
  int watched = kFlagFree;
  long watched_since = 0;
  for (int spins = 0; !try_take_as(flag, value); ++spins) {
    if (__atomic_load_n(flag, __ATOMIC_RELAXED) == kFlagAbandoned) {
      *verdict = holder_verdict::gone;
      return false;
    }
    if (!back_off(spins)) continue;
    const int holder = __atomic_load_n(flag, __ATOMIC_RELAXED);
    const holder_verdict v = judge_holder(holder, &watched, &watched_since);
    if (v != holder_verdict::running) {
      // A holder that is gone never comes back: mark the flag, so later
      // waiters give up at once (it stays held, so nobody ever takes it).
      // Unless it released the flag and then exited, between the read of
      // `holder` above and the look at its thread: the flag then no longer
      // holds its id, the mark fails, and the wait goes on.
      if (v == holder_verdict::gone) {
        int expected = holder;
        if (!__atomic_compare_exchange_n(flag, &expected, kFlagAbandoned, false, __ATOMIC_RELAXED,
                                         __ATOMIC_RELAXED) &&
            expected != kFlagAbandoned) {
          continue;
        }
      }
      *verdict = v;
      return false;
    }
  }
  return true;
}

}  // namespace

bool back_off(int spins) noexcept {
  if (spins < 64) return false;
  if (spins < 256) {
    sched_yield();
    return false;
  }
  nocancel_sleep_ns(50 * 1000);
  return (spins & 15) == 0;
}

holder_verdict judge_holder(int holder, int* watched, long* watched_since) noexcept {
  // Free again, or the fork handler (which never waits unboundedly): wait.
  if (holder == kFlagFree || holder == kFlagForked) {
    *watched = kFlagFree;
    return holder_verdict::running;
  }
  if (holder == kFlagAbandoned) return holder_verdict::gone;
  if (holder == current_tid()) return holder_verdict::self;
  const int saved_errno = errno;
  const bool gone = syscall(SYS_tgkill, getpid(), holder, 0) != 0 && errno == ESRCH;
  errno = saved_errno;
  if (gone) return holder_verdict::gone;
  const long now = now_ns();
  if (holder != *watched) {
    *watched = holder;
    *watched_since = now;
    return holder_verdict::running;
  }
  return now - *watched_since > g_abandoned_after_ns ? holder_verdict::stuck
                                                     : holder_verdict::running;
}

void report_abandoned(const char* what, holder_verdict verdict) noexcept {
  const char* why = verdict == holder_verdict::gone ? "its thread has exited"
                    : verdict == holder_verdict::self
                        ? "it is held by a frame of the calling thread that was left"
                        : "its holder has made no progress for a long time";
  char line[400];
  std::size_t n = 0;
  for (const char* part :
       {"percpu: ", what, " was abandoned (", why,
        "): a percpu operation was left without finishing, by a jump out of a signal handler, "
        "pthread_exit() or cancellation in a handler; see the header's signal section\n"}) {
    for (; *part != '\0' && n < sizeof(line) - 1; ++part) line[n++] = *part;
  }
#ifndef NDEBUG
  nocancel_write(STDERR_FILENO, line, n);
  std::abort();
#else
  // Once per process: the structure goes on without what was left held.
  static int reported = 0;
  if (__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED) == 0) {
    nocancel_write(STDERR_FILENO, line, n);
  }
#endif
}

void set_abandoned_holder_limit_for_testing(long ns) noexcept {
  g_abandoned_after_ns = ns > 0 ? ns : kAbandonedHolderNs;
}

bool try_take_flag(int* flag) noexcept { return try_take(flag); }

bool take_flag(int* flag) noexcept {
  if (t_flags_held != 0) return try_take(flag);
  holder_verdict verdict = holder_verdict::running;
  if (wait_for(flag, current_tid(), &verdict)) return true;
  report_abandoned("a lock of a percpu structure", verdict);
  return false;
}

void release_flag(int* flag) noexcept { release(flag); }

int flags_held() noexcept { return t_flags_held; }

bool wait_for_flag(int* flag) noexcept {
  holder_verdict verdict = holder_verdict::running;
  if (wait_for(flag, current_tid(), &verdict)) return true;
  report_abandoned("a lock of a percpu structure", verdict);
  return false;
}

void fork_wait_for_flag(int* flag) noexcept {
  holder_verdict verdict = holder_verdict::running;
  if (wait_for(flag, kFlagForked, &verdict)) return;
  // The forking thread's own frames hold it (a handler that interrupted a
  // holder called fork, or a frame a jump left): that thread is the child's
  // one thread, so the flag is in the same state in both processes, and
  // waiting could never end. Not an error by itself.
  if (verdict == holder_verdict::self) return;
  report_abandoned("a lock of a percpu structure, at fork(),", verdict);
}

namespace {

// Waits, reading only, until `flag` is free or held by the calling thread
// (its own frames: a handler that interrupted a locker called fork). False
// when its holder will never release it.
bool wait_until_free(const int* flag, holder_verdict* verdict) noexcept {
  int watched = kFlagFree;
  long watched_since = 0;
  const int self = current_tid();
  for (int spins = 0;; ++spins) {
    const int holder = __atomic_load_n(flag, __ATOMIC_SEQ_CST);
    if (holder == kFlagFree || holder == self) return true;
    if (holder == kFlagAbandoned) {
      *verdict = holder_verdict::gone;
      return false;
    }
    if (!back_off(spins)) continue;
    const holder_verdict v = judge_holder(holder, &watched, &watched_since);
    // A holder that released the flag and then exited, after the read of
    // `holder` above, is not an abandoned one: look again.
    if (v == holder_verdict::gone && __atomic_load_n(flag, __ATOMIC_SEQ_CST) != holder) continue;
    if (v != holder_verdict::running) {
      *verdict = v;
      return false;
    }
  }
}

}  // namespace

void fork_wait_until_free(const int* flag, const char* what) noexcept {
  holder_verdict verdict = holder_verdict::running;
  // The forking thread's own frames: the same state in the child, whose
  // one thread that is (as in fork_wait_for_flag). Anything else that
  // never ends stays as its holder left it, in both processes.
  if (!wait_until_free(flag, &verdict) && verdict != holder_verdict::self) {
    report_abandoned(what, verdict);
  }
}

void wait_for_slot_lockers(const cpu_slot_words* slots, int count) noexcept {
  for (int cpu = 0; cpu < count; ++cpu) {
    fork_wait_until_free(&stride_copy(slots, static_cast<unsigned>(cpu))->locker,
                         "a lock of a percpu structure, at fork(),");
  }
}

void slot_lockers_in_child(cpu_slot_words* slots, int count) noexcept {
  for (int cpu = 0; cpu < count; ++cpu) {
    cpu_slot_words* slot = stride_copy(slots, static_cast<unsigned>(cpu));
    if (__atomic_load_n(&slot->head, __ATOMIC_RELAXED) == kSlotLocked) {
      // A locker was cut off holding the list (its holder never came back,
      // reported by the wait): it stays locked, as in the parent.
      fork_release_flag(&slot->locker);
    } else {
      // Held by a thread that the child does not have (one that took the
      // flag as the fork began and was letting go untouched): free.
      clear_flag_in_child(&slot->locker);
    }
  }
}

void fork_release_flag(int* flag) noexcept {
  const int value = __atomic_load_n(flag, __ATOMIC_RELAXED);
  if (value == kFlagForked) {
    release(flag);
    return;
  }
  // Not taken by the fork handler. In the child, the flags that the forking
  // thread's own frames hold carry its parent id: give them its new one.
  const int self = current_tid();
  if (value == g_fork_tid && value != self) __atomic_store_n(flag, self, __ATOMIC_RELAXED);
}

void exempt_from_fork_pending(bool on) noexcept { t_fork_exempt = on ? 1 : 0; }

void begin_fork_flags() noexcept {
  t_forking = 1;
  g_fork_tid = current_tid();
  __atomic_store_n(&g_fork_pending, 1, __ATOMIC_SEQ_CST);
}

void end_fork_flags() noexcept {
  __atomic_store_n(&g_fork_pending, 0, __ATOMIC_RELEASE);
  t_forking = 0;
}

bool fork_holds_flags() noexcept {
  // The caller has just taken a flag with an acquire exchange, which on
  // some architectures (aarch64) does not order its store before a later
  // load: the fence does, so that either this load sees the hold or the
  // fork handler's read of the flag sees it taken.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return __atomic_load_n(&g_fork_pending, __ATOMIC_SEQ_CST) != 0 && t_forking == 0 &&
         t_fork_exempt == 0;
}

void clear_flag_in_child(int* flag) noexcept {
  const int value = __atomic_load_n(flag, __ATOMIC_RELAXED);
  // kFlagForked: taken by this fork's handler, which gives it back.
  if (value == kFlagFree || value == kFlagAbandoned || value == kFlagForked) return;
  const int self = current_tid();
  if (value == self) return;
  __atomic_store_n(flag, value == g_fork_tid ? self : kFlagFree, __ATOMIC_RELAXED);
}

section_user mark_section_user() noexcept {
  if (t_section_state == section_user::forced_locked) return section_user::forced_locked;
  add_section_users(1);
  t_section_state = section_user::marked;
  return section_user::marked;
}

rseq_area* section_area_slow() noexcept {
  rseq_area* area = registered_rseq_area();
  if (area == nullptr) {
    // Only once start-up is over: during it the answer may still change.
    if (t_section_state == section_user::unmarked && ensure_initialized()) {
      t_section_state = section_user::no_rseq;
    }
    return nullptr;
  }
  if (t_section_state == section_user::marked) return area;
  return mark_section_user() == section_user::marked ? area : nullptr;
}

void force_locked_path_for_this_thread(bool on) noexcept {
  if (!on) {
    resume_rseq_for_this_thread();
    t_section_state = section_user::unmarked;
    return;
  }
  t_section_state = section_user::forced_locked;
  // The started hot paths test only the started area's cpu_id: only a
  // registration that is gone makes this thread's sections abort.
  if (!pause_rseq_for_this_thread()) {
    static const char line[] =
        "percpu: force_locked_path_for_this_thread could not pause the thread's rseq "
        "registration\n";
    nocancel_write(STDERR_FILENO, line, sizeof(line) - 1);
    std::abort();  // a test seam that cannot do its job must fail the test
  }
}

unsigned long fence_count() noexcept { return g_fences.load(std::memory_order_relaxed); }

void simulate_missing_membarrier(bool on) noexcept {
  g_simulate_missing.store(on, std::memory_order_relaxed);
}

bool slot_fence_available() noexcept { return fence_available(); }

bool remote_access_possible() noexcept { return !section_users_possible() || fence_available(); }

bool barrier_available() noexcept {
  if (g_simulate_missing.load(std::memory_order_relaxed)) return false;
  int state = g_barrier_state.load(std::memory_order_acquire);
  if (state == kFenceUnknown) state = register_barrier();
  return state == kFenceReady;
}

bool barrier_all() noexcept {
  if (!barrier_available()) return false;
  const int saved_errno = errno;
  long rc = sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  if (rc != 0 && errno == EPERM && register_barrier() == kFenceReady) {
    rc = sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  }
  errno = saved_errno;
  g_fences.fetch_add(1, std::memory_order_relaxed);
  return rc == 0;
}

namespace {

bool prepare_fences_unless(thread_count refuse) noexcept {
  const int state = g_fence_state.load(std::memory_order_acquire);
  if (state != kFenceUnknown) return state == kFenceReady;
  const thread_count threads = process_threads();
  if (threads == thread_count::more || threads == refuse) return false;
  return register_fence() == kFenceReady;
}

// See prepare_remote_fences in the header. Runs after percpu's own start-up
// constructor and before the program's static constructors (which may start
// threads). At load an unknown thread count is taken as one: a static binary
// without /proc is still starting, and only a library loaded later into a
// threaded process could be wrong, which costs the same stall as before.
// Not in libpercpu_getcpu.so, which is made of the same objects but never
// uses a structure: a program run under it owes percpu no system call at
// load. The preload defines the marker; everywhere else the weak reference
// is null.
__attribute__((constructor(102))) void prepare_remote_fences_at_load() {
  if (&percpu_internal_no_fences_at_load != nullptr) return;
  (void)prepare_fences_unless(thread_count::more);
  // The plain barrier of thread slots, shared_mutex and ref: the same stall
  // in a threaded process, so registered now too when that is cheap.
  if (process_threads() != thread_count::more) (void)barrier_available();
}

}  // namespace

bool prepare_remote_fences() noexcept { return prepare_fences_unless(thread_count::unknown); }

lock_result lock_slot(cpu_slot_words* slot, int cpu, std::intptr_t* value) noexcept {
  // Decide before touching the head whether a fence will be possible, so a
  // refusal never leaves kSlotLocked behind; and before taking the flag, so
  // a first registration (a slow system call) never runs under it. Users
  // that appear after this check are caught after the exchange below.
  if (section_users_possible() && !fence_available()) return lock_result::refused;
  // A fork handler's hold makes it busy before the exchange touches the
  // head (wait_for_slot_lockers).
  if (!try_take_locker_flag(&slot->locker)) return lock_result::busy;
  for (int round = 0; round < kFenceRounds; ++round) {
    const std::intptr_t taken = __atomic_exchange_n(&slot->head, kSlotLocked, __ATOMIC_SEQ_CST);
    if (!section_users_possible()) {
      *value = taken;
      return lock_result::acquired;
    }
    if (!fence_cpu(cpu)) {
      // Cannot prove the sections are over. Put the value back only if no
      // owner replaced it; an owner's value was computed from `taken`, so
      // either way the list is as the owners left it.
      std::intptr_t expected = kSlotLocked;
      __atomic_compare_exchange_n(&slot->head, &expected, taken, false, __ATOMIC_RELEASE,
                                  __ATOMIC_RELAXED);
      release(&slot->locker);
      return lock_result::refused;
    }
    if (__atomic_load_n(&slot->head, __ATOMIC_SEQ_CST) == kSlotLocked) {
      *value = taken;
      return lock_result::acquired;
    }
    // An owner committed between the exchange and the fence: its value is
    // the list now. Take again.
  }
  release(&slot->locker);
  return lock_result::busy;
}

void unlock_slot(cpu_slot_words* slot, std::intptr_t value) noexcept {
  __atomic_store_n(&slot->head, value, __ATOMIC_RELEASE);
  release(&slot->locker);
}

}  // namespace internal
}  // namespace percpu
