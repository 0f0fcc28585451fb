// Do not include directly; not a stable API (internal to percpu).
//
// The system calls percpu makes that POSIX lists as cancellation points
// (nanosleep, open, read, write, close), made so that they are not.
//
// Why: percpu's operations are noexcept and many run inside signal handlers
// or fork handlers. Under deferred cancellation, glibc's wrappers of these
// calls act on a pending pthread_cancel() by unwinding the thread; the unwind
// then meets a noexcept frame and std::terminate() aborts the process (or,
// from C, it abandons a flag percpu holds). So percpu never calls the
// wrappers: it issues the system calls through syscall(), which is not a
// cancellation point in glibc (nor in musl), and keeps errno as it found it.
// glibc's own no-cancel variants (__open_nocancel...) are not public.
//
// Everything here is thread-safe and async-signal-safe, and leaves errno
// alone. None of it is a cancellation point.
#pragma once

#include <cstddef>

namespace percpu {
namespace internal {

// Sleeps for `ns` nanoseconds of CLOCK_MONOTONIC (less if a signal arrives).
void nocancel_sleep_ns(long ns) noexcept;

// Writes all of buffer[0, size) to `fd` (retrying after EINTR and partial
// writes); gives up quietly on any other error. For one-line diagnostics.
void nocancel_write(int fd, const char* buffer, std::size_t size) noexcept;
// The same, of a NUL-terminated string.
void nocancel_write_string(int fd, const char* text) noexcept;

// open(path, O_RDONLY | O_CLOEXEC), read(fd, ...) once and close(fd), as the
// raw system calls: the file descriptor, or -1; the bytes read, or -1.
int nocancel_open_read_only(const char* path) noexcept;
long nocancel_read(int fd, void* buffer, std::size_t size) noexcept;
void nocancel_close(int fd) noexcept;

// open(path, flags, mode) for writing, as the raw system call; -1 on error.
int nocancel_open(const char* path, int flags, int mode) noexcept;

}  // namespace internal
}  // namespace percpu
