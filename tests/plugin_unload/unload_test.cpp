// A plugin that uses percpu is loaded, used and unloaded; the process must
// live on. Two plugins: one linking libpercpu.a statically, one linking a
// shared percpu. The kernel keeps using what percpu handed it on every thread
// that ran a critical section: the descriptor the thread's rseq_cs still
// points at, which is the plugin's in both (inline sections are compiled
// into their caller), and (when percpu registered) the rseq area in the
// static TLS of the object holding the library. Were those pages gone, the
// next preemption or signal would make the kernel fault on them and kill the
// process.
//
// Usage: unload_test PLUGIN. Prints one line per check; exit status 0 only
// when every check passed. Does not link percpu itself.
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {

volatile sig_atomic_t g_signals = 0;
void on_signal(int) { g_signals = g_signals + 1; }

// Loads, uses and unloads the plugin, then makes the kernel look at this
// thread's rseq area many times: signals (handled before return to user
// space) and yields (context switches). Returns 0 on success.
int load_use_unload(const char* path) {
  void* plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (plugin == nullptr) {
    std::printf("FAIL dlopen: %s\n", dlerror());
    return 1;
  }
  using count_fn = long (*)(int, int);
  auto count = reinterpret_cast<count_fn>(dlsym(plugin, "plugin_count"));
  if (count == nullptr) {
    std::printf("FAIL dlsym\n");
    return 1;
  }
  const int threads = 3, adds = 20000;
  const long total = count(threads, adds);
  // Nothing between the plugin's last section and dlclose gives the kernel a
  // reason to clear the thread's rseq_cs (no blocking, no printing).
  dlclose(plugin);
  std::printf("plugin counted %ld\n", total);
  if (total != static_cast<long>(threads + 1) * adds) {
    std::printf("FAIL plugin count %ld\n", total);
    return 1;
  }
  for (int i = 0; i < 2000; ++i) {
    raise(SIGUSR1);
    sched_yield();
  }
  std::thread t([] {
    for (int i = 0; i < 200; ++i) raise(SIGUSR1);
  });
  t.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: unload_test PLUGIN\n");
    return 2;
  }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigaction(SIGUSR1, &sa, nullptr);
  int failed = 0, passed = 0;
  // In a child, so that a kill by the kernel is a reported failure.
  for (int round = 0; round < 3; ++round) {
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
      const int rc = load_use_unload(argv[1]);
      std::fflush(stdout);
      _exit(rc);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      ++passed;
      std::printf("round %d: the process lived on after dlclose\n", round);
    } else if (WIFSIGNALED(status)) {
      ++failed;
      std::printf("FAIL round %d: killed by signal %d after dlclose\n", round, WTERMSIG(status));
    } else {
      ++failed;
      std::printf("FAIL round %d: exit status %d\n", round, WEXITSTATUS(status));
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
