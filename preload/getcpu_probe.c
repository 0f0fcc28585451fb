/* getcpu_probe: an ordinary C program that calls glibc's sched_getcpu() and
 * getcpu(). It knows nothing of percpu and does not link it: the preload test
 * and benchmark run it with and without LD_PRELOAD=libpercpu_getcpu.so.
 *
 *   getcpu_probe check     answers right on every allowed CPU, in threads that
 *                          existed before the first call, in a signal handler
 *                          that makes a thread's first call, and in a forked
 *                          child; errno untouched on success
 *   getcpu_probe fail      both functions fail: expects -1 and prints errno
 *   getcpu_probe idle      never calls them; registers an rseq area itself and
 *                          prints whether the kernel accepted it, and whether
 *                          the preload is mapped
 *   getcpu_probe exit-children N
 *                          makes no call itself; forks two children that each
 *                          make N calls of sched_getcpu() and leave, one with
 *                          _exit(0), one with _Exit(0) (no atexit handler, no
 *                          destructor runs)
 *   getcpu_probe loop N    times N calls of sched_getcpu(), prints ns per call
 *   getcpu_probe syscall-loop N
 *                          the same with the getcpu system call, which is what
 *                          sched_getcpu() costs where there is no vDSO getcpu
 *
 * Every process that made calls prints "calls pid=P sched_getcpu=N getcpu=M"
 * on stdout (counts inherited across fork, like the preload's trace), so a
 * driver can match them with the preload's own count of the calls it answered.
 * Exit status: 0 when every check passed, 1 on a wrong answer, 2 on bad usage
 * or a failure of the machinery (affinity, threads, fork).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Any value other than a real errno, to see that a call left errno alone. */
#define ERRNO_SENTINEL 12345

static atomic_ulong sched_getcpu_calls;
static atomic_ulong getcpu_calls;
static atomic_int failures;
static cpu_set_t allowed;

static void fail(const char* what, int cpu, long got) {
  fprintf(stderr, "getcpu_probe: %s on CPU %d (got %ld)\n", what, cpu, got);
  atomic_fetch_add(&failures, 1);
}

static int counted_sched_getcpu(void) {
  atomic_fetch_add(&sched_getcpu_calls, 1);
  return sched_getcpu();
}

static int counted_getcpu(unsigned* cpu, unsigned* node) {
  atomic_fetch_add(&getcpu_calls, 1);
  return getcpu(cpu, node);
}

static void print_calls(void) {
  printf("calls pid=%ld sched_getcpu=%lu getcpu=%lu\n", (long)getpid(),
         atomic_load(&sched_getcpu_calls), atomic_load(&getcpu_calls));
  fflush(stdout);
}

static int pin(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof(one), &one);
}

static void unpin(void) { sched_setaffinity(0, sizeof(allowed), &allowed); }

/* Checks both functions against the kernel while pinned to `cpu`. The raw
 * system call is the reference: neither glibc nor a preload can intercept it. */
static void check_on(int cpu) {
  unsigned kernel_cpu = 0, kernel_node = 0;
  if (syscall(SYS_getcpu, &kernel_cpu, &kernel_node, NULL) != 0 || (int)kernel_cpu != cpu) {
    fail("pinning did not take", cpu, (long)kernel_cpu);
    return;
  }
  for (int i = 0; i < 1000; ++i) {
    errno = ERRNO_SENTINEL;
    const int got = counted_sched_getcpu();
    if (got != cpu) fail("sched_getcpu() answered wrong", cpu, got);
    if (errno != ERRNO_SENTINEL) fail("sched_getcpu() changed errno", cpu, errno);
  }
  unsigned got_cpu = ~0u, got_node = ~0u;
  errno = ERRNO_SENTINEL;
  if (counted_getcpu(&got_cpu, &got_node) != 0) fail("getcpu(cpu, node) failed", cpu, errno);
  if ((int)got_cpu != cpu) fail("getcpu(cpu, node) gave the wrong CPU", cpu, got_cpu);
  if (got_node != kernel_node) fail("getcpu(cpu, node) gave the wrong node", cpu, got_node);
  got_cpu = ~0u;
  if (counted_getcpu(&got_cpu, NULL) != 0) fail("getcpu(cpu, NULL) failed", cpu, errno);
  if ((int)got_cpu != cpu) fail("getcpu(cpu, NULL) gave the wrong CPU", cpu, got_cpu);
  got_node = ~0u;
  if (counted_getcpu(NULL, &got_node) != 0) fail("getcpu(NULL, node) failed", cpu, errno);
  if (got_node != kernel_node) fail("getcpu(NULL, node) gave the wrong node", cpu, got_node);
  if (errno != ERRNO_SENTINEL) fail("getcpu() changed errno", cpu, errno);
}

