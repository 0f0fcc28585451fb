// The library halves of the TSan annotations (see sanitizers.hpp).
#include "percpu/internal/sanitizers.hpp"

// Weak: defined by TSan's runtime when the program is built with
// -fsanitize=thread (clang links it into the executable and exports it, gcc
// links libtsan.so), null otherwise, whatever this file was built with.
extern "C" {
void __tsan_acquire(void* address) __attribute__((weak));
void __tsan_release(void* address) __attribute__((weak));
}

namespace percpu {
namespace internal {

bool tsan_present() noexcept { return &__tsan_acquire != nullptr && &__tsan_release != nullptr; }

void tsan_acquire(const void* address) noexcept {
  if (&__tsan_acquire != nullptr) __tsan_acquire(const_cast<void*>(address));
}

void tsan_release(const void* address) noexcept {
  if (&__tsan_release != nullptr) __tsan_release(const_cast<void*>(address));
}

}  // namespace internal
}  // namespace percpu
