/* /init of the aarch64-system lane's initramfs (scripts/lanes/aarch64-system.sh).
 *
 * Runs as PID 1 of a Debian arm64 kernel booted by qemu-system-aarch64. It
 *   1. mounts proc, sysfs, devtmpfs and devpts (/tmp is part of the writable
 *      initramfs root);
 *   2. prints the kernel version, the CPUs online and the auxiliary vector's
 *      rseq fields;
 *   3. proves rseq works in this kernel: glibc registered its area for this
 *      (static) program, and the area's cpu_id follows the thread from CPU
 *      to CPU as it is pinned to each in turn;
 *   4. runs every test listed in /lane/runs (written by make_manifest.cmake
 *      from the build's ctest list), each on a pseudo-terminal so its output
 *      streams line by line, with its own environment and time limit;
 *   5. prints one PASS/FAIL line per run and a summary line, then powers off.
 *
 * Every line of its own starts with TAG ("aarch64-system:" unless the lane
 * builds it with another) so the host script can
 * tell them from the tests' output. A run passes when it exits 0 and, where
 * the manifest says rseq must serve it, its printed mode shows that rseq did:
 * a test that silently fell back fails here even if its own checks passed.
 *
 * /lane/runs is a list of blocks:
 *   run NAME          starts a block
 *   timeout SECONDS
 *   cwd DIR
 *   env NAME=VALUE    (any number)
 *   arg WORD          (argv[0] first; any number)
 *   mode              the program prints its rseq mode ("owner=...")
 *   rseq              rseq must serve this run (no "owner=none", backend rseq
 *                     unless PERCPU_BACKEND forces another)
 *   end
 *
 * Given a path argument and not running as PID 1, it runs that manifest
 * without mounting or powering off (for trying it under qemu-aarch64).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/rseq.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

/* Each lane that boots this /init builds it with its own -DTAG. */
#ifndef TAG
#define TAG "aarch64-system: "
#endif
#define MAX_ARGS 64
#define MAX_ENVS 32
#define MAX_WORD 512

#ifndef AT_RSEQ_FEATURE_SIZE
#define AT_RSEQ_FEATURE_SIZE 27
#endif
#ifndef AT_RSEQ_ALIGN
#define AT_RSEQ_ALIGN 28
#endif

struct run {
  char name[MAX_WORD];
  char cwd[MAX_WORD];
  int timeout;
  int mode;          /* must print "owner=" */
  int rseq;          /* rseq must serve it */
  int nargs, nenvs;
  char* args[MAX_ARGS + 1];
  char* envs[MAX_ENVS + 1];
};

/* What a run printed about its mode (first occurrence of each). */
struct seen {
  char owner[32];
  char backend[32];
  int owner_none;    /* any "owner=none" anywhere */
  char line[1024];
  size_t len;
};

static void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(TAG, stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  fflush(stdout);
  va_end(ap);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void mount_or_say(const char* source, const char* target, const char* type) {
  mkdir(target, 0755);
  if (mount(source, target, type, 0, NULL) != 0 && errno != EBUSY) {
    say("cannot mount %s on %s: %s", type, target, strerror(errno));
  }
}

static void copy_word(char* to, size_t size, const char* from) {
  size_t n = 0;
  while (from[n] != '\0' && from[n] != ',' && from[n] != ' ' && from[n] != '\r' &&
         from[n] != ':' && n + 1 < size) {
    to[n] = from[n];
    n++;
  }
  to[n] = '\0';
}

static void scan_line(struct seen* s) {
  const char* p;
  s->line[s->len] = '\0';
  if ((p = strstr(s->line, "owner=")) != NULL) {
    if (strncmp(p + 6, "none", 4) == 0) s->owner_none = 1;
    if (s->owner[0] == '\0') copy_word(s->owner, sizeof s->owner, p + 6);
  }
  if (s->backend[0] == '\0') {
    if ((p = strstr(s->line, "backend=")) != NULL) {
      copy_word(s->backend, sizeof s->backend, p + 8);
    } else if (strstr(s->line, "C API checked") != NULL && (p = strstr(s->line, "backend ")) != NULL) {
      copy_word(s->backend, sizeof s->backend, p + 8);
    }
  }
  s->len = 0;
}

static void feed(struct seen* s, const char* data, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (data[i] == '\n') {
      scan_line(s);
    } else if (s->len + 1 < sizeof s->line) {
      s->line[s->len++] = data[i];
    }
  }
}

static const char* env_value(const struct run* r, const char* name) {
  size_t n = strlen(name);
  for (int i = 0; i < r->nenvs; i++) {
    if (strncmp(r->envs[i], name, n) == 0 && r->envs[i][n] == '=') return r->envs[i] + n + 1;
  }
  return NULL;
}

