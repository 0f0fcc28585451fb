// percpu/cpu.hpp: which CPU is this thread on, in one load.
//
// What it is for
//   Sharding by CPU: picking a per-CPU slot, arena, lock stripe or queue.
//   percpu::cpu_id() reads the CPU number the kernel keeps in the thread's
//   rseq area (restartable sequences), so the hot path is a single load
//   relative to the thread pointer, inlined into the caller. No set-up call
//   is needed, in any thread of any program.
//
// When not to use it
//   A CPU id read outside a critical section is a hint: the thread may move
//   to another CPU right after the load. Use it to spread work, never to prove
//   ownership. For data that must be updated only by its CPU, use the per-CPU
//   structures (percpu/counter.hpp and friends), whose critical sections
//   re-check the CPU at commit time.
//
// Where the answer comes from
//   1. rseq. If glibc (2.35+) registered the thread, percpu reads glibc's
//      area (found through __rseq_offset, looked up at run time). If nobody
//      did (older glibc, GLIBC_TUNABLES=glibc.pthread.rseq=0), percpu
//      registers an area of its own, lazily, on the thread's first call.
//   2. Without rseq (old kernel, seccomp, valgrind, qemu-user), one fallback
//      chosen once per process, fastest correct first: RDPID (x86-64, when
//      CPUID has it and it agrees with getcpu), the vDSO getcpu (when it
//      agrees), then the getcpu system call. An agreement on CPU 0 is
//      checked again on another allowed CPU, the thread moved there for the
//      while and then given its mask back: qemu-user's vDSO getcpu answers
//      0 on every CPU.
//   PERCPU_BACKEND=rseq|rdpid|vdso|syscall in the environment forces one; an
//   unavailable choice prints one line on stderr and falls to the next.
//   Nothing here aborts. If even the system call fails, cpu_id() returns 0,
//   which is still a valid index (percpu_sched_getcpu() reports -1 instead).
//
// Is the per-CPU mode on?
//   backend() and rseq_ownership() say where cpu_id() reads; sections_status()
//   says whether the per-CPU structures run rseq critical sections for the
//   calling thread, and why not when they do not (no rseq, another library's
//   signature, an affected arm64 kernel, PERCPU_RSEQ_SECTIONS=off...). It is
//   what the structures themselves act on. percpu-bench prints it.
//
// Thread safety and signals
//   Every function here is thread-safe and async-signal-safe, works in a
//   forked child, and none of them changes errno. They work from the first
//   constructor of the process on, before percpu's own (a priority-101
//   constructor) and in a malloc replacement called during start-up: until
//   start-up has run, the inline paths reject what they load and the slow
//   path runs start-up first. Every id is in range from the first call.
//   The thread pointer is read afresh at each call, so a coroutine or fiber
//   resumed on another thread gets that thread's answer. Nothing in percpu
//   is a POSIX cancellation point: its system calls go through syscall(),
//   never through glibc's cancellable wrappers (nanosleep, open, read,
//   write, close), so a pending deferred pthread_cancel() never acts inside
//   one of its functions.
//
// Where percpu cannot answer for the caller
//   A vfork() child, or a thread made with a raw clone(CLONE_VM) that shares
//   its parent's TLS, has no rseq registration of its own but reads its
//   parent's area: cpu_id() there is the parent's last CPU, and the per-CPU
//   structures must not be used. POSIX allows such a child only exec and
//   _exit anyway; threads made with pthread_create (or clone with CLONE_SETTLS
//   and a TLS block of their own) are fine.
//   Static TLS: percpu's TLS is initial-exec. A shared percpu loaded with
//   dlopen needs room in the static TLS surplus (glibc reserves it; see
//   glibc.rtld.optional_static_tls), and its object stays loaded for the
//   rest of the process: the kernel keeps using the rseq areas and
//   critical-section descriptors it holds, so percpu pins it against
//   dlclose, whether it is libpercpu.so or a plugin that linked libpercpu.a.
#pragma once

#include <cstdint>

#include "percpu/internal/thread_pointer.hpp"
#include "percpu/version.h"

