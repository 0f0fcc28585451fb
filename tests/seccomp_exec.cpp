// seccomp_exec: runs a program with the rseq system call failing.
//
//   seccomp_exec ENOSYS|EPERM|EINVAL program [args...]
//
// Installs a seccomp filter that makes rseq(2) fail with the given errno and
// allows everything else, then execs the program. Kernels and sandboxes
// without rseq look exactly like this to glibc and to percpu, so the tests of
// the fallback paths run under it. Exits 2 with a message on bad usage.

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

}  // namespace

int main(int argc, char** argv) {
  const int error = argc >= 3 ? parse_errno(argv[1]) : -1;
  if (error < 0) {
    fprintf(stderr, "usage: seccomp_exec ENOSYS|EPERM|EINVAL program [args...]\n");
    return 2;
  }
  if (!percpu::tools::deny_rseq(error)) {
    perror("seccomp_exec: installing the filter");
    return 2;
  }
  execvp(argv[2], argv + 2);
  fprintf(stderr, "seccomp_exec: cannot run %s: %s\n", argv[2], strerror(errno));
  return 127;
}