/* Runs one test on a pseudo-terminal; returns 1 when it passed. */
static int execute(const struct run* r) {
  say("RUN %s", r->name);
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
    say("FAIL %s (cannot open a pseudo-terminal: %s)", r->name, strerror(errno));
    return 0;
  }
  const char* slave_name = ptsname(master);
  const double start = now();
  const pid_t child = fork();
  if (child < 0) {
    say("FAIL %s (fork: %s)", r->name, strerror(errno));
    close(master);
    return 0;
  }
  if (child == 0) {
    setsid();
    int slave = open(slave_name, O_RDWR);
    if (slave < 0) _exit(126);
    struct termios raw;
    if (tcgetattr(slave, &raw) == 0) {
      cfmakeraw(&raw);
      tcsetattr(slave, TCSANOW, &raw);
    }
    dup2(slave, 0);
    dup2(slave, 1);
    dup2(slave, 2);
    if (slave > 2) close(slave);
    close(master);
    clearenv();
    setenv("PATH", "/bin", 1);
    setenv("HOME", "/tmp", 1);
    setenv("TMPDIR", "/tmp", 1);
    for (int i = 0; i < r->nenvs; i++) putenv(r->envs[i]);
    if (r->cwd[0] != '\0' && chdir(r->cwd) != 0) {
      fprintf(stderr, "cannot enter %s: %s\n", r->cwd, strerror(errno));
      _exit(126);
    }
    execv(r->args[0], r->args);
    fprintf(stderr, "cannot run %s: %s\n", r->args[0], strerror(errno));
    _exit(127);
  }

  struct seen s;
  memset(&s, 0, sizeof s);
  int status = 0, exited = 0, eof = 0, timed_out = 0;
  double exited_at = 0;
  char buf[4096];
  for (;;) {
    struct pollfd pfd = {master, POLLIN, 0};
    if (!eof && poll(&pfd, 1, 100) > 0) {
      ssize_t n = read(master, buf, sizeof buf);
      if (n > 0) {
        fwrite(buf, 1, (size_t)n, stdout);
        fflush(stdout);
        feed(&s, buf, (size_t)n);
      } else if (n == 0 || errno != EINTR) {
        eof = 1;  /* EIO: every slave descriptor is closed */
      }
    } else if (eof) {
      usleep(50000);
    }
    /* As PID 1 this reaps every orphan too, not only the test. */
    pid_t done;
    int st;
    while ((done = waitpid(-1, &st, WNOHANG)) > 0) {
      if (done == child) {
        status = st;
        exited = 1;
        exited_at = now();
      }
    }
    if (exited && (eof || now() - exited_at > 2.0)) break;
    if (!exited && now() - start > r->timeout) {
      kill(-child, SIGKILL);
      kill(child, SIGKILL);
      timed_out = 1;
      waitpid(child, &status, 0);
      exited = 1;
      exited_at = now();
    }
  }
  if (s.len > 0) scan_line(&s);
  close(master);
  /* Whatever the test left behind in its session goes too. */
  kill(-child, SIGKILL);
  const double seconds = now() - start;

  char why[256] = "";
  if (timed_out) {
    snprintf(why, sizeof why, "timed out after %d s", r->timeout);
  } else if (WIFSIGNALED(status)) {
    snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(status));
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(status));
  } else if (r->mode && s.owner[0] == '\0') {
    snprintf(why, sizeof why, "printed no rseq mode line");
  } else if (r->rseq && s.owner_none) {
    snprintf(why, sizeof why, "rseq expected but the run reported owner=none");
  } else if (r->rseq && env_value(r, "PERCPU_BACKEND") == NULL && s.backend[0] != '\0' &&
             strcmp(s.backend, "rseq") != 0) {
    snprintf(why, sizeof why, "rseq expected but the run was served by %s", s.backend);
  } else if (env_value(r, "PERCPU_EXPECT_OWNER") != NULL && s.owner[0] != '\0' &&
             strcmp(env_value(r, "PERCPU_EXPECT_OWNER"), s.owner) != 0) {
    snprintf(why, sizeof why, "owner %s, expected %s", s.owner,
             env_value(r, "PERCPU_EXPECT_OWNER"));
  }
  const int passed = why[0] == '\0';
  say("%s %s (%.1f s, owner=%s, backend=%s%s%s)", passed ? "PASS" : "FAIL", r->name, seconds,
      s.owner[0] ? s.owner : "-", s.backend[0] ? s.backend : "-", passed ? "" : ": ", why);
  return passed;
}

static char* dup_or_die(const char* text) {
  char* copy = strdup(text);
  if (copy == NULL) {
    say("out of memory");
    exit(1);
  }
  return copy;
}

