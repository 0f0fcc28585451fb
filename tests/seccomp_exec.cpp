// seccomp_exec: runs a program with the rseq system call failing.
//
//   seccomp_exec ENOSYS|EPERM|EINVAL program [args...]
//
// Installs a seccomp filter that makes rseq(2) fail with the given errno and
// allows everything else, then execs the program. Kernels and sandboxes
// without rseq look exactly like this to glibc and to percpu, so the tests of
// the fallback paths run under it. Exits 2 with a message on bad usage.

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

#if defined(__x86_64__)
constexpr unsigned kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kAuditArch = AUDIT_ARCH_AARCH64;
#else
#error "seccomp_exec knows x86-64 and aarch64"
#endif

int parse_errno(const char* name) {
  if (strcmp(name, "ENOSYS") == 0) return ENOSYS;
  if (strcmp(name, "EPERM") == 0) return EPERM;
  if (strcmp(name, "EINVAL") == 0) return EINVAL;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  const int error = argc >= 3 ? parse_errno(argv[1]) : -1;
  if (error < 0) {
    fprintf(stderr, "usage: seccomp_exec ENOSYS|EPERM|EINVAL program [args...]\n");
    return 2;
  }
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rseq, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(error) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    perror("seccomp_exec: installing the filter");
    return 2;
  }
  execvp(argv[2], argv + 2);
  fprintf(stderr, "seccomp_exec: cannot run %s: %s\n", argv[2], strerror(errno));
  return 127;
}
