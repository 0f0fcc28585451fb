// libpercpu_getcpu.so: sched_getcpu() and getcpu() answered by percpu, for
// programs that cannot be rebuilt.
//
//   LD_PRELOAD=/usr/local/lib/libpercpu_getcpu.so program args...
//
// What it is for
//   glibc reads the CPU number from rseq only from 2.35 on, and only when its
//   own registration succeeded. Under an older glibc (or with
//   GLIBC_TUNABLES=glibc.pthread.rseq=0) every sched_getcpu() is a vDSO call,
//   and on arm64, which has no vDSO getcpu, a system call. Preloaded, this
//   library answers the program's (and its libraries', e.g. jemalloc's
//   percpu_arena) calls from the rseq area percpu/cpu.hpp serves: glibc's
//   where glibc registered one, percpu's own otherwise, registered lazily on
//   a thread's first call, and percpu's fallback where rseq cannot be had.
//
// Contract: the same as glibc's functions.
//   sched_getcpu() returns the current CPU, or -1 with errno set when no
//   source at all can tell. getcpu(cpu, node) fills whichever pointers are
//   non-null and returns 0, or returns -1 with errno set. errno is untouched
//   on success. Both are thread-safe and async-signal-safe, work in threads
//   that existed before the first call and in forked children, and a program
//   that never calls them never gets an rseq registration from this library.
//   A getcpu() that asks for the node is answered by percpu's fallback (one
//   query that reports CPU and node together), because two loads from the
//   rseq area could straddle a migration and pair a CPU with another CPU's
//   node. Pointers are written directly, as glibc's vDSO path does, so an
//   invalid pointer faults instead of returning EFAULT.
//
// Only these two symbols are exported (getcpu_preload.map), and _exit and
// _Exit, which write the trace line (below) and then call glibc's; percpu's
// own symbols stay local, so a program linking percpu keeps its own copy.
//
// Observability
//   PERCPU_PRELOAD_TRACE=/path makes the library count its calls and, when
//   the process ends by exit(), by returning from main, or by _exit() or
//   _Exit() called by the program (a forked child's usual way out), append
//   one line to that file, once per process:
//     percpu_getcpu pid=P sched_getcpu=N sched_getcpu_rseq=R getcpu=M
//       getcpu_rseq=Q glibc_rseq=0|1 fallback=NAME
//   where the *_rseq counts are the calls answered from an rseq area and
//   glibc_rseq tells whether that area was glibc's. A process that made no
//   call writes no line. Forked children inherit the counts of their parent
//   at the fork. Calls made before this library's constructors ran are not
//   counted, nor are those of a process that ends otherwise: killed by a
//   signal, or replaced by exec*() (the new program's calls get a line of
//   their own under the same pid). The file is opened without
//   following a symbolic link in its last component. In a set-user-ID (or
//   otherwise AT_SECURE) program every PERCPU_* variable is ignored: the
//   environment is the less privileged user's, and the file would be written
//   with the program's privileges. Untraced calls pay nothing
//   for the feature: the one check they make, that percpu is ready, is
//   needed anyway.
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/nocancel.hpp"
#include "percpu/internal/environment.hpp"
#include "percpu/internal/registration.hpp"
#include "percpu/percpu.h"

// Tells percpu's objects that this library uses no per-CPU structure, so
// they register nothing with the kernel at load (see cpu_slots.cpp). Local to
// this object through getcpu_preload.map.
extern "C" const char percpu_internal_no_fences_at_load = 1;

// Declared here too, for glibc headers older than the getcpu() wrapper.
extern "C" int getcpu(unsigned int* cpu, unsigned int* node) noexcept;

