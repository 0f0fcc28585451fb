#include "percpu/internal/fallback.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "percpu/internal/config.hpp"
#include "percpu/internal/vdso.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace percpu {
namespace internal {
// Looked up on first use; a racing second lookup stores the same value.
vdso_getcpu_fn vdso_getcpu_function() noexcept {
  static vdso_getcpu_fn cached = nullptr;
  static bool looked_up = false;
  if (!__atomic_load_n(&looked_up, __ATOMIC_ACQUIRE)) {
#if defined(__x86_64__)
    void* f = vdso_symbol("__vdso_getcpu", "LINUX_2.6");
#elif defined(__powerpc__) || defined(__s390__)
    void* f = vdso_symbol("__kernel_getcpu", nullptr);
#else
    void* f = vdso_symbol("__vdso_getcpu", nullptr);
#endif
    __atomic_store_n(&cached, reinterpret_cast<vdso_getcpu_fn>(f), __ATOMIC_RELAXED);
    __atomic_store_n(&looked_up, true, __ATOMIC_RELEASE);
  }
  return __atomic_load_n(&cached, __ATOMIC_RELAXED);
}

namespace {

#if defined(__x86_64__)
bool cpu_has_rdpid() noexcept {
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  return (ecx & (1u << 22)) != 0;
}

// RDPID returns IA32_TSC_AUX, which Linux sets to (node << 12) | cpu on every
// CPU. A hypervisor may leave it unset or stale, so it is trusted only if it
// agrees with the kernel: two RDPIDs around a getcpu must match it. Sets the
// CPU it agreed on.
bool rdpid_agrees_here(unsigned* agreed) noexcept {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const unsigned before = raw_rdpid();
    unsigned cpu = 0, node = 0;
    if (raw_syscall_getcpu(&cpu, &node) != 0) return false;
    const unsigned after = raw_rdpid();
    if (before != after) continue;  // migrated in between; ask again
    *agreed = cpu;
    return (before & kRdpidCpuMask) == cpu && (before >> kRdpidNodeShift) == node;
  }
  return false;
}
#endif

bool vdso_agrees_here(unsigned* agreed) noexcept {
  for (int attempt = 0; attempt < 16; ++attempt) {
    unsigned before = 0, after = 0, cpu = 0;
    if (raw_vdso_getcpu(&before, nullptr) != 0) return false;
    if (raw_syscall_getcpu(&cpu, nullptr) != 0) return false;
    if (raw_vdso_getcpu(&after, nullptr) != 0) return false;
    if (before != after) continue;
    *agreed = cpu;
    return before == cpu;
  }
  return false;
}

}  // namespace

// An answer checked on one CPU can be a constant that happens to name it:
// qemu-user's x86-64 vDSO getcpu answers CPU 0 on every CPU, and a
// hypervisor that never sets TSC_AUX leaves RDPID at 0 everywhere. So an
// agreement on CPU 0 is checked once more on another allowed CPU, the
// calling thread moved there for the while (raw system calls) and then given
// its mask back. Where that cannot be done (CPU 0 is the only one allowed,
// the affinity calls are refused, a kernel with more than 1024 CPUs) the
// one agreement stands. A stub that answers another constant C is caught
// only when start-up runs elsewhere than on C. Should another thread change
// this thread's affinity meanwhile, the mask given back is the one read here.
bool agrees_on_cpu_0_and_another(bool (*agrees_here)(unsigned*)) noexcept {
  unsigned agreed = 0;
  if (!agrees_here(&agreed)) return false;
  if (agreed != 0) return true;
  const int saved_errno = errno;
  unsigned long allowed[16] = {};  // 1024 CPUs
  const long bytes = syscall(SYS_sched_getaffinity, 0, sizeof(allowed), allowed);
  bool ok = true;
  int other = -1;
  for (long bit = 1; bytes > 0 && bit < bytes * 8 && other < 0; ++bit) {
    if ((allowed[bit / 64] >> (bit % 64)) & 1) other = static_cast<int>(bit);
  }
  if (other > 0) {
    unsigned long one[16] = {};
    one[other / 64] = 1ul << (other % 64);
    if (syscall(SYS_sched_setaffinity, 0, bytes, one) == 0) {
      ok = agrees_here(&agreed) && agreed == static_cast<unsigned>(other);
      syscall(SYS_sched_setaffinity, 0, bytes, allowed);
    }
  }
  errno = saved_errno;
  return ok;
}

