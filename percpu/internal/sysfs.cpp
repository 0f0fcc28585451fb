// Bounds on CPU ids from the kernel: the sysfs list of possible CPUs and the
// size of the kernel's cpumask (see percpu/internal/sysfs.hpp).

#include "percpu/internal/sysfs.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include "percpu/internal/fallback.hpp"
#include "percpu/internal/nocancel.hpp"

namespace percpu {
namespace internal {

int cpu_list_bound(const char* text) noexcept {
  int highest = -1;
  int value = -1;
  bool any = false;
  for (const char* p = text;; ++p) {
    if (*p >= '0' && *p <= '9') {
      value = (value < 0 ? 0 : value * 10) + (*p - '0');
      if (value > (1 << 22)) return 0;
    } else if (*p == '-' || *p == ',' || *p == '\n' || *p == '\0') {
      if (value < 0 && (*p == '-' || *p == ',' || any)) return 0;  // "-3", "1,,2", "1-"
      if (value > highest) highest = value;
      any = value >= 0;
      value = -1;
      if (*p == '\n' || *p == '\0') break;
    } else {
      return 0;
    }
  }
  return highest + 1;
}

int kernel_cpumask_bits() noexcept {
  // The raw system call (not glibc's wrapper, which hides it) returns how
  // many bytes of mask the kernel copied: its cpumask size, which holds
  // every CPU id it can ever report. Grow the buffer until it fits.
  unsigned long stack_mask[16];
  const int saved_errno = errno;
  long bytes = syscall(SYS_sched_getaffinity, 0, sizeof(stack_mask), stack_mask);
  if (bytes < 0 && errno == EINVAL) {
    // A kernel built for more CPUs than 1024: ask with a larger buffer.
    for (std::size_t size = 2 * sizeof(stack_mask); size <= (std::size_t{1} << 20); size *= 2) {
      void* mask = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mask == MAP_FAILED) break;
      bytes = syscall(SYS_sched_getaffinity, 0, size, mask);
      munmap(mask, size);
      if (bytes >= 0 || errno != EINVAL) break;
    }
  }
  errno = saved_errno;
  return bytes > 0 ? static_cast<int>(bytes * 8) : 0;
}

int read_max_cpus() noexcept {
  char text[4096];
  int count = 0;
  const int saved_errno = errno;
  // The kernel's own list of possible CPUs: the tightest bound, where /sys is
  // there to read it.
  const int fd = nocancel_open_read_only("/sys/devices/system/cpu/possible");
  if (fd >= 0) {
    const long n = nocancel_read(fd, text, sizeof(text) - 1);
    nocancel_close(fd);
    if (n > 0) {
      text[n] = '\0';
      count = internal::cpu_list_bound(text);
    }
  }
  // No /sys (a container, a sandbox): a counted number of CPUs is no bound on
  // their ids, but the size of the kernel's cpumask is.
  if (count <= 0) count = internal::kernel_cpumask_bits();
  if (count <= 0) {
    const long configured = sysconf(_SC_NPROCESSORS_CONF);
    count = configured > 0 ? static_cast<int>(configured) : 1;
  }
  // An id seen before the list was read must still fit.
  unsigned cpu = 0;
  if (internal::raw_syscall_getcpu(&cpu, nullptr) == 0 && static_cast<int>(cpu) >= count) {
    count = static_cast<int>(cpu) + 1;
  }
  errno = saved_errno;
  return count;
}

}  // namespace internal
}  // namespace percpu