static int check_every_cpu(void) {
  int checked = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (pin(cpu) != 0) {
      perror("getcpu_probe: sched_setaffinity");
      exit(2);
    }
    check_on(cpu);
    ++checked;
  }
  unpin();
  return checked;
}

/* Threads started before anyone called sched_getcpu(). */
static pthread_barrier_t start_line;

static void* early_thread(void* unused) {
  (void)unused;
  pthread_barrier_wait(&start_line);
  check_every_cpu();
  return NULL;
}

/* A thread whose first call happens inside a signal handler. */
static volatile sig_atomic_t handler_cpu = -2;
static volatile sig_atomic_t handler_getcpu_cpu = -2;
static volatile sig_atomic_t handler_errno = 0;

static void on_signal(int signo) {
  (void)signo;
  const int saved = errno;
  errno = ERRNO_SENTINEL;
  handler_cpu = counted_sched_getcpu();
  unsigned cpu = ~0u;
  handler_getcpu_cpu = counted_getcpu(&cpu, NULL) == 0 ? (int)cpu : -1;
  handler_errno = errno;
  errno = saved;
}

static void* signalled_thread(void* arg) {
  const int cpu = *(const int*)arg;
  if (pin(cpu) != 0) {
    fail("cannot pin the signalled thread", cpu, errno);
    return NULL;
  }
  pthread_kill(pthread_self(), SIGUSR1); /* delivered before this returns */
  if (handler_cpu != cpu)
    fail("sched_getcpu() in a signal handler answered wrong", cpu, handler_cpu);
  if (handler_getcpu_cpu != cpu)
    fail("getcpu() in a signal handler answered wrong", cpu, handler_getcpu_cpu);
  if (handler_errno != ERRNO_SENTINEL)
    fail("a call in a signal handler changed errno", cpu, handler_errno);
  return NULL;
}

static int last_allowed_cpu(void) {
  int last = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) last = cpu;
  }
  return last;
}

static int run_check(void) {
  enum { kEarlyThreads = 2 };
  pthread_t early[kEarlyThreads];
  if (pthread_barrier_init(&start_line, NULL, kEarlyThreads + 1) != 0) return 2;
  for (int i = 0; i < kEarlyThreads; ++i) {
    if (pthread_create(&early[i], NULL, early_thread, NULL) != 0) return 2;
  }

  const int checked = check_every_cpu();
  pthread_barrier_wait(&start_line);
  for (int i = 0; i < kEarlyThreads; ++i) pthread_join(early[i], NULL);

  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGUSR1, &action, NULL) != 0) return 2;
  int signal_cpu = last_allowed_cpu();
  pthread_t signalled;
  if (pthread_create(&signalled, NULL, signalled_thread, &signal_cpu) != 0) return 2;
  pthread_join(signalled, NULL);

  fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    check_every_cpu();
    print_calls();
    exit(atomic_load(&failures) == 0 ? 0 : 1);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return 2;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("the forked child's checks failed", -1, status);

  print_calls();
  printf("checked %d CPUs: %s\n", checked, atomic_load(&failures) == 0 ? "ok" : "FAILED");
  return atomic_load(&failures) == 0 && checked > 0 ? 0 : 1;
}

/* For runs where every CPU-number source fails. */
static int run_fail(void) {
  errno = 0;
  const int cpu = counted_sched_getcpu();
  const int sched_errno = errno;
  unsigned c = 0, n = 0;
  errno = 0;
  const int rc = counted_getcpu(&c, &n);
  const int getcpu_errno = errno;
  errno = 0;
  const int rc_cpu_only = counted_getcpu(&c, NULL);
  const int getcpu_cpu_only_errno = errno;
  printf("sched_getcpu=%d errno=%s\n", cpu,
         strerrorname_np(sched_errno) ? strerrorname_np(sched_errno) : "0");
  printf("getcpu=%d errno=%s\n", rc,
         strerrorname_np(getcpu_errno) ? strerrorname_np(getcpu_errno) : "0");
  printf("getcpu_cpu_only=%d errno=%s\n", rc_cpu_only,
         strerrorname_np(getcpu_cpu_only_errno) ? strerrorname_np(getcpu_cpu_only_errno) : "0");
  print_calls();
  return cpu == -1 && rc == -1 && rc_cpu_only == -1 ? 0 : 1;
}