int raw_vdso_getcpu(unsigned* cpu, unsigned* node) noexcept {
  const vdso_getcpu_fn f = vdso_getcpu_function();
  if (f == nullptr) return ENOSYS;
  // The vDSO answers 0 or a negative errno value, as the system call would.
  const long rc = f(cpu, node, nullptr);
  return rc == 0 ? 0 : static_cast<int>(-rc);
}

int raw_syscall_getcpu(unsigned* cpu, unsigned* node) noexcept {
  const int saved_errno = errno;
  const long rc = syscall(SYS_getcpu, cpu, node, nullptr);
  const int error = rc == 0 ? 0 : errno;
  errno = saved_errno;
  return error;
}

bool fallback_usable(cpu_backend backend, const char** why) noexcept {
  const char* reason = nullptr;
  switch (backend) {
    case cpu_backend::rdpid:
#if defined(__x86_64__)
      if (!cpu_has_rdpid()) {
        reason = "the CPU does not report RDPID";
      } else if (!agrees_on_cpu_0_and_another(rdpid_agrees_here)) {
        reason = "RDPID disagrees with getcpu (TSC_AUX not maintained)";
      }
#else
      reason = "RDPID is an x86-64 instruction";
#endif
      break;
    case cpu_backend::vdso:
      if (vdso_getcpu_function() == nullptr) {
        reason = "this kernel's vDSO has no getcpu";
      } else if (!agrees_on_cpu_0_and_another(vdso_agrees_here)) {
        reason = "the vDSO getcpu disagrees with the system call";
      }
      break;
    case cpu_backend::syscall: {
      unsigned cpu = 0;
      if (raw_syscall_getcpu(&cpu, nullptr) != 0) reason = "the getcpu system call fails";
      break;
    }
    case cpu_backend::rseq: reason = "rseq is not a fallback"; break;
  }
  if (why != nullptr) *why = reason;
  return reason == nullptr;
}

namespace {
// Static TLS, so a signal handler may use it; zero-initialised, and 0 is a
// valid CPU id until the first refresh.
__thread int t_hint_cpu PERCPU_STATIC_TLS = 0;
__thread unsigned t_hint_uses PERCPU_STATIC_TLS = 0;
}  // namespace

// Asks the fallback itself: the caller has no rseq, so cpu_id()'s checks of
// the thread's registration would only add to the cost.
int cpu_hint_slow() noexcept {
  const cpu_backend fallback = fallback_backend();
  if (fallback == cpu_backend::syscall) {
    const unsigned uses = t_hint_uses;
    if (__builtin_expect(uses != 0, 1)) {
      t_hint_uses = uses - 1;
      return t_hint_cpu;
    }
    const int cpu = cpu_id();
    t_hint_cpu = cpu;
    t_hint_uses = kCpuHintUses - 1;
    return cpu;
  }
  unsigned cpu = 0;
  const std::uint32_t limit = __atomic_load_n(&g_fast_path.cpu_limit, __ATOMIC_ACQUIRE);
  if (limit == 0 || fallback_query(fallback, &cpu, nullptr) != 0) return cpu_id();
  return static_cast<int>(cpu < limit ? cpu : cpu % limit);
}

int fallback_query(cpu_backend backend, unsigned* cpu, unsigned* node) noexcept {
  switch (backend) {
    case cpu_backend::rdpid: {
      const unsigned value = raw_rdpid();
      if (cpu != nullptr) *cpu = value & kRdpidCpuMask;
      if (node != nullptr) *node = value >> kRdpidNodeShift;
      return 0;
    }
    case cpu_backend::vdso:
      if (raw_vdso_getcpu(cpu, node) == 0) return 0;
      break;  // the syscall below still answers
    default: break;
  }
  return raw_syscall_getcpu(cpu, node);
}

}  // namespace internal
}  // namespace percpu