// Everything declared from here to the matching pop is libpercpu.so's
// exported interface, new declarations included (see PERCPU_EXPORT in
// percpu/internal/config.hpp and docs/abi.md).
#pragma GCC visibility push(default)
namespace percpu {

// Which mechanism answers cpu_id() for the calling thread.
enum class cpu_backend { rseq, rdpid, vdso, syscall };
const char* to_string(cpu_backend backend) noexcept;

// Who registered the rseq areas of this process.
enum class rseq_owner {
  none,    // nobody: rseq is unavailable or a non-rseq backend is forced
  glibc,   // glibc 2.35+ registers every thread; percpu reads its area
  percpu,  // percpu registers each thread's area on first use
  other,   // another library (librseq, tcmalloc...) registered this thread
           // first; percpu reads its area, and runs sections on it when it
           // was registered with the common signature. Where the library
           // publishes librseq's rseq_offset, cpu_id() reads the area inline
           // (and sections run inline with the common signature); threads
           // that library left alone get percpu's own registration, answered
           // out of line.
};
const char* to_string(rseq_owner owner) noexcept;

// The CPU the calling thread runs on, as of the call. In [0, max_cpus()).
int cpu_id() noexcept;

// The NUMA node of that CPU (rseq node_id where the kernel provides it,
// otherwise what getcpu reports).
int node_id() noexcept;

// A dense per-process id (rseq mm_cid, Linux 6.3+) below max_cpus() and below
// the number of threads and allowed CPUs; cpu_id() where mm_cid is missing.
// Prefer it for per-CPU arrays in processes confined to a few CPUs.
int concurrency_id() noexcept;

// What concurrency_id() answers on the calling thread: the kernel's mm_cid
// where the rseq area serving the thread has one (Linux 6.3+, feature size
// at least 28; decided once at start-up for the process), else the CPU id
// (an older kernel, another library's area that says it is shorter, a
// thread without rseq). Registers the thread first if due.
enum class concurrency_source {
  mm_cid,
  cpu_id,
};
concurrency_source concurrency_id_source() noexcept;
// "mm_cid" or "cpu_id".
const char* to_string(concurrency_source source) noexcept;

// The number of possible CPU ids: one more than the highest id in
// /sys/devices/system/cpu/possible (sparse masks handled). Where /sys cannot
// be read (containers, sandboxes), the size of the kernel's cpumask, which
// bounds every id the kernel can report. Every id this header returns is
// below it; size per-CPU arrays by it.
int max_cpus() noexcept;

// The mechanism serving the calling thread (registers rseq first if due).
cpu_backend backend() noexcept;

// Who registers rseq areas in this process, as seen from the calling thread:
// none when this thread cannot have one (its registration failed: a seccomp
// filter of its own, say) even if other threads do.
rseq_owner rseq_ownership() noexcept;
// How many bytes of the rseq area the kernel keeps current (20 before Linux
// 6.3's AT_RSEQ_FEATURE_SIZE), or 0 when rseq is unavailable.
unsigned rseq_feature_size() noexcept;
// The fallback used by threads without rseq.
cpu_backend fallback_backend() noexcept;

// Whether the per-CPU structures (counter, free_list, object_pool, ref,
// shared_mutex) run rseq critical sections for the calling thread, and why
// not when they do not. Without sections they stay correct, on atomics and
// locked slots instead (see each header), and cost more.
enum class sections {
  on,                       // the structures commit with plain stores in sections
  no_rseq,                  // this thread has no rseq registration: the kernel has
                            // none (ENOSYS), seccomp refused it (ENOSYS, EPERM),
                            // valgrind or qemu-user, or another library's area
                            // that percpu cannot find
  foreign_signature,        // another library registered this thread with a
                            // signature that is not percpu's
  kernel_quirk,             // an arm64 kernel that may not abort a section
                            // preempted and resumed on the same CPU (README's
                            // kernel table); PERCPU_RSEQ_SECTIONS=on overrides
  disabled_by_environment,  // PERCPU_RSEQ_SECTIONS=off
  unsupported_arch,         // percpu has no critical sections for this architecture
  fallback_forced,          // PERCPU_BACKEND names a fallback (rdpid, vdso, syscall)
  starting,                 // asked while another call runs percpu's start-up (a
                            // signal handler interrupting it); ask again
};
// "on", "no_rseq", "foreign_signature"...: the enumerator's name.
const char* to_string(sections status) noexcept;

// What the structures decide for the calling thread, registering it first if
// that is due: the answer comes from the code that hands them their rseq area,
// not from a second look at the environment. Where several reasons hold, the
// process-wide ones (architecture, PERCPU_RSEQ_SECTIONS, the kernel) are named
// before the thread's own (a forced fallback, no registration, a foreign
// signature). cpu_id() reads rseq whenever backend() says rseq, sections or not.
sections sections_status() noexcept;

namespace internal {

// Where the inline fast paths look, as offsets from the thread pointer, and
// the bounds that make a loaded value an answer.
//
// The ids (cpu_id, node_id, concurrency_id), where percpu has rseq (x86-64,
// aarch64): every id offset points at a readable 32-bit word of static TLS
// in every thread, at every moment from before the first constructor on, and
// a loaded value is an answer when it is not negative. So the inline path is
// the offset's load, the word's load and a sign test. The words:
//   - before start-up, a per-thread area that is never registered and so
//     holds -1 (the slow path then runs start-up first). These offsets are
//     not constants: the dynamic linker (or, in a static program, the C
//     library's start) writes them while it relocates percpu, before any
//     constructor or other code can run, through the relocation of
//     `before_startup`, an indirect function whose resolver stores them;
//   - after start-up, the serving rseq area, whose ids the kernel keeps
//     below nr_cpu_ids (below max_cpus() where start-up could prove that the
//     bound covers every id the kernel reports; where it could not, the id
//     offsets stay at the unregistered area and every call takes the slow
//     path, which folds ids into range), or -1 before registration and -2
//     after a failed one; or the unregistered area (forced fallbacks).
// A caller racing with start-up on another thread reads either word: -1, or
// an id of its own thread's area. Elsewhere (architectures without rseq) the
// offsets are constant-initialised to 0 and each id is bounded by its limit,
// which is 0 until start-up has written the offsets.
//
// The critical sections arm the area at sections_area, which follows the
// same rule with one more condition: it is the serving area only where the
// structures run sections in this process (sections_status()) and its ids
// need no bound; otherwise, and before start-up, the unregistered area. A
// section indexed by cpu_id_start (which a hot path reads without a test)
// then compares it with the area's cpu_id and commits only when the two are
// equal, so an unregistered area (cpu_id -1 or -2) always aborts: see
// start_section() in internal/rseq_cs.hpp.
//
// The struct is two cache lines (on 64-bit targets); every offset and bound
// the rseq fast paths read is in the first.
struct alignas(64) fast_path_offsets {
  std::intptr_t area;            // the serving struct rseq
  std::intptr_t cpu_id;          // its cpu_id
  std::intptr_t node_id;         // its node_id, or a word that is always -1
  std::intptr_t concurrency_id;  // its mm_cid, or its cpu_id
  std::intptr_t section_state;   // the thread's section-user word (cpu_slots.hpp)
  std::intptr_t sections_area;   // the area sections arm (see above)
  std::uint32_t cpu_limit;       // max_cpus(): bounds cpu_id and concurrency_id
  std::uint32_t node_limit;      // bounds node_id
  // Where percpu has rseq: the address of the indirect function whose
  // relocation aims the id offsets before start-up (see above). Held here
  // so that no linker can drop the relocation while it keeps the offsets.
  void (*before_startup)();
  // True when a rejected cpu_id can be answered by RDPID right away: the
  // fallback is RDPID and no thread has an rseq registration of percpu's
  // still to attempt. Keeps that fallback as cheap as the instruction.
  bool rdpid_inline;
};
static_assert(sizeof(void*) != 8 || sizeof(fast_path_offsets) == 128, "two cache lines");
extern fast_path_offsets g_fast_path;

constexpr unsigned kRdpidCpuMask = 0xfff;  // TSC_AUX = (node << 12) | cpu
constexpr unsigned kRdpidNodeShift = 12;

int cpu_id_slow() noexcept;
int node_id_slow() noexcept;
int concurrency_id_slow() noexcept;

// Whether a fast-path load is an answer: below its bound, compared unsigned,
// so every negative value is rejected too.
inline bool within(int value, std::uint32_t limit) noexcept {
  return static_cast<std::uint32_t>(value) < limit;
}

// Whether an id the inline paths loaded is an answer (see fast_path_offsets):
// not negative where percpu has rseq, below its bound elsewhere (the bound is
// loaded only there).
template <std::uint32_t fast_path_offsets::*Limit>
inline bool id_is_answer(int id) noexcept {
  if constexpr (kArchHasRseq) {
    return id >= 0;
  } else {
    return within(id, g_fast_path.*Limit);
  }
}

// The fast path's rseq cpu_id when it is an answer, or -1: before start-up,
// on threads without a registered area, and for out-of-range words.
inline int rseq_cpu_id_or_negative() noexcept {
  const int id = load_tp_relative_i32(g_fast_path.cpu_id);
  return id_is_answer<&fast_path_offsets::cpu_limit>(id) ? id : -1;
}

}  // namespace internal

// Each fast path is the offset's load, one load relative to the thread
// pointer and a sign test (see fast_path_offsets): the thread pointer is
// read afresh at every call, so a coroutine resumed on another thread reads
// that thread's area.
inline int cpu_id() noexcept {
  const int id = internal::load_tp_relative_i32(internal::g_fast_path.cpu_id);
  if (__builtin_expect(internal::id_is_answer<&internal::fast_path_offsets::cpu_limit>(id), 1)) return id;
  if (internal::kArchHasRdpid && internal::g_fast_path.rdpid_inline) {
    return static_cast<int>(internal::rdpid_tsc_aux() & internal::kRdpidCpuMask);
  }
  return internal::cpu_id_slow();
}

inline int node_id() noexcept {
  const int id = internal::load_tp_relative_i32(internal::g_fast_path.node_id);
  if (__builtin_expect(internal::id_is_answer<&internal::fast_path_offsets::node_limit>(id), 1)) return id;
  return internal::node_id_slow();
}

inline int concurrency_id() noexcept {
  const int id = internal::load_tp_relative_i32(internal::g_fast_path.concurrency_id);
  if (__builtin_expect(internal::id_is_answer<&internal::fast_path_offsets::cpu_limit>(id), 1)) return id;
  return internal::concurrency_id_slow();
}

}  // namespace percpu
#pragma GCC visibility pop
