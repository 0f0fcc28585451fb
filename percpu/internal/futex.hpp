// Do not include directly; not a stable API (internal to percpu).
//
// Futex wait and wake on a 32-bit word, private to the process: how
// percpu::shared_mutex and percpu::ref sleep instead of spinning on a flag
// that a thread they interrupted (a signal handler's case) may own.
//
// Both keep errno. futex_wait returns when the word is not `expected`, when
// woken, on a signal, or after `timeout_ns` (0: no limit); callers re-check
// their condition in a loop, so spurious returns are harmless.
//
// Thread safety: yes. Async-signal-safe: yes (each is one system call).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>

namespace percpu {
namespace internal {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t),
              "a futex is one plain 32-bit word");

inline void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                       long timeout_ns = 0) noexcept {
  const int saved_errno = errno;
  struct timespec limit = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
          timeout_ns > 0 ? &limit : nullptr, nullptr, 0);
  errno = saved_errno;
}

inline void futex_wake(std::atomic<std::uint32_t>* word, int count) noexcept {
  const int saved_errno = errno;
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr,
          nullptr, 0);
  errno = saved_errno;
}

inline void futex_wake_all(std::atomic<std::uint32_t>* word) noexcept { futex_wake(word, INT_MAX); }

}  // namespace internal
}  // namespace percpu
