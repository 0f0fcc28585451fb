// Do not include directly; not a stable API (internal to percpu).
//
// What percpu knows about the architecture it is built for, stated once:
// the dispatchers (thread_pointer.hpp, rseq_cs.hpp) pick their arch files by
// the same test, and code that branches on these facts uses the constants
// rather than testing the compiler's macros again.
#pragma once

// The one spelling of percpu's thread-local state: `__thread T name
// PERCPU_STATIC_TLS`. Static TLS (initial-exec) puts each variable at one
// fixed offset from the thread pointer in every thread, which the fast paths
// rely on and a signal handler may touch; GNU __thread never goes through the
// wrapper call that an extern thread_local may need in other units.
#define PERCPU_STATIC_TLS __attribute__((tls_model("initial-exec")))

// libpercpu.so exports only what the public headers need (docs/abi.md): the
// library is compiled with -fvisibility=hidden, each public header wraps its
// declarations in `#pragma GCC visibility push(default)`, and the few
// internal declarations that the headers' inline code calls or reads (the
// fast paths' slow halves and globals, listed in abi/internal-exports.txt)
// say so with PERCPU_EXPORT. Those stay exported deliberately: a program
// inlines the fast path and must reach them in the library.
#define PERCPU_EXPORT __attribute__((visibility("default")))
// The opposite, for a public class's private helper that only the library's
// own code calls: not exported, so it may change without an ABI change.
#define PERCPU_LOCAL __attribute__((visibility("hidden")))

namespace percpu {
namespace internal {

#if defined(__x86_64__) || defined(__aarch64__)
// percpu knows this architecture's rseq signature and has its critical
// sections written out; it registers rseq and runs sections here.
constexpr bool kArchHasRseq = true;
#else
// No signature and no sections: percpu never registers rseq, and every query
// takes the fallback (vDSO or system call).
constexpr bool kArchHasRseq = false;
#endif

// The structures' rseq sections exist exactly where percpu registers rseq:
// one fact, under the name the structures use.
constexpr bool kHaveRseqSections = kArchHasRseq;

#if defined(__x86_64__)
// The RDPID instruction, for the inline RDPID fallback.
constexpr bool kArchHasRdpid = true;
#else
constexpr bool kArchHasRdpid = false;
#endif

}  // namespace internal
}  // namespace percpu