namespace {

struct call_counts {
  std::atomic<unsigned long> sched_getcpu{0};
  std::atomic<unsigned long> sched_getcpu_rseq{0};
  std::atomic<unsigned long> getcpu{0};
  std::atomic<unsigned long> getcpu_rseq{0};
};

// Allocators call sched_getcpu() before this library's constructors have run
// (jemalloc's percpu_arena does, from malloc's first call). percpu's fast
// path is safe then (it rejects every load until start-up), but the trace
// settings are not known yet: until `g_mode` says ready, calls go to the slow
// path and are answered without being counted. g_mode is published with
// release order after g_trace_path is written and read with acquire order,
// so whoever sees kReadyTracing sees the path.
enum mode : unsigned char { kNotReady, kReady, kReadyTracing };
std::atomic<unsigned char> g_mode{kNotReady};
char g_trace_path[1024];
call_counts g_counts;
// Taken by the constructor, so that writing the line needs no dlsym (the
// line may be written from _exit() in a signal handler).
int g_glibc_rseq = 0;
// The process that wrote its line last: a process writes once, whether it
// leaves through exit() (the destructor) or _exit() (or both, when an atexit
// handler calls _exit()). A forked child has another pid, so it writes its own.
std::atomic<pid_t> g_written_by{0};
// glibc's _exit and _Exit (or whatever comes next in the lookup order), found
// by the constructor; nullptr before it, when the system call stands in.
using exit_function = void (*)(int);
exit_function g_next_exit = nullptr;
exit_function g_next_Exit = nullptr;

// Negative means "not served by rseq".
inline int rseq_cpu() noexcept { return percpu::internal::rseq_cpu_id_or_negative(); }

inline bool fast_path_ready() noexcept { return g_mode.load(std::memory_order_acquire) == kReady; }

// Lock-free atomics, so counting is async-signal-safe too.
void count(std::atomic<unsigned long>& calls, std::atomic<unsigned long>& rseq_calls,
           bool from_rseq) noexcept {
  calls.fetch_add(1, std::memory_order_relaxed);
  if (from_rseq) rseq_calls.fetch_add(1, std::memory_order_relaxed);
}

// Everything but the untraced rseq hit: before percpu is ready, the system
// call; after, percpu_sched_getcpu(), which registers this thread's area if
// that is percpu's job and otherwise asks the fallback. Sets errno only when
// it returns -1.
__attribute__((noinline)) int current_cpu_slow(std::atomic<unsigned long>& calls,
                                               std::atomic<unsigned long>& rseq_calls) noexcept {
  const unsigned char mode = g_mode.load(std::memory_order_acquire);
  int id = -1;
  bool from_rseq = false;
  if (mode == kNotReady) {
    unsigned cpu = 0;
    const int error = percpu::internal::raw_syscall_getcpu(&cpu, nullptr);
    if (error != 0) {
      errno = error;
    } else {
      id = static_cast<int>(cpu);
    }
  } else {
    id = rseq_cpu();
    from_rseq = id >= 0;
    if (!from_rseq) {
      id = percpu_sched_getcpu();
      from_rseq = rseq_cpu() >= 0;
    }
  }
  if (mode == kReadyTracing) count(calls, rseq_calls, from_rseq);
  return id;
}

// Priority 102: runs right after percpu's own constructor (101) in this
// object, and before this object's ordinary constructors.
__attribute__((constructor(102))) void become_ready() {
  const char* path =
      percpu::internal::secure_execution() ? nullptr : std::getenv("PERCPU_PRELOAD_TRACE");
  unsigned char mode = kReady;
  if (path != nullptr && *path != '\0') {
    if (std::strlen(path) < sizeof(g_trace_path)) {
      std::strcpy(g_trace_path, path);
      mode = kReadyTracing;
    } else {
      percpu::internal::nocancel_write_string(
          STDERR_FILENO, "percpu_getcpu: PERCPU_PRELOAD_TRACE is too long a path; not tracing\n");
    }
  }
  g_next_exit = reinterpret_cast<exit_function>(dlsym(RTLD_NEXT, "_exit"));
  g_next_Exit = reinterpret_cast<exit_function>(dlsym(RTLD_NEXT, "_Exit"));
  g_glibc_rseq = percpu::internal::glibc_registered_rseq(nullptr) ? 1 : 0;
  g_mode.store(mode, std::memory_order_release);
}

// The trace line, formatted by hand: snprintf is not async-signal-safe, and
// _exit() may be called from a signal handler or a vfork()ed child.
struct line_buffer {
  char text[256];
  std::size_t size = 0;
  void add(const char* s) noexcept {
    for (; *s != '\0' && size < sizeof(text); ++s) text[size++] = *s;
  }
  void add(unsigned long value) noexcept {
    char digits[24];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    while (n > 0 && size < sizeof(text)) text[size++] = digits[--n];
  }
};

// Appends this process's line, once, if it is traced and made a call.
// Async-signal-safe: atomics, getpid, open, write, close.
void write_trace() noexcept {
  if (g_mode.load(std::memory_order_acquire) != kReadyTracing) return;
  const unsigned long sched_calls = g_counts.sched_getcpu.load();
  const unsigned long getcpu_calls = g_counts.getcpu.load();
  if (sched_calls == 0 && getcpu_calls == 0) return;
  const int saved_errno = errno;
  const pid_t pid = getpid();
  if (g_written_by.exchange(pid) == pid) {
    errno = saved_errno;
    return;
  }
  line_buffer line;
  line.add("percpu_getcpu pid=");
  line.add(static_cast<unsigned long>(pid));
  line.add(" sched_getcpu=");
  line.add(sched_calls);
  line.add(" sched_getcpu_rseq=");
  line.add(g_counts.sched_getcpu_rseq.load());
  line.add(" getcpu=");
  line.add(getcpu_calls);
  line.add(" getcpu_rseq=");
  line.add(g_counts.getcpu_rseq.load());
  line.add(" glibc_rseq=");
  line.add(static_cast<unsigned long>(g_glibc_rseq));
  line.add(" fallback=");
  line.add(percpu::to_string(percpu::fallback_backend()));
  line.add("\n");
  // O_APPEND keeps the lines of a parent and its children whole; O_NOFOLLOW
  // refuses a symbolic link planted at the path.
  // The raw system calls: this runs at exit, in _exit() and in destructors,
  // none of which may be a cancellation point.
  const int fd = percpu::internal::nocancel_open(
      g_trace_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd >= 0) {
    percpu::internal::nocancel_write(fd, line.text, line.size);
    percpu::internal::nocancel_close(fd);
  }
  errno = saved_errno;
}

__attribute__((destructor)) void write_trace_at_exit() { write_trace(); }

[[noreturn]] void leave(exit_function next, int status) noexcept {
  write_trace();
  if (next != nullptr) next(status);
  for (;;) syscall(SYS_exit_group, status);
}

}  // namespace

