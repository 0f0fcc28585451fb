/* deny_getcpu_exec: runs a program in which no CPU-number system call works.
 *
 *   deny_getcpu_exec ENOSYS|EPERM program [args...]
 *
 * Installs a seccomp filter that makes both rseq(2) and getcpu(2) fail with
 * the given errno, then execs the program. With PERCPU_BACKEND=syscall the
 * preload then has no source left, which is how the test reaches the -1 and
 * errno path of sched_getcpu() and getcpu(). Exits 2 with a message on bad
 * usage.
 */
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

#if defined(__x86_64__)
#define AUDIT_ARCH_HERE AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define AUDIT_ARCH_HERE AUDIT_ARCH_AARCH64
#else
#error "deny_getcpu_exec knows x86-64 and aarch64"
#endif

int main(int argc, char** argv) {
  int error = -1;
  if (argc >= 3 && strcmp(argv[1], "ENOSYS") == 0) error = ENOSYS;
  if (argc >= 3 && strcmp(argv[1], "EPERM") == 0) error = EPERM;
  if (error < 0) {
    fprintf(stderr, "usage: deny_getcpu_exec ENOSYS|EPERM program [args...]\n");
    return 2;
  }
  const unsigned deny = SECCOMP_RET_ERRNO | ((unsigned)error & SECCOMP_RET_DATA);
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_HERE, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rseq, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getcpu, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, deny),
  };
  struct sock_fprog program = {(unsigned short)(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    perror("deny_getcpu_exec: installing the filter");
    return 2;
  }
  execvp(argv[2], argv + 2);
  fprintf(stderr, "deny_getcpu_exec: cannot run %s: %s\n", argv[2], strerror(errno));
  return 127;
}
