// Process-wide rseq state behind percpu/cpu.hpp, and the seams tests use.
//
// Thread-safe and async-signal-safe throughout, except force_backend(), which
// is a test seam: call it while no other thread uses percpu.
#pragma once

#include <atomic>

#include "percpu/cpu.hpp"
#include "percpu/internal/rseq_abi.hpp"

namespace percpu {
namespace internal {

// Runs percpu's start-up if its constructor has not run yet (code that runs
// before it: other libraries' constructors, an allocator called during
// start-up). False only while another caller is in the middle of it; the
// caller then answers from the system call. The inline fast paths need no
// check of their own: until start-up ends their bounds reject every load
// (see fast_path_offsets), which sends them to slow paths that call this.
constexpr int kInitNotStarted = 0, kInitRunning = 1, kInitDone = 2;
extern std::atomic<int> g_init_state;
bool initialize_now() noexcept;
inline bool ensure_initialized() noexcept {
  if (__builtin_expect(g_init_state.load(std::memory_order_acquire) == kInitDone, 1)) return true;
  return initialize_now();
}

// The calling thread's serving rseq area if the kernel keeps it current (the
// thread is registered, by glibc or by percpu), registering it first if due;
// nullptr when this thread runs on a fallback. Critical sections use it.
rseq_area* registered_rseq_area() noexcept;

// The area the fast path of the calling thread reads, registered or not.
// Before start-up this is the thread control block: only use it after
// rseq_area_for_sections() or a bound check has accepted the thread's id.
inline rseq_area* serving_rseq_area() noexcept {
  return reinterpret_cast<rseq_area*>(thread_pointer() + g_fast_path.area);
}

// The calling thread's section-user state (see slot_lock.hpp), in static TLS
// beside percpu's rseq area. Inline code reads it through
// g_fast_path.section_state and a fresh thread pointer, never through the
// compiler's TLS access, which may keep a thread's address across a
// coroutine's suspension.
// no_rseq: the thread asked for its area after start-up and has none, so
// section_area() answers nullptr inline without asking again; consulted only
// while the thread's area shows no CPU (a thread that gets rseq later is
// marked as usual).
enum class section_user : int { unmarked = 0, marked = 1, forced_locked = 2, no_rseq = 3 };
extern __thread section_user t_section_state __attribute__((tls_model("initial-exec")));

// Test seam: serve every thread from `backend` from now on. For rseq this
// restores the natural registration; for a fallback, the fast path is sent to
// a never-registered area. Returns false (and changes nothing) when
// `backend` is unavailable in this process.
bool force_backend(cpu_backend backend) noexcept;

// The fallback query behind cpu_id() when rseq is unavailable: the chosen
// fallback, then the system call. 0 or an errno value.
int query_fallback(unsigned* cpu, unsigned* node) noexcept;

// Why rseq is unavailable to the calling thread (an errno value), or 0.
int rseq_registration_error() noexcept;

// True in secure-execution mode (AT_SECURE: set-user-ID, set-group-ID or
// file-capability programs). percpu then ignores every PERCPU_* variable.
bool secure_execution() noexcept;

// One more than the highest CPU id in a kernel CPU list such as "0-3,8-11\n"
// (the format of /sys/devices/system/cpu/possible), or 0 when `text` is not
// such a list.
int cpu_list_bound(const char* text) noexcept;

// The number of bits in the kernel's cpumask (a bound on every CPU id it can
// report), from the raw sched_getaffinity system call; 0 if it fails.
int kernel_cpumask_bits() noexcept;

}  // namespace internal
}  // namespace percpu
