// Do not include directly; not a stable API (internal to percpu).
//
// The start-up environment: whether the process runs in secure-execution
// mode, and the PERCPU_* variables, read even before libc has set up environ.
// Async-signal-safe: yes (reads and system calls only).
#pragma once

#include <cstddef>

namespace percpu {
namespace internal {

// True in secure-execution mode (AT_SECURE: set-user-ID, set-group-ID or
// file-capability programs). percpu then ignores every PERCPU_* variable.
bool secure_execution() noexcept;

// The value of environment variable `name` as the process started, copied
// into `buffer` (cut to `size` - 1 bytes); nullptr if unset, and always
// nullptr in secure-execution mode, where the environment belongs to a less
// trusted user. Start-up can run before libc has set up `environ` (from
// .preinit_array, or an allocator called by ld.so), so when environ is not
// there yet the kernel's copy in /proc/self/environ is read.
const char* startup_env(const char* name, char* buffer, std::size_t size) noexcept;

// Finds `name` in an environment block (NUL-terminated "NAME=value" entries,
// as /proc/self/environ holds them) fed in pieces of any size, so a block of
// any length is read through a small buffer; the value is copied into
// `buffer` as for startup_env.
class environ_scanner {
 public:
  environ_scanner(const char* name, char* buffer, std::size_t size) noexcept;
  // Scans the next `n` bytes; false once the value is complete and the rest
  // of the block does not matter.
  bool feed(const char* bytes, std::size_t n) noexcept;
  // The value found so far (NUL-terminated in the buffer), or nullptr.
  const char* value() noexcept;

 private:
  const char* name_;
  std::size_t name_length_;
  char* buffer_;
  std::size_t size_;
  std::size_t matched_ = 0;  // bytes of "name=" matched in this entry, or SIZE_MAX
  std::size_t copied_ = 0;
  bool found_ = false;
  bool done_ = false;
};

}  // namespace internal
}  // namespace percpu
