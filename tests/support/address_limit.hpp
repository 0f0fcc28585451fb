// Test helper: runs code in a child process whose address space is limited
// (RLIMIT_AS) to what it has mapped plus some room, so that mmap fails
// there as it does on a machine out of memory or address space. The
// structures' "no memory" paths are tested this way.
#pragma once

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>

namespace percpu {
namespace test {

// Why an address-space limit cannot be tested in this process, or nullptr:
// a sanitizer's shadow memory or valgrind's own mappings already fill the
// space such a limit would restrict.
inline const char* why_no_address_limit() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "a sanitizer's shadow memory fills the address space a limit would restrict";
#else
  if (std::getenv("PERCPU_UNDER_VALGRIND") != nullptr) {
    return "valgrind's own mappings fill the address space a limit would restrict";
  }
  return nullptr;
#endif
}

// The child's exit status when the kernel (or an emulator: qemu-user accepts
// RLIMIT_AS and ignores it, which would bind the emulator too) does not
// enforce the limit.
constexpr int kLimitNotEnforced = 99;
// The child's exit status when setrlimit failed.
constexpr int kLimitRefused = 98;

// Forks; the child limits itself to its mapped memory plus `room` bytes,
// checks that a mapping far beyond that now fails, and exits with
// body()'s return value. Returns the child's wait status, or -1 if fork
// failed. body must not need memory of its own beyond `room`.
template <typename Body>
int run_under_address_limit(std::size_t room, Body body) {
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    long pages = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    rlimit limit{};
    getrlimit(RLIMIT_AS, &limit);
    limit.rlim_cur =
        static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + room;
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(kLimitRefused);
    void* probe = mmap(nullptr, room + (std::size_t{1} << 30), PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (probe != MAP_FAILED) _exit(kLimitNotEnforced);
    _exit(body());
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return -1;
  return status;
}

// A constructor's "std::bad_alloc when no memory can be mapped": in a child
// under the limit (no room), makes up to `most` objects of T, each by
// make(where) in storage taken before the limit, until one throws; then
// check(the last object made, or nullptr) says whether it still works.
// The child's status (run_under_address_limit's wait status): 0 when a
// std::bad_alloc ended the making and check() returned 0; 3 when nothing
// threw; 4 when something else was thrown; check()'s result otherwise.
template <typename T, typename Make, typename Check>
int run_until_bad_alloc(std::size_t most, Make make, Check check) {
  struct alignas(T) raw {
    unsigned char bytes[sizeof(T)];
  };
  std::unique_ptr<raw[]> storage(new raw[most]);
  return run_under_address_limit(0, [&] {
    T* last = nullptr;
    try {
      for (std::size_t i = 0; i < most; ++i) last = make(&storage[i]);
    } catch (const std::bad_alloc&) {
      return check(last);
    } catch (...) {
      return 4;
    }
    return 3;
  });
}

}  // namespace test
}  // namespace percpu
