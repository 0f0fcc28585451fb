// seccomp_exec: runs a program with the rseq or the membarrier system call
// failing.
//
//   seccomp_exec ENOSYS|EPERM|EINVAL program [args...]
//   seccomp_exec --membarrier ENOSYS|EPERM|EINVAL program [args...]
//
// Installs a seccomp filter that makes rseq(2) (or, with --membarrier,
// membarrier(2)) fail with the given errno and allows everything else, then
// execs the program. Kernels and sandboxes without rseq look exactly like the
// first to glibc and to percpu, so the tests of the fallback paths run under
// it; kernels with rseq but without membarrier (or without its RSEQ fence:
// Linux 4.18 to 5.9), and sandboxes refusing it, look like the second, which
// the .no_membarrier variants run under. Exits 2 with a message on bad usage.

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tools/seccomp_deny_rseq.hpp"

namespace {

int parse_errno(const char* name) {
  if (strcmp(name, "ENOSYS") == 0) return ENOSYS;
  if (strcmp(name, "EPERM") == 0) return EPERM;
  if (strcmp(name, "EINVAL") == 0) return EINVAL;
  return -1;
}

int usage() {
  fprintf(stderr,
          "usage: seccomp_exec ENOSYS|EPERM|EINVAL program [args...]\n"
          "       seccomp_exec --membarrier ENOSYS|EPERM|EINVAL program [args...]\n"
          "  (rseq(2), or with --membarrier membarrier(2), fails with that errno)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int first = 1;  // the errno's argument
  bool membarrier = false;
  if (argc >= 2 && strcmp(argv[1], "--membarrier") == 0) {
    membarrier = true;
    first = 2;
  } else if (argc >= 2 && strncmp(argv[1], "-", 1) == 0) {
    fprintf(stderr, "seccomp_exec: unknown option %s\n", argv[1]);
    return usage();
  }
  if (argc < first + 2) return usage();
  const int error = parse_errno(argv[first]);
  if (error < 0) {
    fprintf(stderr, "seccomp_exec: %s is not ENOSYS, EPERM or EINVAL\n", argv[first]);
    return usage();
  }
  const bool installed =
      membarrier ? percpu::tools::deny_membarrier(error) : percpu::tools::deny_rseq(error);
  if (!installed) {
    perror("seccomp_exec: installing the filter");
    return 2;
  }
  char** program = argv + first + 1;
  execvp(program[0], program);
  fprintf(stderr, "seccomp_exec: cannot run %s: %s\n", program[0], strerror(errno));
  return 127;
}
