// The public face of percpu/cpu.hpp: names and max_cpus(). Start-up,
// registration, the slow paths behind cpu_id() and the queries that read the
// registration state (backend(), fallback_backend(), rseq_ownership(),
// rseq_feature_size(), sections_status()) are in
// percpu/internal/registration.cpp.

#include "percpu/cpu.hpp"

#include <atomic>

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

const char* to_string(sections status) noexcept {
  switch (status) {
    case sections::on: return "on";
    case sections::no_rseq: return "no_rseq";
    case sections::foreign_signature: return "foreign_signature";
    case sections::kernel_quirk: return "kernel_quirk";
    case sections::disabled_by_environment: return "disabled_by_environment";
    case sections::unsupported_arch: return "unsupported_arch";
    case sections::fallback_forced: return "fallback_forced";
    case sections::starting: return "starting";
  }
  return "unknown";
}

const char* to_string(concurrency_source source) noexcept {
  switch (source) {
    case concurrency_source::mm_cid: return "mm_cid";
    case concurrency_source::cpu_id: return "cpu_id";
  }
  return "unknown";
}

namespace {
// max_cpus() and whether it bounds every id the kernel reports, computed
// together; a racing second computation stores the same values.
std::atomic<int> g_max_cpus{0};
std::atomic<bool> g_max_cpus_bounds_every_id{false};
}  // namespace

int max_cpus() noexcept {
  int count = g_max_cpus.load(std::memory_order_acquire);
  if (count == 0) {
    bool bounds = false;
    count = internal::read_max_cpus(&bounds);
    g_max_cpus_bounds_every_id.store(bounds, std::memory_order_relaxed);
    g_max_cpus.store(count, std::memory_order_release);
  }
  return count;
}

namespace internal {
bool max_cpus_bounds_every_id() noexcept {
  (void)max_cpus();
  return g_max_cpus_bounds_every_id.load(std::memory_order_relaxed);
}
}  // namespace internal

}  // namespace percpu
