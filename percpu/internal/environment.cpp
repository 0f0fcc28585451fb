// The start-up environment: secure execution and PERCPU_* variables read
// before libc may have set up environ (see percpu/internal/environment.hpp).

#include "percpu/internal/environment.hpp"
#include "percpu/internal/nocancel.hpp"

#include <fcntl.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace percpu {
namespace internal {

bool secure_execution() noexcept { return getauxval(AT_SECURE) != 0; }

environ_scanner::environ_scanner(const char* name, char* buffer, std::size_t size) noexcept
    : name_(name), name_length_(std::strlen(name)), buffer_(buffer), size_(size) {}

bool environ_scanner::feed(const char* bytes, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n && !done_; ++i) {
    const char c = bytes[i];
    if (found_) {
      if (c == '\0')
        done_ = true;
      else if (copied_ + 1 < size_)
        buffer_[copied_++] = c;
    } else if (c == '\0') {
      matched_ = 0;
    } else if (matched_ == SIZE_MAX) {
      continue;
    } else if (matched_ < name_length_) {
      matched_ = c == name_[matched_] ? matched_ + 1 : SIZE_MAX;
    } else {
      if (c == '=')
        found_ = true;
      else
        matched_ = SIZE_MAX;
    }
  }
  return !done_;
}

const char* environ_scanner::value() noexcept {
  if (!found_) return nullptr;
  buffer_[copied_] = '\0';
  return buffer_;
}

const char* startup_env(const char* name, char* buffer, std::size_t size) noexcept {
  if (secure_execution()) return nullptr;
  if (environ != nullptr) {
    const char* value = getenv(name);
    if (value == nullptr) return nullptr;
    std::size_t n = 0;
    for (; value[n] != '\0' && n + 1 < size; ++n) buffer[n] = value[n];
    buffer[n] = '\0';
    return buffer;
  }
  const int saved_errno = errno;
  const int fd = nocancel_open_read_only("/proc/self/environ");
  if (fd < 0) {
    errno = saved_errno;
    return nullptr;
  }
  environ_scanner scanner(name, buffer, size);
  char chunk[512];
  long n;
  bool more = true;
  while (more && (n = nocancel_read(fd, chunk, sizeof(chunk))) > 0) {
    more = scanner.feed(chunk, static_cast<std::size_t>(n));
  }
  nocancel_close(fd);
  errno = saved_errno;
  return scanner.value();
}

}  // namespace internal
}  // namespace percpu
