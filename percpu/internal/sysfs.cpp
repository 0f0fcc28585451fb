// Bounds on CPU ids from the kernel: the sysfs list of possible CPUs and the
// size of the kernel's cpumask (see percpu/internal/sysfs.hpp).

#include "percpu/internal/sysfs.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statfs.h>
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

// The raw system call (not glibc's wrapper, which hides it) returns how many
// bytes of mask the kernel copied: its cpumask size, which holds every CPU id
// it can ever report. Grows the buffer until it fits. Sets *highest to the
// highest CPU the calling thread may run on (-1 if none was read).
int kernel_cpumask_bits(int* highest) noexcept {
  unsigned long stack_mask[16] = {};  // zeroed: a sanitizer cannot see the raw call fill it
  const int saved_errno = errno;
  *highest = -1;
  long bytes = syscall(SYS_sched_getaffinity, 0, sizeof(stack_mask), stack_mask);
  if (bytes > 0) {
    for (long bit = bytes * 8 - 1; bit >= 0 && *highest < 0; --bit) {
      if ((stack_mask[bit / 64] >> (bit % 64)) & 1) *highest = static_cast<int>(bit);
    }
  }
  if (bytes < 0 && errno == EINVAL) {
    // A kernel built for more CPUs than 1024: ask with a larger buffer.
    for (std::size_t size = 2 * sizeof(stack_mask); size <= (std::size_t{1} << 20); size *= 2) {
      void* mask = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mask == MAP_FAILED) break;
      bytes = syscall(SYS_sched_getaffinity, 0, size, mask);
      const auto* words = static_cast<const unsigned long*>(mask);
      for (long bit = bytes * 8 - 1; bytes > 0 && bit >= 0 && *highest < 0; --bit) {
        if ((words[bit / 64] >> (bit % 64)) & 1) *highest = static_cast<int>(bit);
      }
      munmap(mask, size);
      if (bytes >= 0 || errno != EINVAL) break;
    }
  }
  errno = saved_errno;
  return bytes > 0 ? static_cast<int>(bytes * 8) : 0;
}

int kernel_cpumask_bits() noexcept {
  int highest = -1;
  return kernel_cpumask_bits(&highest);
}

int read_max_cpus(bool* bounds_every_id) noexcept {
  char text[4096];
  int count = 0;
  const int saved_errno = errno;
  // The kernel's own list of possible CPUs: the tightest bound, where /sys is
  // there to read it.
  // Only a list the kernel wrote (a file of sysfs) proves anything; a file
  // bind-mounted over it may say less than the kernel can report.
  constexpr long kSysfsMagic = 0x62656572;
  bool list_from_sysfs = false;
  const int fd = nocancel_open_read_only("/sys/devices/system/cpu/possible");
  if (fd >= 0) {
    struct statfs fs;
    list_from_sysfs = fstatfs(fd, &fs) == 0 && static_cast<long>(fs.f_type) == kSysfsMagic;
    const long n = nocancel_read(fd, text, sizeof(text) - 1);
    nocancel_close(fd);
    if (n > 0) {
      text[n] = '\0';
      count = internal::cpu_list_bound(text);
    }
  }
  int highest_allowed = -1;
  const int mask_bits = kernel_cpumask_bits(&highest_allowed);
  // A list from elsewhere (bind-mounted over sysfs's) still proves a bound
  // when it covers the kernel's cpumask: no id the kernel reports is at or
  // above the mask's size.
  *bounds_every_id =
      count > 0 ? list_from_sysfs || (mask_bits > 0 && count >= mask_bits) : mask_bits > 0;
  // No /sys (a container, a sandbox): a counted number of CPUs is no bound on
  // their ids, but the size of the kernel's cpumask is.
  if (count <= 0) count = mask_bits;
  if (count <= 0) {
    const long configured = sysconf(_SC_NPROCESSORS_CONF);
    count = configured > 0 ? static_cast<int>(configured) : 1;
  }
  // A CPU this thread may run on, or an id seen before the list was read,
  // must still fit; a list that missed one is no proof for the others.
  if (highest_allowed >= count) {
    count = highest_allowed + 1;
    *bounds_every_id = false;
  }
  unsigned cpu = 0;
  if (internal::raw_syscall_getcpu(&cpu, nullptr) == 0 && static_cast<int>(cpu) >= count) {
    count = static_cast<int>(cpu) + 1;
    *bounds_every_id = false;
  }
  errno = saved_errno;
  return count;
}

}  // namespace internal
}  // namespace percpu
