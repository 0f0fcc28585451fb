// The remote-access protocol of percpu/internal/slot_lock.hpp: membarrier
// fences, the section-user flag, the side stack and the fork registry.

#include "percpu/internal/slot_lock.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

extern "C" __attribute__((weak)) const char percpu_internal_no_fences_at_load;

namespace percpu {
namespace internal {

namespace {

// Set once any thread may run owner sections; never cleared (see the header).
int g_section_users = 0;

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

// Registers the process for the RSEQ fence. Idempotent, so a forked child or
// two racing threads may do it again.
int register_fence() noexcept {
  const int saved_errno = errno;
  const long mask = sys_membarrier(MEMBARRIER_CMD_QUERY, 0, 0);
  int state = kFenceMissing;
  if (mask > 0 && (mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ) != 0 &&
      sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0) == 0) {
    state = kFenceReady;
  }
  errno = saved_errno;
  g_fence_state.store(state, std::memory_order_release);
  return state;
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
  const int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buffer[512];
    const ssize_t n = read(fd, buffer, sizeof(buffer) - 1);
    close(fd);
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
  const int saved_errno = errno;
  const long mask = sys_membarrier(MEMBARRIER_CMD_QUERY, 0, 0);
  int state = kFenceMissing;
  if (mask > 0 && (mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
      sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) {
    state = kFenceReady;
  }
  errno = saved_errno;
  g_barrier_state.store(state, std::memory_order_release);
  return state;
}

bool section_users_possible() noexcept {
  return __atomic_load_n(&g_section_users, __ATOMIC_SEQ_CST) != 0;
}

// The number of flags this thread holds. A signal handler that takes and
// releases flags leaves it as it found it, so the interrupted code's plain
// read-modify-write stays right; the signal fences keep the compiler from
// moving the count past the flag's own atomics.
__thread int t_flags_held __attribute__((tls_model("initial-exec"))) = 0;

// Set while a fork handler takes and holds every flag. Other threads then
// fail to take flags (every caller has a way not to wait, or holds nothing
// while it waits), so the fork handler waits only for the holders of the
// moment instead of competing with threads that keep re-taking the flags.
int g_fork_pending = 0;
__thread int t_forking __attribute__((tls_model("initial-exec"))) = 0;

bool try_take(int* flag) noexcept {
  if (__atomic_load_n(flag, __ATOMIC_RELAXED) != 0) return false;
  if (__atomic_load_n(&g_fork_pending, __ATOMIC_RELAXED) != 0 && t_forking == 0) return false;
  // Counted before the exchange: a handler arriving right after it must see
  // that this thread holds the flag.
  t_flags_held = t_flags_held + 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  if (__atomic_exchange_n(flag, 1, __ATOMIC_ACQUIRE) == 0) return true;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  t_flags_held = t_flags_held - 1;
  return false;
}

void release(int* flag) noexcept {
  __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  t_flags_held = t_flags_held - 1;
}

// Spins, then yields, then sleeps briefly: a holder that was preempted (many
// waiters on few CPUs, or an emulator) gets the CPU back sooner than under a
// storm of yields, which the scheduler may answer by running the yielder
// again. nanosleep is async-signal-safe.
void wait_for(int* flag) noexcept {
  for (int spins = 0; !try_take(flag); ++spins) {
    if (spins < 64) continue;
    if (spins < 256) {
      sched_yield();
    } else {
      const int saved_errno = errno;
      struct timespec pause = {0, 50 * 1000};
      nanosleep(&pause, nullptr);
      errno = saved_errno;
    }
  }
}

}  // namespace

bool try_take_flag(int* flag) noexcept { return try_take(flag); }

bool take_flag(int* flag) noexcept {
  if (t_flags_held != 0) return try_take(flag);
  wait_for(flag);
  return true;
}

void release_flag(int* flag) noexcept { release(flag); }

int flags_held() noexcept { return t_flags_held; }

void wait_for_flag(int* flag) noexcept { wait_for(flag); }

section_user mark_section_user() noexcept {
  if (t_section_state == section_user::forced_locked) return section_user::forced_locked;
  __atomic_store_n(&g_section_users, 1, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
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
  t_section_state = on ? section_user::forced_locked : section_user::unmarked;
}

unsigned long fence_count() noexcept { return g_fences.load(std::memory_order_relaxed); }

void simulate_missing_membarrier(bool on) noexcept {
  g_simulate_missing.store(on, std::memory_order_relaxed);
}

bool slot_fence_available() noexcept { return fence_available(); }

bool remote_access_possible() noexcept {
  return !section_users_possible() || fence_available();
}

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

lock_result lock_slot(cpu_slot* slot, int cpu, std::intptr_t* value) noexcept {
  // Decide before touching the head whether a fence will be possible, so a
  // refusal never leaves kSlotLocked behind; and before taking the flag, so
  // a first registration (a slow system call) never runs under it. Users
  // that appear after this check are caught after the exchange below.
  if (section_users_possible() && !fence_available()) return lock_result::refused;
  if (!try_take(&slot->locker)) return lock_result::busy;
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
      release_locker(slot);
      return lock_result::refused;
    }
    if (__atomic_load_n(&slot->head, __ATOMIC_SEQ_CST) == kSlotLocked) {
      *value = taken;
      return lock_result::acquired;
    }
    // An owner committed between the exchange and the fence: its value is
    // the list now. Take again.
  }
  release_locker(slot);
  return lock_result::busy;
}

void unlock_slot(cpu_slot* slot, std::intptr_t value) noexcept {
  __atomic_store_n(&slot->head, value, __ATOMIC_RELEASE);
  release_locker(slot);
}

void wait_for_locker(cpu_slot* slot) noexcept { wait_for(&slot->locker); }

void release_locker(cpu_slot* slot) noexcept { release(&slot->locker); }

void wait_for_consumer(side_stack* stack) noexcept { wait_for(&stack->consumer); }

void release_consumer(side_stack* stack) noexcept { release(&stack->consumer); }

void side_push(side_stack* stack, side_node* first, side_node* last) noexcept {
  std::intptr_t head = __atomic_load_n(&stack->head, __ATOMIC_RELAXED);
  do {
    last->next = reinterpret_cast<side_node*>(head);
  } while (!__atomic_compare_exchange_n(&stack->head, &head, reinterpret_cast<std::intptr_t>(first),
                                        true, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
}

side_node* side_pop(side_stack* stack) noexcept {
  if (__atomic_load_n(&stack->head, __ATOMIC_RELAXED) == 0) return nullptr;
  if (!try_take(&stack->consumer)) return nullptr;
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
  release_consumer(stack);
  return node;
}

side_node* side_take_all(side_stack* stack) noexcept {
  if (__atomic_load_n(&stack->head, __ATOMIC_RELAXED) == 0) return nullptr;
  if (!try_take(&stack->consumer)) return nullptr;
  const std::intptr_t head = __atomic_exchange_n(&stack->head, 0, __ATOMIC_ACQUIRE);
  release_consumer(stack);
  return reinterpret_cast<side_node*>(head);
}

// ---- thread slots ------------------------------------------------------------

namespace {

// tid of the thread holding each index, 0 when free.
int g_thread_owner[kThreadSlots];
int claim_one_index() noexcept {
  const int saved_errno = errno;
  const int tid = static_cast<int>(syscall(SYS_gettid));
  const int pid = getpid();
  int found = -1;
  for (int pass = 0; pass < 2 && found < 0; ++pass) {
    for (int i = 0; i < kThreadSlots && found < 0; ++i) {
      int owner = __atomic_load_n(&g_thread_owner[i], __ATOMIC_RELAXED);
      if (pass == 0 ? owner != 0 : owner == 0) continue;
      // Second pass: take over the index of a thread that has exited.
      if (pass == 1 && !(syscall(SYS_tgkill, pid, owner, 0) != 0 && errno == ESRCH)) continue;
      if (__atomic_compare_exchange_n(&g_thread_owner[i], &owner, tid, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_RELAXED)) {
        found = i;
      }
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
__thread int t_thread_index_plus_one __attribute__((tls_model("initial-exec"))) = 0;

int claim_thread_index() noexcept {
  const int index = claim_one_index();
  t_thread_index_plus_one = index >= 0 ? index + 1 : -1;
  return index;
}

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

lock_result lock_thread_slot(thread_slot* slot) noexcept {
  if (!try_take(&slot->locker)) return lock_result::busy;
  __atomic_store_n(&slot->revoked, 1, __ATOMIC_SEQ_CST);
  if (!barrier_all()) {
    __atomic_store_n(&slot->revoked, 0, __ATOMIC_RELEASE);
    release(&slot->locker);
    return lock_result::refused;
  }
  if (__atomic_load_n(&slot->busy, __ATOMIC_ACQUIRE) != 0) {
    __atomic_store_n(&slot->revoked, 0, __ATOMIC_RELEASE);
    release(&slot->locker);
    return lock_result::busy;
  }
  return lock_result::acquired;
}

void unlock_thread_slot(thread_slot* slot) noexcept {
  __atomic_store_n(&slot->revoked, 0, __ATOMIC_RELEASE);
  release(&slot->locker);
}

bool revoke_all_thread_slots(thread_slot* slots) noexcept {
  for (int i = 0; i < kThreadSlots; ++i) {
    wait_for(&slots[i].locker);
    __atomic_store_n(&slots[i].revoked, 1, __ATOMIC_SEQ_CST);
  }
  if (!barrier_all()) {
    restore_all_thread_slots(slots);
    return false;
  }
  for (int i = 0; i < kThreadSlots; ++i) {
    while (__atomic_load_n(&slots[i].busy, __ATOMIC_ACQUIRE) != 0) sched_yield();
  }
  return true;
}

void restore_all_thread_slots(thread_slot* slots) noexcept {
  for (int i = 0; i < kThreadSlots; ++i) unlock_thread_slot(&slots[i]);
}

namespace {
// The process that forks, so the handler after fork knows it runs in a child.
int g_forking_pid = 0;
}  // namespace

void revoke_thread_slots_for_fork(thread_slot* slots) noexcept {
  __atomic_store_n(&g_forking_pid, getpid(), __ATOMIC_RELAXED);
  for (int i = 0; i < kThreadSlots; ++i) {
    wait_for(&slots[i].locker);
    __atomic_store_n(&slots[i].revoked, 1, __ATOMIC_SEQ_CST);
  }
  if (!barrier_all()) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  const int self = t_thread_index_plus_one - 1;  // its own slot may be busy below this handler
  for (int i = 0; i < kThreadSlots; ++i) {
    if (i == self) continue;
    for (int spins = 0; __atomic_load_n(&slots[i].busy, __ATOMIC_ACQUIRE) != 0; ++spins) {
      if (spins > 64) sched_yield();
    }
  }
}

void restore_thread_slots_after_fork(thread_slot* slots) noexcept {
  // An owner that found its slot revoked stores busy = 1 and then 0 again;
  // a fork between the two leaves busy set in the child, where that thread
  // does not exist, and lockers there would find the slot busy for ever. The
  // child has no other thread, so every busy but its own is stale.
  const bool child = getpid() != __atomic_load_n(&g_forking_pid, __ATOMIC_RELAXED);
  const int self = t_thread_index_plus_one - 1;
  for (int i = 0; i < kThreadSlots; ++i) {
    if (child && i != self) __atomic_store_n(&slots[i].busy, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&slots[i].revoked, 0, __ATOMIC_RELEASE);
    release(&slots[i].locker);
  }
}

// The fork registry: a list of participants behind a mutex, and one set of
// pthread_atfork handlers that walk it.
struct fork_registry {
  static pthread_mutex_t mutex;
  static fork_participant* first;

  static void prepare() noexcept {
    pthread_mutex_lock(&mutex);
    t_forking = 1;
    __atomic_store_n(&g_fork_pending, 1, __ATOMIC_SEQ_CST);
    for (fork_participant* p = first; p != nullptr; p = p->next_) p->before_fork();
  }
  static void release() noexcept {
    for (fork_participant* p = first; p != nullptr; p = p->next_) p->after_fork();
    __atomic_store_n(&g_fork_pending, 0, __ATOMIC_RELEASE);
    t_forking = 0;
    pthread_mutex_unlock(&mutex);
  }
  static void install() noexcept {
    static const bool installed = [] {
      pthread_atfork(&fork_registry::prepare, &fork_registry::release, &fork_registry::release);
      return true;
    }();
    (void)installed;
  }
};

pthread_mutex_t fork_registry::mutex = PTHREAD_MUTEX_INITIALIZER;
fork_participant* fork_registry::first = nullptr;

void fork_participant::register_for_fork() noexcept {
  fork_registry::install();
  pthread_mutex_lock(&fork_registry::mutex);
  next_ = fork_registry::first;
  prev_ = nullptr;
  if (next_ != nullptr) next_->prev_ = this;
  fork_registry::first = this;
  pthread_mutex_unlock(&fork_registry::mutex);
}

void fork_participant::unregister_for_fork() noexcept {
  pthread_mutex_lock(&fork_registry::mutex);
  if (prev_ != nullptr) {
    prev_->next_ = next_;
  } else {
    fork_registry::first = next_;
  }
  if (next_ != nullptr) next_->prev_ = prev_;
  prev_ = next_ = nullptr;
  pthread_mutex_unlock(&fork_registry::mutex);
}

}  // namespace internal
}  // namespace percpu
