// The public face of percpu/cpu.hpp: names, queries and max_cpus(). Start-up,
// registration and the slow paths behind cpu_id() are in
// percpu/internal/registration.cpp.

#include "percpu/cpu.hpp"

#include <atomic>

#include "percpu/internal/registration.hpp"
#include "percpu/internal/sysfs.hpp"

namespace percpu {

const char* to_string(cpu_backend backend) noexcept {
  switch (backend) {
    case cpu_backend::rseq: return "rseq";
    case cpu_backend::rdpid: return "rdpid";
    case cpu_backend::vdso: return "vdso";
    case cpu_backend::syscall: return "syscall";
  }
  return "unknown";
}

const char* to_string(rseq_owner owner) noexcept {
  switch (owner) {
    case rseq_owner::none: return "none";
    case rseq_owner::glibc: return "glibc";
    case rseq_owner::percpu: return "percpu";
    case rseq_owner::other: return "other";
  }
  return "unknown";
}

cpu_backend backend() noexcept { return internal::thread_backend(); }

cpu_backend fallback_backend() noexcept { return internal::chosen_fallback(); }

rseq_owner rseq_ownership() noexcept { return internal::thread_rseq_owner(); }

unsigned rseq_feature_size() noexcept { return internal::thread_rseq_feature_size(); }

int max_cpus() noexcept {
  static std::atomic<int> cached{0};
  int count = cached.load(std::memory_order_relaxed);
  if (count == 0) {
    count = internal::read_max_cpus();
    cached.store(count, std::memory_order_relaxed);
  }
  return count;
}

}  // namespace percpu
