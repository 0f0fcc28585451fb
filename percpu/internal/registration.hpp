// Do not include directly; not a stable API (internal to percpu).
//
// Process-wide rseq state behind percpu/cpu.hpp, and the seams tests use:
// start-up, who serves cpu_id(), the registration of each thread, and the
// slow paths behind the inline fast paths (registration.cpp).
//
// Thread-safe and async-signal-safe throughout, except force_backend(), which
// is a test seam: call it while no other thread uses percpu.
#pragma once

#include <atomic>
#include <cstdint>

#include "percpu/cpu.hpp"
#include "percpu/internal/config.hpp"
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
extern PERCPU_EXPORT std::atomic<int> g_init_state;
[[nodiscard]] PERCPU_EXPORT bool initialize_now() noexcept;
[[nodiscard]] inline bool ensure_initialized() noexcept {
  if (__builtin_expect(g_init_state.load(std::memory_order_acquire) == kInitDone, 1)) return true;
  return initialize_now();
}

// The calling thread's rseq area for critical sections if the kernel keeps it
// current (the thread is registered, by glibc, by percpu, or by another
// library whose area percpu shares and whose signature is percpu's),
// registering it first if due; nullptr when this thread must use the
// structures' no-rseq paths: no rseq, a foreign area registered with another
// signature, or sections turned off (rseq_sections_enabled()).
[[nodiscard]] PERCPU_EXPORT rseq_area* registered_rseq_area() noexcept;

// Keeps the loaded object (shared library or plugin) that holds `address`
// loaded for the rest of the process: dlclose no longer unloads it. The
// kernel keeps using what an object's critical sections hand it (the
// descriptor a thread's rseq_cs points at until the kernel next clears it,
// and the section's code), so every object holding sections must stay; the
// header with the sections (rseq_cs.hpp) calls this from a constructor in
// every translation unit that includes it, and libpercpu's constructor for
// the object holding the library (its TLS areas). Nothing for the main
// program or an address no loaded object holds; a few compares for the main
// program and the object pinned last once either is known (a walk over the
// loaded objects' program headers the first time). Touches no state of
// percpu's start-up, so it may run before percpu's constructor. Preserves
// errno; no cancellation point. Not async-signal-safe (dl_iterate_phdr,
// dlopen): for constructors.
PERCPU_EXPORT void pin_object_containing(const void* address) noexcept;

// Whether the per-CPU structures run rseq critical sections in this process.
// False on arm64 kernels that do not abort a section preempted and resumed on
// the same CPU (rseq_sections_broken_on()), and under
// PERCPU_RSEQ_SECTIONS=off; PERCPU_RSEQ_SECTIONS=on overrides the kernel
// check. cpu_id() reads rseq either way.
bool rseq_sections_enabled() noexcept;

// The decision behind rseq_sections_enabled(), for a kernel's uname machine
// and release: true for arm64 releases 6.19.x, 7.0.x before 7.0.14 and 7.1
// release candidates, which lose the abort on same-CPU preemption.
bool rseq_sections_broken_on(const char* machine, const char* release) noexcept;

// Start-up's process-wide decision, for PERCPU_RSEQ_SECTIONS's value (nullptr
// when unset; neither on nor off counts as unset) and a kernel's uname
// machine and release (nullptr when unknown): on, disabled_by_environment or
// kernel_quirk. sections_status() reports what start-up got from it here
// (on an architecture with sections), before the thread's own reasons.
sections sections_decision_for(const char* forced, const char* machine,
                               const char* release) noexcept;

// The length percpu registers its own area with, given AT_RSEQ_FEATURE_SIZE
// and AT_RSEQ_ALIGN (0 when absent): max(feature size, 32) as glibc 2.41+
// does, which on Linux 7.0+ selects the strict V2 mode; 32 when own_rseq_area
// cannot hold that length or meet that alignment.
unsigned own_registration_length_for(unsigned long feature_size, unsigned long align) noexcept;

// The length the calling thread's serving area is registered with (asked of
// the kernel for glibc's), or 0 when the thread has none. More than 32 is
// the V2 mode on Linux 7.0+; 32 the legacy mode.
unsigned rseq_registration_length() noexcept;

// The area the fast path of the calling thread reads, registered or not.
// Before start-up this is the thread control block: only use it after
// rseq_area_for_sections() or a bound check has accepted the thread's id.
inline rseq_area* serving_rseq_area() noexcept {
  return reinterpret_cast<rseq_area*>(thread_pointer() + g_fast_path.area);
}

