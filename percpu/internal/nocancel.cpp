// System calls that are not cancellation points
// (percpu/internal/nocancel.hpp).

#include "percpu/internal/nocancel.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

// MemorySanitizer intercepts glibc's read(), not the raw system call: a
// buffer filled by syscall(SYS_read) would read as uninitialised in an
// MSan build of percpu (README, "Sanitizers in your build").
#if defined(__has_feature)
#if __has_feature(memory_sanitizer)
#include <sanitizer/msan_interface.h>
#define PERCPU_MSAN_FILLED(buffer, size) __msan_unpoison(buffer, size)
#endif
#endif
#ifndef PERCPU_MSAN_FILLED
#define PERCPU_MSAN_FILLED(buffer, size) ((void)0)
#endif

namespace percpu {
namespace internal {

void nocancel_sleep_ns(long ns) noexcept {
  const int saved_errno = errno;
  struct timespec pause = {ns / 1000000000L, ns % 1000000000L};
  (void)syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &pause, nullptr);
  errno = saved_errno;
}

void nocancel_write(int fd, const char* buffer, std::size_t size) noexcept {
  const int saved_errno = errno;
  while (size > 0) {
    const long n = syscall(SYS_write, fd, buffer, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer += n;
    size -= static_cast<std::size_t>(n);
  }
  errno = saved_errno;
}

void nocancel_write_string(int fd, const char* text) noexcept {
  nocancel_write(fd, text, std::strlen(text));
}

int nocancel_open(const char* path, int flags, int mode) noexcept {
  const int saved_errno = errno;
  long fd;
  do {
    fd = syscall(SYS_openat, AT_FDCWD, path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  errno = saved_errno;
  return fd < 0 ? -1 : static_cast<int>(fd);
}

int nocancel_open_read_only(const char* path) noexcept {
  return nocancel_open(path, O_RDONLY | O_CLOEXEC, 0);
}

long nocancel_read(int fd, void* buffer, std::size_t size) noexcept {
  const int saved_errno = errno;
  long n;
  do {
    n = syscall(SYS_read, fd, buffer, size);
  } while (n < 0 && errno == EINTR);
  errno = saved_errno;
  if (n > 0) PERCPU_MSAN_FILLED(buffer, static_cast<std::size_t>(n));
  return n < 0 ? -1 : n;
}

void nocancel_close(int fd) noexcept {
  const int saved_errno = errno;
  // Not retried after EINTR: on Linux the descriptor is gone either way.
  (void)syscall(SYS_close, fd);
  errno = saved_errno;
}

}  // namespace internal
}  // namespace percpu
