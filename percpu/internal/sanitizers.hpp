// Do not include directly; not a stable API (internal to percpu).
//
// ThreadSanitizer annotations that hold whatever the library was built with.
// TSan cannot see the happens-before edges percpu's structures make: an
// rseq section is inline asm, a membarrier fence is a system call, and in a
// user's TSan build against the ordinary (uninstrumented) library every
// atomic inside the library is invisible too. So each edge is stated to TSan
// in two halves, acquire where an operation takes something over and release
// where it hands something on:
//   - inline halves, in the headers: PERCPU_TSAN_ACQUIRE / PERCPU_TSAN_RELEASE
//     compile into the caller's code, so they call TSan's interface exactly
//     when the caller is built with -fsanitize=thread, and are nothing
//     otherwise;
//   - library halves, in percpu's .cpp files: tsan_acquire() / tsan_release()
//     call TSan's runtime through weak references, which resolve when the
//     program is built with -fsanitize=thread, however the library was
//     built. Without TSan each costs one test of a symbol's address; they sit
//     only on slow paths (a writer's lock and unlock, take_all, a ref's
//     release).
// The sync addresses are each structure's own (see the callers); an address
// that only releasers release and only acquirers acquire keeps TSan's view
// no stronger than percpu's promise.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define PERCPU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PERCPU_TSAN 1
#endif
#endif

#if defined(PERCPU_TSAN)
#include <sanitizer/tsan_interface.h>
#define PERCPU_TSAN_ACQUIRE(address) \
  __tsan_acquire(const_cast<void*>(static_cast<const void*>(address)))
#define PERCPU_TSAN_RELEASE(address) \
  __tsan_release(const_cast<void*>(static_cast<const void*>(address)))
// Marks a function whose plain loads TSan must not see (a speculative read
// that a critical section re-checks).
#define PERCPU_TSAN_UNSEEN __attribute__((no_sanitize("thread"), noinline))
#else
#define PERCPU_TSAN_ACQUIRE(address) ((void)0)
#define PERCPU_TSAN_RELEASE(address) ((void)0)
#define PERCPU_TSAN_UNSEEN
#endif

namespace percpu {
namespace internal {

// True when the program runs under TSan (its runtime is linked in).
[[nodiscard]] bool tsan_present() noexcept;
// The library halves: TSan's __tsan_acquire / __tsan_release when the
// program has TSan's runtime, nothing otherwise.
void tsan_acquire(const void* address) noexcept;
void tsan_release(const void* address) noexcept;

}  // namespace internal
}  // namespace percpu