/* struct rseq as the kernel defines it; declared here so that the probe
 * builds against kernel headers of any age. */
struct probe_rseq {
  uint32_t cpu_id_start;
  int32_t cpu_id;
  uint64_t rseq_cs;
  uint32_t flags;
  int32_t node_id;
  int32_t mm_cid;
  int32_t padding;
} __attribute__((aligned(32)));

static __thread struct probe_rseq own_rseq = {0, -1, 0, 0, 0, 0, 0};

/* If anything registered this thread's rseq area behind the program's back,
 * the kernel refuses a second registration with EBUSY. */
static int run_idle(void) {
  const long rc = syscall(SYS_rseq, &own_rseq, sizeof(own_rseq), 0, 0x53053053);
  printf("rseq registration by the program: %s\n", rc == 0 ? "accepted" : strerrorname_np(errno));
  /* So that a run without any trace line can still show the preload was there. */
  int mapped = 0;
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  while (maps != NULL && fgets(line, sizeof(line), maps) != NULL) {
    if (strstr(line, "libpercpu_getcpu") != NULL) mapped = 1;
  }
  if (maps != NULL) fclose(maps);
  printf("preload mapped: %s\n", mapped ? "yes" : "no");
  return rc == 0 ? 0 : 1;
}

/* Children that leave without running atexit handlers or destructors. */
static int run_exit_children(long calls) {
  for (int use_Exit = 0; use_Exit <= 1; ++use_Exit) {
    fflush(stdout);
    const pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
      for (long i = 0; i < calls; ++i) {
        if (counted_sched_getcpu() < 0) fail("sched_getcpu() failed", -1, i);
      }
      print_calls();
      if (use_Exit) _Exit(atomic_load(&failures) == 0 ? 0 : 1);
      _exit(atomic_load(&failures) == 0 ? 0 : 1);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child) return 2;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fail("a child that leaves with _exit failed", -1, status);
    }
  }
  return atomic_load(&failures) == 0 ? 0 : 1;
}

static int run_loop(long iterations, int raw_syscall) {
  struct timespec start, stop;
  unsigned long sum = 0;
  clock_gettime(CLOCK_MONOTONIC, &start);
  if (raw_syscall) {
    for (long i = 0; i < iterations; ++i) {
      unsigned cpu = 0;
      syscall(SYS_getcpu, &cpu, NULL, NULL);
      sum += cpu;
    }
  } else {
    for (long i = 0; i < iterations; ++i) sum += (unsigned)sched_getcpu();
  }
  clock_gettime(CLOCK_MONOTONIC, &stop);
  const double ns =
      (double)(stop.tv_sec - start.tv_sec) * 1e9 + (double)(stop.tv_nsec - start.tv_nsec);
  /* Printing the sum keeps the calls from being optimised away. */
  printf("loop ns_per_call=%.3f checksum=%lu\n", ns / (double)iterations, sum);
  return 0;
}

int main(int argc, char** argv) {
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    perror("getcpu_probe: sched_getaffinity");
    return 2;
  }
  if (argc == 2 && strcmp(argv[1], "check") == 0) return run_check();
  if (argc == 2 && strcmp(argv[1], "fail") == 0) return run_fail();
  if (argc == 2 && strcmp(argv[1], "idle") == 0) return run_idle();
  if (argc == 3 && strcmp(argv[1], "exit-children") == 0) {
    char* end = NULL;
    const long n = strtol(argv[2], &end, 10);
    if (end != argv[2] && *end == '\0' && n > 0) return run_exit_children(n);
  }
  if (argc == 3 && (strcmp(argv[1], "loop") == 0 || strcmp(argv[1], "syscall-loop") == 0)) {
    char* end = NULL;
    const long n = strtol(argv[2], &end, 10);
    if (end != argv[2] && *end == '\0' && n > 0) return run_loop(n, argv[1][0] == 's');
  }
  fprintf(stderr,
          "usage: getcpu_probe check | fail | idle | exit-children N | loop N | syscall-loop N\n");
  return 2;
}
