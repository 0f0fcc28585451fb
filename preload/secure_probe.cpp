// A program for secure_exec_test.sh: linked to libpercpu_getcpu.so (as a
// preloaded copy would be used) and to percpu. Prints what a user of each
// sees, then exits normally so the preload's trace destructor runs.
#include <sched.h>
#include <sys/auxv.h>

#include <cstdio>

#include "percpu/cpu.hpp"

int main() {
  int cpu = -1;
  for (int i = 0; i < 100; ++i) cpu = sched_getcpu();
  std::printf("secure=%lu backend=%s cpu_ok=%d\n", getauxval(AT_SECURE),
              percpu::to_string(percpu::backend()), cpu >= 0 ? 1 : 0);
  return cpu >= 0 ? 0 : 1;
}
