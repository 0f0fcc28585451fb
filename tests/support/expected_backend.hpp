// Which backend percpu must choose on this host, worked out without percpu's
// own detection where that is possible, so that a test of the choice can
// fail. A test never assumes what the host's CPU or kernel offers: it asks
// here, checks what cpu.hpp promises for that host, and says which of the
// cases it checked.
//
//   host_offers(b)          whether `b` gives the right CPU here: RDPID when
//                           CPUID reports it and, on every allowed CPU, it
//                           names the CPU and node getcpu names; the vDSO
//                           getcpu when the vDSO has one that agrees with the
//                           system call on every allowed CPU; the system call
//                           when it answers.
//   documented_fallback(f)  the first backend at or after `f`, in the order
//                           cpu.hpp promises (rdpid, vdso, syscall), that the
//                           host offers: what PERCPU_BACKEND=f must give.
//   expected_backend(want, why)
//                           what PERCPU_EXPECT_BACKEND=want asks for: `want`
//                           itself, or for "forced" the documented fallback
//                           of PERCPU_BACKEND on this host; `why` says which
//                           case that is, for the test's output.
#pragma once

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"

namespace percpu {
namespace test {

inline std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// Pins the calling thread to one CPU for its lifetime, restoring the old mask.
class pin_to {
 public:
  explicit pin_to(int cpu) {
    CPU_ZERO(&old_);
    sched_getaffinity(0, sizeof(old_), &old_);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ok_ = sched_setaffinity(0, sizeof(one), &one) == 0;
    sched_yield();  // make sure the move has happened
  }
  ~pin_to() { sched_setaffinity(0, sizeof(old_), &old_); }
  pin_to(const pin_to&) = delete;
  pin_to& operator=(const pin_to&) = delete;
  bool ok() const { return ok_; }

 private:
  cpu_set_t old_;
  bool ok_ = false;
};

// The kernel's own answer, by the system call (never the vDSO).
inline bool kernel_getcpu(unsigned* cpu, unsigned* node) {
  return syscall(SYS_getcpu, cpu, node, nullptr) == 0;
}

// Whether `read(&cpu, &node)` names the CPU (and node, where it gives one)
// the kernel names, on every allowed CPU this thread can be pinned to.
template <typename Read>
bool agrees_on_every_cpu(Read read) {
  for (int cpu : allowed_cpus()) {
    pin_to pin(cpu);
    if (!pin.ok()) continue;
    unsigned want_cpu = 0, want_node = 0;
    if (!kernel_getcpu(&want_cpu, &want_node)) return false;
    int got_cpu = -1, got_node = -1;
    if (!read(&got_cpu, &got_node)) return false;
    if (got_cpu != static_cast<int>(want_cpu)) return false;
    if (got_node >= 0 && got_node != static_cast<int>(want_node)) return false;
  }
  return true;
}

inline bool host_offers(cpu_backend backend) {
  switch (backend) {
    case cpu_backend::rdpid: {
#if defined(__x86_64__)
      // Only the CPUID flag counts: some hypervisors execute RDPID with the
      // flag masked and return a value that is no CPU of the guest.
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 22)) == 0) {
        return false;
      }
      return agrees_on_every_cpu([](int* cpu, int* node) {
        const unsigned aux = internal::rdpid_tsc_aux();
        *cpu = static_cast<int>(aux & internal::kRdpidCpuMask);
        *node = static_cast<int>(aux >> internal::kRdpidNodeShift);
        return true;
      });
#else
      return false;
#endif
    }
    case cpu_backend::vdso: {
      const internal::vdso_getcpu_fn f = internal::vdso_getcpu_function();
      if (f == nullptr) return false;
      return agrees_on_every_cpu([f](int* cpu, int* node) {
        unsigned c = 0, n = 0;
        if (f(&c, &n, nullptr) != 0) return false;
        *cpu = static_cast<int>(c);
        *node = static_cast<int>(n);
        return true;
      });
    }
    case cpu_backend::syscall: {
      unsigned cpu = 0, node = 0;
      return kernel_getcpu(&cpu, &node);
    }
    case cpu_backend::rseq: return false;  // not a fallback
  }
  return false;
}

// Why the host does not offer `backend`, for test output.
inline const char* why_not_offered(cpu_backend backend) {
  switch (backend) {
    case cpu_backend::rdpid:
#if defined(__x86_64__)
    {
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 22)) == 0) {
        return "the CPU does not report RDPID";
      }
      return "RDPID disagrees with getcpu on some CPU";
    }
#else
      return "RDPID is an x86-64 instruction";
#endif
    case cpu_backend::vdso:
      return internal::vdso_getcpu_function() == nullptr
                 ? "the vDSO has no getcpu"
                 : "the vDSO getcpu disagrees with the system call on some CPU";
    case cpu_backend::syscall: return "the getcpu system call fails";
    case cpu_backend::rseq: return "rseq is not a fallback";
  }
  return "?";
}

inline cpu_backend documented_fallback(cpu_backend first) {
  const cpu_backend order[] = {cpu_backend::rdpid, cpu_backend::vdso, cpu_backend::syscall};
  bool reached = false;
  for (cpu_backend b : order) {
    reached = reached || b == first;
    if (reached && host_offers(b)) return b;
  }
  return cpu_backend::syscall;  // the last resort, whatever it answers
}

inline bool parse_backend(const char* name, cpu_backend* out) {
  for (cpu_backend b :
       {cpu_backend::rseq, cpu_backend::rdpid, cpu_backend::vdso, cpu_backend::syscall}) {
    if (std::strcmp(to_string(b), name) == 0) {
      *out = b;
      return true;
    }
  }
  return false;
}

// The backend name PERCPU_EXPECT_BACKEND=`want` asks for, or "" when `want`
// names none. `why` tells the output which case was checked.
inline std::string expected_backend(const char* want, std::string* why) {
  cpu_backend named = cpu_backend::syscall;
  if (std::strcmp(want, "forced") != 0) {
    *why = std::string("this variant must run on the ") + want + " backend";
    return parse_backend(want, &named) ? want : "";
  }
  const char* forced = std::getenv("PERCPU_BACKEND");
  if (forced == nullptr || !parse_backend(forced, &named) || named == cpu_backend::rseq) {
    *why = "PERCPU_EXPECT_BACKEND=forced needs PERCPU_BACKEND=rdpid|vdso|syscall";
    return "";
  }
  const cpu_backend chosen = documented_fallback(named);
  if (chosen == named) {
    *why = std::string("PERCPU_BACKEND=") + forced + ": the host offers it, so it must serve";
  } else {
    *why = std::string("PERCPU_BACKEND=") + forced + ": not offered here (" +
           why_not_offered(named) + "), so the next one the host offers must serve";
  }
  return to_string(chosen);
}

}  // namespace test
}  // namespace percpu