// The program's own _exit() and _Exit() (glibc's exit() reaches the kernel
// without them, after the destructor above has run).
extern "C" void _exit(int status) { leave(g_next_exit, status); }

extern "C" void _Exit(int status) noexcept { leave(g_next_Exit, status); }

extern "C" int sched_getcpu() noexcept {
  if (__builtin_expect(fast_path_ready(), 1)) {
    const int id = rseq_cpu();
    if (__builtin_expect(id >= 0, 1)) return id;
  }
  return current_cpu_slow(g_counts.sched_getcpu, g_counts.sched_getcpu_rseq);
}

extern "C" int getcpu(unsigned int* cpu, unsigned int* node) noexcept {
  if (node == nullptr) {
    int id = fast_path_ready() ? rseq_cpu() : -1;
    if (__builtin_expect(id < 0, 0)) {
      id = current_cpu_slow(g_counts.getcpu, g_counts.getcpu_rseq);
      if (id < 0) return -1;
    }
    if (cpu != nullptr) *cpu = static_cast<unsigned>(id);
    return 0;
  }
  unsigned found_cpu = 0, found_node = 0;
  const unsigned char mode = g_mode.load(std::memory_order_acquire);
  const int error = mode == kNotReady
                        ? percpu::internal::raw_syscall_getcpu(&found_cpu, &found_node)
                        : percpu::internal::query_fallback(&found_cpu, &found_node);
  if (mode == kReadyTracing) count(g_counts.getcpu, g_counts.getcpu_rseq, false);
  if (error != 0) {
    errno = error;
    return -1;
  }
  if (cpu != nullptr) *cpu = found_cpu;
  *node = found_node;
  return 0;
}