/* Pins the thread to each CPU in turn and checks glibc's rseq area follows. */
static int check_rseq(int cpus) {
  if (__rseq_size == 0) {
    say("rseq NOT registered: glibc's registration failed in this kernel (__rseq_size=0)");
    return 0;
  }
  const struct rseq* area =
      (const struct rseq*)((char*)__builtin_thread_pointer() + __rseq_offset);
  char report[256] = "";
  int ok = 1;
  for (int cpu = 0; cpu < cpus && cpu < 8; cpu++) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) {
      say("cannot pin to CPU %d: %s", cpu, strerror(errno));
      ok = 0;
      continue;
    }
    unsigned kernel_cpu = 0;
    syscall(SYS_getcpu, &kernel_cpu, NULL, NULL);
    const int rseq_cpu = (int)*(volatile const unsigned*)&area->cpu_id;
    size_t len = strlen(report);
    snprintf(report + len, sizeof report - len, " cpu%d:rseq=%d,getcpu=%u", cpu, rseq_cpu,
             kernel_cpu);
    if (rseq_cpu != cpu || (int)kernel_cpu != cpu) ok = 0;
  }
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int cpu = 0; cpu < cpus && cpu < CPU_SETSIZE; cpu++) CPU_SET(cpu, &all);
  sched_setaffinity(0, sizeof all, &all);
  if (ok) {
    say("rseq registered by glibc (__rseq_size=%u, __rseq_offset=%ld); its cpu_id follows "
        "migration:%s",
        __rseq_size, (long)__rseq_offset, report);
  } else {
    say("rseq area does NOT follow the CPU:%s", report);
  }
  return ok;
}

static void finish(int pid1, int code) {
  fflush(stdout);
  if (pid1) {
    sync();
    reboot(RB_POWER_OFF);
    for (;;) pause();
  }
  exit(code);
}

int main(int argc, char** argv) {
  const int pid1 = getpid() == 1;
  const char* manifest = argc > 1 ? argv[1] : "/lane/runs";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (pid1) {
    mount_or_say("proc", "/proc", "proc");
    mount_or_say("sysfs", "/sys", "sysfs");
    mount_or_say("devtmpfs", "/dev", "devtmpfs");
    mount_or_say("devpts", "/dev/pts", "devpts");
    /* No tmpfs on /tmp: the initramfs root is already writable memory, and
       the test binaries may live under /tmp (the host's build directory is
       mirrored into the image path for path). */
    /* A test that crashes the console must not take init down with it. */
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
  }

  struct utsname u;
  if (uname(&u) != 0) {
    say("uname failed: %s", strerror(errno));
    finish(pid1, 1);
  }
  say("kernel %s %s %s %s", u.sysname, u.release, u.version, u.machine);
  const int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
  say("cpus online: %d", cpus);
  const unsigned long feature_size = getauxval(AT_RSEQ_FEATURE_SIZE);
  const unsigned long align = getauxval(AT_RSEQ_ALIGN);
  if (feature_size != 0) {
    say("AT_RSEQ_FEATURE_SIZE=%lu AT_RSEQ_ALIGN=%lu", feature_size, align);
  } else {
    say("AT_RSEQ_FEATURE_SIZE not provided (kernel before 6.3: the original 20-byte rseq ABI)");
  }
  const int rseq_ok = check_rseq(cpus);

  FILE* f = fopen(manifest, "r");
  if (f == NULL) {
    say("cannot read %s: %s", manifest, strerror(errno));
    say("0 passed, 1 failed");
    finish(pid1, 1);
  }
  int passed = 0, failed = 0, listed = 0;
  const double start = now();
  struct run r;
  int in_run = 0;
  char line[2 * MAX_WORD];
  while (fgets(line, sizeof line, f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    char* value = strchr(line, ' ');
    if (value != NULL) *value++ = '\0';
    else value = line + strlen(line);
    if (strcmp(line, "run") == 0) {
      memset(&r, 0, sizeof r);
      snprintf(r.name, sizeof r.name, "%s", value);
      r.timeout = 300;
      in_run = 1;
    } else if (!in_run) {
      continue;
    } else if (strcmp(line, "timeout") == 0) {
      r.timeout = atoi(value) > 0 ? atoi(value) : 300;
    } else if (strcmp(line, "cwd") == 0) {
      snprintf(r.cwd, sizeof r.cwd, "%s", value);
    } else if (strcmp(line, "env") == 0 && r.nenvs < MAX_ENVS) {
      r.envs[r.nenvs++] = dup_or_die(value);
    } else if (strcmp(line, "arg") == 0 && r.nargs < MAX_ARGS) {
      r.args[r.nargs++] = dup_or_die(value);
    } else if (strcmp(line, "mode") == 0) {
      r.mode = 1;
    } else if (strcmp(line, "rseq") == 0) {
      r.rseq = 1;
    } else if (strcmp(line, "end") == 0) {
      in_run = 0;
      listed++;
      if (r.nargs == 0) {
        say("FAIL %s (no command in the manifest)", r.name);
        failed++;
      } else if (execute(&r)) {
        passed++;
      } else {
        failed++;
      }
      for (int i = 0; i < r.nargs; i++) free(r.args[i]);
      for (int i = 0; i < r.nenvs; i++) free(r.envs[i]);
    }
  }
  fclose(f);
  if (listed == 0) {
    say("the manifest %s lists no runs", manifest);
    failed++;
  }
  if (!rseq_ok) failed++;
  say("runs finished in %.0f s", now() - start);
  say("%d passed, %d failed", passed, failed);
  finish(pid1, failed == 0 ? 0 : 1);
  return 0;
}