// The area the structures' sections arm (fast_path_offsets::sections_area)
// when the calling thread may run sections on it now, that is when the
// area's cpu_id is an id (not negative); nullptr before start-up, where the
// structures run no sections in this process, and for a thread whose area
// is not registered (yet). Callers then ask registered_rseq_area(), which
// registers the thread if that is due. The offset is read with acquire
// order and start-up stores it last with release order, so a thread that
// runs this while another thread's start-up is in progress (threads started
// by an earlier constructor) sees either the unregistered area or an area
// start-up finished aiming. On x86-64 that is the plain load it would be
// anyway.
inline rseq_area* sections_area_if_registered() noexcept {
  if (!kHaveRseqSections) return nullptr;
  auto* area = reinterpret_cast<rseq_area*>(
      thread_pointer() + __atomic_load_n(&g_fast_path.sections_area, __ATOMIC_ACQUIRE));
  const int id = *reinterpret_cast<volatile const std::int32_t*>(&area->cpu_id);
  return __builtin_expect(id >= 0, 1) ? area : nullptr;
}

// The calling thread's section-user state (see cpu_slots.hpp), in static TLS
// beside percpu's rseq area. Inline code reads it through
// g_fast_path.section_state and a fresh thread pointer, never through the
// compiler's TLS access, which may keep a thread's address across a
// coroutine's suspension.
// no_rseq: the thread asked for its area after start-up and has none, so
// section_area() answers nullptr inline without asking again; consulted only
// while the thread's area shows no CPU (a thread that gets rseq later is
// marked as usual).
enum class section_user : int { unmarked = 0, marked = 1, forced_locked = 2, no_rseq = 3 };
extern __thread section_user t_section_state PERCPU_STATIC_TLS;

// The section users count, the process's side of the Dekker between owner
// sections and the lockers of a CPU slot (cpu_slots.hpp, "Section users"):
// above zero from before any section can commit in this process until the
// process ends. Each reason a section may commit adds one before it can:
//   - start-up, once, before it aims the sections' area at an area every
//     thread has registered (glibc's, or another library's that percpu
//     serves): aim_sections() in registration.cpp;
//   - a thread's own registration, before its system call, taken back if
//     the call fails (a failed thread's area never shows a CPU, so its
//     sections abort): register_this_thread();
//   - a thread's first section through section_area() (mark_section_user()
//     in cpu_slots.cpp), which covers areas the two above do not.
// Every addition is followed by a sequentially consistent fence. A locker
// that reads zero after its exchange therefore knows that no thread's
// registration or mark can have preceded it, and so no section can commit
// without reading the locked head. Overcounting is harmless (a fence too
// many); a take-back only follows its own addition, so the count never
// reads zero while a kept addition precedes the read. Atomics only.
extern int g_section_users;
inline void add_section_users(int delta) noexcept {
  __atomic_fetch_add(&g_section_users, delta, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

// Test seam (force_locked_path_for_this_thread() in cpu_slots.hpp): makes
// every section of the calling thread abort by unregistering the area the
// kernel keeps for it, whoever registered it, and restores that
// registration. While paused the thread is one without rseq to every part of
// percpu (cpu_id() answers from the fallback); other threads keep theirs.
// pause answers whether the thread's sections now abort (true too when it had
// no registration). Not async-signal-safe; call resume on the thread that
// paused.
bool pause_rseq_for_this_thread() noexcept;
void resume_rseq_for_this_thread() noexcept;

// rseq_area_for_sections(), except that a thread already known to have no
// rseq (section_user::no_rseq, which cpu_slots.cpp sets and which this sets
// too, once start-up is over) is answered without the call that asks about
// its registration: that call was most of the cost of an update without
// rseq. For the slow paths of counter and per_cpu.
rseq_area* area_unless_known_missing() noexcept;

// Test seam: serve every thread from `backend` from now on. For rseq this
// restores the natural registration; for a fallback, the fast path is sent to
// a never-registered area. Returns false (and changes nothing) when
// `backend` is unavailable in this process.
bool force_backend(cpu_backend backend) noexcept;

// The fallback query behind cpu_id() when rseq is unavailable: the chosen
// fallback, then the system call. 0 or an errno value.
[[nodiscard]] int query_fallback(unsigned* cpu, unsigned* node) noexcept;

// Why rseq is unavailable to the calling thread (an errno value), or 0.
int rseq_registration_error() noexcept;

// Whether glibc registered rseq for its threads (__rseq_size is non-zero),
// and then, for each of `area` and `size` that is not nullptr, the offset of
// glibc's area from the thread pointer (__rseq_offset) and __rseq_size. Both symbols are looked up
// with dlsym in dynamic programs (so nothing needs GLIBC_2.35), through weak references in static
// ones. The one answer to that question in percpu and its preload.
[[nodiscard]] bool glibc_registered_rseq(std::intptr_t* area, unsigned* size = nullptr) noexcept;

}  // namespace internal
}  // namespace percpu
