/* percpu/percpu.h: the current CPU for C programs (and C++ ones that want a
 * plain function).
 *
 * What it is for: the same answers as percpu/cpu.hpp from C. Each call is an
 * out-of-line function (a call plus one load when rseq is there); C++ code
 * should prefer the inline percpu::cpu_id().
 * When not to use it: as proof of ownership. The thread may move right after
 * the call; use the id for sharding only.
 * Without rseq: the process's fallback answers (RDPID, vDSO or syscall); see
 * percpu/cpu.hpp. percpu_backend_name(), percpu_rseq_owner_name() and
 * percpu_sections_status() say which mode the calling thread got, and whether
 * the per-CPU structures run rseq critical sections for it.
 * Thread safety: all functions are thread-safe and async-signal-safe. Only
 * percpu_sched_getcpu() may change errno, and only when it returns -1.
 */
#ifndef PERCPU_PERCPU_H_
#define PERCPU_PERCPU_H_

#include "percpu/version.h"

#ifdef __cplusplus
extern "C" {
#endif
/* Exported from libpercpu.so, new declarations included (docs/abi.md). */
#pragma GCC visibility push(default)

/* The CPU the calling thread runs on, in [0, percpu_max_cpus()). */
int percpu_cpu_id(void);

/* The NUMA node of that CPU. */
int percpu_node_id(void);

/* rseq mm_cid where the kernel provides it, else percpu_cpu_id(). */
int percpu_concurrency_id(void);

/* The number of possible CPU ids; size per-CPU arrays by it. */
int percpu_max_cpus(void);

/* sched_getcpu() semantics: the current CPU, or -1 with errno set when no
 * source at all can tell (every one of rseq, vDSO and the getcpu system call
 * is unavailable). */
int percpu_sched_getcpu(void);

/* "rseq", "rdpid", "vdso" or "syscall": what serves the calling thread. */
const char* percpu_backend_name(void);

/* "none", "glibc", "percpu" or "other": who registers rseq areas in this
 * process, as seen from the calling thread (percpu::rseq_ownership()). */
const char* percpu_rseq_owner_name(void);

/* Whether the per-CPU structures run rseq critical sections for the calling
 * thread, and why not when they do not: the values and meanings of
 * percpu::sections in percpu/cpu.hpp, in the same order. */
enum percpu_sections {
  PERCPU_SECTIONS_ON = 0,
  PERCPU_SECTIONS_NO_RSEQ = 1,
  PERCPU_SECTIONS_FOREIGN_SIGNATURE = 2,
  PERCPU_SECTIONS_KERNEL_QUIRK = 3,
  PERCPU_SECTIONS_DISABLED_BY_ENVIRONMENT = 4,
  PERCPU_SECTIONS_UNSUPPORTED_ARCH = 5,
  PERCPU_SECTIONS_FALLBACK_FORCED = 6,
  PERCPU_SECTIONS_STARTING = 7
};
enum percpu_sections percpu_sections_status(void);

/* "on", "no_rseq", "foreign_signature", "kernel_quirk",
 * "disabled_by_environment", "unsupported_arch", "fallback_forced" or
 * "starting"; "unknown" for any other value. */
const char* percpu_sections_name(enum percpu_sections status);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif

#endif /* PERCPU_PERCPU_H_ */
