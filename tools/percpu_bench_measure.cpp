// Running the rows: calibration, pinning, repetitions, the --threads mode, the
// rseq-off child process, the environment header and the disassembly.

#include <dlfcn.h>
#include <link.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "percpu/cpu.hpp"
#include "percpu/internal/fallback.hpp"
#include "tools/percpu_bench.hpp"

extern char** environ;

namespace percpu {
namespace bench {
namespace {

// Calibration stops growing its probe once a probe lasts this long.
constexpr double kCalibrationNs = 2e6;
constexpr std::uint64_t kMinCalls = 1000;

const std::vector<method_info> kMethods = {
    {"glibc_sched_getcpu", "glibc sched_getcpu():", table::glibc,
     percpu_bench_loop_glibc_sched_getcpu, true, false, true},
    {kRseqOffRow, "glibc sched_getcpu(), rseq off [child]:", table::glibc, nullptr, false, false,
     true},
    {"percpu_sched_getcpu", "percpu_sched_getcpu() (out of line):", table::glibc,
     percpu_bench_loop_percpu_sched_getcpu, false, false, true},
    {"cpu_id", "percpu::cpu_id() (inline load):", table::glibc, percpu_bench_loop_cpu_id, false,
     false, true},
    {"vdso_getcpu", "raw vDSO getcpu():", table::glibc, percpu_bench_loop_vdso_getcpu, false, false,
     true},
    {"rdpid", "RDPID instruction:", table::glibc, percpu_bench_loop_rdpid, false, false, true},
    {"rdtscp", "RDTSCP instruction:", table::glibc, percpu_bench_loop_rdtscp, false, false, true},
    {"syscall_getcpu", "getcpu system call:", table::glibc, percpu_bench_loop_syscall_getcpu, false,
     false, true},
    {"thread_local", "thread_local int read (the limit):", table::glibc,
     percpu_bench_loop_thread_local, false, true, true},
    {"get_cpu_id_before", "Before", table::arm64, percpu_bench_loop_get_cpu_id_before, false, false,
     false},
    {"get_cpu_id_after", "After", table::arm64, percpu_bench_loop_get_cpu_id_after, false, false,
     false},
    {"empty_call", "Empty call", table::arm64, percpu_bench_loop_empty_call, false, false, false},
};

clockid_t g_clock = CLOCK_THREAD_CPUTIME_ID;
// Both clocks over every timed loop, for the on-CPU share in the report.
std::atomic<std::uint64_t> g_total_clock_ns{0};
std::atomic<std::uint64_t> g_total_wall_ns{0};

double read_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

bool available(const method_info& m, std::string* why) {
  const char* reason = nullptr;
  const std::string name = m.name;
  if (name == "vdso_getcpu") {
    internal::fallback_usable(cpu_backend::vdso, &reason);
  } else if (name == "rdpid") {
    internal::fallback_usable(cpu_backend::rdpid, &reason);
  } else if (name == "syscall_getcpu") {
    internal::fallback_usable(cpu_backend::syscall, &reason);
  } else if (name == "rdtscp") {
#if defined(__x86_64__)
    if (!cpu_has_rdtscp()) reason = "the CPU does not report RDTSCP";
#else
    reason = "RDTSCP is an x86-64 instruction";
#endif
  } else if (name == "glibc_sched_getcpu" || name == "get_cpu_id_before") {
    if (sched_getcpu() < 0) reason = "glibc sched_getcpu() fails here";
  }
  if (reason != nullptr) *why = reason;
  return reason == nullptr;
}

// The number of calls per repetition: --calls, or fewer for a slow row so one
// repetition fits the budget. The probe doubles as a warm-up.
std::uint64_t fit_calls(loop_fn loop, std::uint64_t cap) {
  pin_guard pin(sched_getcpu());
  std::uint64_t n = std::min<std::uint64_t>(cap, kMinCalls);
  double elapsed = time_loop(loop, n);
  while (elapsed < kCalibrationNs && n < cap) {
    n = std::min<std::uint64_t>(cap, n * 4);
    elapsed = time_loop(loop, n);
  }
  const double per_call = std::max(elapsed / static_cast<double>(n), 1e-3);
  const double fitted = kRepetitionBudgetNs / per_call;
  if (fitted >= static_cast<double>(cap)) return cap;
  return std::max<std::uint64_t>(std::min(cap, kMinCalls), static_cast<std::uint64_t>(fitted));
}

// Progress on stderr: only when stderr is a terminal and the run is expected
// to last long enough for the silence to be confusing.
class progress {
 public:
  explicit progress(double expected_ns)
      : enabled_(isatty(STDERR_FILENO) == 1 && expected_ns > 1e9) {}
  void show(const char* what, const char* row, int repetition, int repetitions) {
    if (!enabled_) return;
    std::fprintf(stderr, "\r\033[Kpercpu-bench: %s %s, repetition %d/%d", what, row, repetition + 1,
                 repetitions);
    std::fflush(stderr);
  }
  void done() {
    if (!enabled_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
};

// GLIBC_TUNABLES for the child: the caller's tunables plus rseq off.
std::string tunables_with_rseq_off() {
  std::string value = "glibc.pthread.rseq=0";
  if (const char* existing = std::getenv("GLIBC_TUNABLES")) {
    if (*existing != '\0') value = std::string(existing) + ":" + value;
  }
  return value;
}

// The rseq-off row: glibc's sched_getcpu() as it was before glibc read rseq,
// which is the seed's baseline. glibc decides at start-up whether to
// register, so this can only be measured in a fresh process.
void measure_rseq_off_child(const options& opts, measurement* row) {
  if (opts.threads) {
    row->reason = "measured in single-thread runs only";
    return;
  }
  if (rseq_ownership() != rseq_owner::glibc) {
    row->reason = "glibc does not register rseq in this process, so the baseline row is this";
    return;
  }
  const std::string self = self_path();
  std::string out;
  const int status = run_capture(
      {self, "--calls", std::to_string(opts.calls), "--repetitions",
       std::to_string(opts.repetitions), "--clock", opts.clock, "--internal-child", kRseqOffRow},
      {"GLIBC_TUNABLES=" + tunables_with_rseq_off()}, false, &out);
  std::istringstream in(out);
  std::string owner;
  std::uint64_t calls = 0;
  std::vector<double> elapsed;
  in >> owner >> calls;
  double value;
  while (in >> value) elapsed.push_back(value);
  if (status != 0 || calls == 0 || elapsed.size() != static_cast<std::size_t>(opts.repetitions)) {
    row->reason = "the child process failed";
    return;
  }
  if (owner == "glibc") {
    row->reason = "GLIBC_TUNABLES did not turn glibc's rseq registration off";
    return;
  }
  row->available = true;
  row->calls = calls;
  row->elapsed_ns = elapsed;
  row->note = "measured in a child process run with GLIBC_TUNABLES=glibc.pthread.rseq=0";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, implementer, part;
  while (std::getline(in, line)) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (key == "model name" && !value.empty()) return value;
    if (key == "CPU implementer" && implementer.empty()) implementer = value;
    if (key == "CPU part" && part.empty()) part = value;
  }
  if (!implementer.empty() || !part.empty()) {
    return "CPU implementer " + implementer + ", CPU part " + part;
  }
  return "unknown";
}

}  // namespace

// The loop's duration on the chosen clock. The thread's CPU clock (the
// default) leaves out the time other programs held the CPU, which on a busy
// machine would otherwise land on whichever row happened to be running.
double time_loop(loop_fn loop, std::uint64_t n) {
  const double wall_start = read_ns(CLOCK_MONOTONIC);
  const double start = read_ns(g_clock);
  loop(n);
  const double elapsed = read_ns(g_clock) - start;
  const double wall = read_ns(CLOCK_MONOTONIC) - wall_start;
  g_total_clock_ns += static_cast<std::uint64_t>(elapsed);
  g_total_wall_ns += static_cast<std::uint64_t>(wall);
  return elapsed;
}

void use_clock(const options& opts) {
  g_clock = opts.clock == "wall" ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
}

// Pins the calling thread to one CPU for its lifetime and restores the
// previous mask afterwards, so a repetition is not split across CPUs.
pin_guard::pin_guard(int cpu) {
  CPU_ZERO(&saved_);
  if (cpu < 0 || sched_getaffinity(0, sizeof(saved_), &saved_) != 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  pinned_ = sched_setaffinity(0, sizeof(one), &one) == 0;
}

pin_guard::~pin_guard() {
  if (pinned_) sched_setaffinity(0, sizeof(saved_), &saved_);
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

// Runs argv with `extra_env` added, capturing stdout. Returns the exit status
// (or -1 when the program could not be started).
int run_capture(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
                bool search_path, std::string* out) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    bool replaced = false;
    for (const std::string& x : extra_env) {
      const std::string key = x.substr(0, x.find('=') + 1);
      if (std::strncmp(*e, key.c_str(), key.size()) == 0) replaced = true;
    }
    if (!replaced) env_storage.push_back(*e);
  }
  for (const std::string& x : extra_env) env_storage.push_back(x);
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = search_path
                     ? posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data())
                     : posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return -1;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out->append(buf, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void barrier::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  const long generation = generation_;
  if (++arrived_ == parties_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != generation; });
}

const std::vector<method_info>& methods() { return kMethods; }

std::vector<std::string> only_names() {
  std::vector<std::string> names;
  for (const method_info& m : kMethods) {
    if (m.where == table::glibc) names.push_back(m.name);
  }
  names.push_back(kArm64Group);
  return names;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

double measurement::median_ns() const { return median(elapsed_ns); }

double measurement::min_ns() const {
  double lo = elapsed_ns.empty() ? 0 : elapsed_ns.front();
  for (double v : elapsed_ns) lo = std::min(lo, v);
  for (const auto& cpu : per_cpu_elapsed_ns) {
    for (double v : cpu) lo = std::min(lo, v);
  }
  return lo;
}

double measurement::max_ns() const {
  double hi = 0;
  for (double v : elapsed_ns) hi = std::max(hi, v);
  for (const auto& cpu : per_cpu_elapsed_ns) {
    for (double v : cpu) hi = std::max(hi, v);
  }
  return hi;
}

environment gather_environment() {
  environment env;
  char date[64];
  const time_t t = time(nullptr);
  tm utc;
  gmtime_r(&t, &utc);
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &utc);
  env.date = date;
  env.cpu_model = cpu_model();
  env.cpus_online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  env.cpus_allowed = static_cast<int>(allowed_cpus().size());
  utsname u;
  if (uname(&u) == 0) {
    env.kernel = std::string(u.sysname) + " " + u.release;
    env.machine = u.machine;
  }
  env.glibc = gnu_get_libc_version();
#if defined(__clang__)
  env.compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  env.compiler = std::string("g++ ") + __VERSION__;
#else
  env.compiler = __VERSION__;
#endif
#if defined(__OPTIMIZE__)
  env.optimized = true;
#endif
  env.cpu_id_backend = to_string(backend());  // registers first if due
  env.rseq_owner = to_string(rseq_ownership());
  env.rseq_feature_size = rseq_feature_size();
  env.concurrency_id_source = to_string(concurrency_id_source());
  env.fallback_backend = to_string(fallback_backend());
  env.rseq_sections = to_string(sections_status());
  return env;
}

double on_cpu_share() {
  const std::uint64_t wall = g_total_wall_ns.load();
  if (wall == 0 || g_clock != CLOCK_THREAD_CPUTIME_ID) return 0;
  return static_cast<double>(g_total_clock_ns.load()) / static_cast<double>(wall);
}

std::vector<measurement> measure(const options& opts) {
  use_clock(opts);
  std::vector<measurement> rows;
  for (const method_info& m : kMethods) {
    const std::string key = m.where == table::arm64 ? kArm64Group : m.name;
    if (!opts.only.empty() &&
        std::find(opts.only.begin(), opts.only.end(), key) == opts.only.end()) {
      continue;
    }
    measurement row;
    row.method = &m;
    if (m.loop != nullptr) row.available = available(m, &row.reason);
    rows.push_back(row);
  }

  // Calibrate every in-process row, and estimate the whole run's length.
  double expected_ns = 0;
  for (measurement& row : rows) {
    if (row.method->loop == nullptr) {
      expected_ns += kRepetitionBudgetNs * opts.repetitions;
      continue;
    }
    if (!row.available) continue;
    if (row.method->fitted_calls) {
      row.calls = fit_calls(row.method->loop, opts.calls);
    } else {
      row.calls = opts.calls;
    }
    const std::uint64_t probe = std::min<std::uint64_t>(row.calls, kMinCalls);
    const double per_call = time_loop(row.method->loop, probe) / static_cast<double>(probe);
    expected_ns += per_call * static_cast<double>(row.calls) * opts.repetitions;
  }
  progress bar(expected_ns);

  // Repetitions are the outer loop, so slow drifts in the machine's load hit
  // every row alike and the ratios within a repetition stay comparable.
  if (!opts.threads) {
    for (int rep = 0; rep < opts.repetitions; ++rep) {
      for (measurement& row : rows) {
        if (!row.available || row.method->loop == nullptr) continue;
        bar.show("measuring", row.method->name, rep, opts.repetitions);
        pin_guard pin(sched_getcpu());
        row.elapsed_ns.push_back(time_loop(row.method->loop, row.calls));
      }
    }
  } else {
    const std::vector<int> cpus = allowed_cpus();
    const int workers = static_cast<int>(cpus.size());
    for (measurement& row : rows) {
      if (!row.available || row.method->loop == nullptr) continue;
      row.cpus = cpus;
      row.per_cpu_elapsed_ns.assign(cpus.size(), std::vector<double>(opts.repetitions, 0));
    }
    barrier start(workers);
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        pin_guard pin(cpus[w]);
        for (int rep = 0; rep < opts.repetitions; ++rep) {
          for (measurement& row : rows) {
            if (!row.available || row.method->loop == nullptr) continue;
            if (w == 0) bar.show("measuring on every CPU", row.method->name, rep, opts.repetitions);
            start.wait();
            row.per_cpu_elapsed_ns[w][rep] = time_loop(row.method->loop, row.calls);
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (measurement& row : rows) {
      for (int rep = 0; rep < opts.repetitions && !row.per_cpu_elapsed_ns.empty(); ++rep) {
        std::vector<double> across;
        for (const auto& cpu : row.per_cpu_elapsed_ns) across.push_back(cpu[rep]);
        row.elapsed_ns.push_back(median(across));
      }
    }
  }

  for (measurement& row : rows) {
    if (row.method->loop != nullptr) continue;
    bar.show("measuring in a child process", row.method->name, 0, 1);
    measure_rseq_off_child(opts, &row);
  }
  bar.done();
  return rows;
}

int run_child(const options& opts) {
  if (opts.child_row != kRseqOffRow) return 2;
  use_clock(opts);
  const loop_fn loop = percpu_bench_loop_glibc_sched_getcpu;
  const std::uint64_t calls = fit_calls(loop, opts.calls);
  std::printf("%s %" PRIu64, to_string(rseq_ownership()), calls);
  for (int rep = 0; rep < opts.repetitions; ++rep) {
    pin_guard pin(sched_getcpu());
    std::printf(" %.1f", time_loop(loop, calls));
  }
  std::printf("\n");
  return 0;
}

// ---------------------------------------------------------------------------
// Disassembly of the functions as built.

namespace {

// The size of the function at `address`, from the symbol table the dynamic
// loader already holds (the measured functions are exported for this).
std::uint64_t loaded_symbol_size(const void* address) {
  Dl_info info;
  void* entry = nullptr;
  if (dladdr1(address, &info, &entry, RTLD_DL_SYMENT) == 0 || entry == nullptr) return 0;
  return static_cast<const ElfW(Sym)*>(entry)->st_size;
}

// Parses objdump's "  addr:\tinsn" lines into "<+off>:\tinsn", and marks the
// lines a conditional backward branch repeats (the loop body) with '*'.
std::vector<std::string> format_objdump(const std::string& text, bool mark_loop) {
  struct insn {
    std::uint64_t addr;
    std::string text;
  };
  std::vector<insn> insns;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t colon = line.find(":\t");
    if (colon == std::string::npos) continue;
    const std::string addr_text = line.substr(0, colon);
    const std::size_t first = addr_text.find_first_not_of(' ');
    if (first == std::string::npos ||
        addr_text.find_first_not_of("0123456789abcdef", first) != std::string::npos) {
      continue;
    }
    std::string body = line.substr(colon + 2);
    while (!body.empty() && (body.back() == ' ' || body.back() == '\t')) body.pop_back();
    if (body.empty()) continue;
    insns.push_back({std::strtoull(addr_text.c_str() + first, nullptr, 16), body});
  }
  // Offsets count from the function's first instruction.
  const std::uint64_t start = insns.empty() ? 0 : insns.front().addr;
  std::vector<bool> in_loop(insns.size(), false);
  for (std::size_t i = 0; mark_loop && i < insns.size(); ++i) {
    // Only conditional branches back close a loop; an unconditional jump back
    // is a slow path rejoining the main line.
    const std::string& body = insns[i].text;
    const std::string mnemonic = body.substr(0, body.find_first_of(" \t"));
    const bool branch = (mnemonic[0] == 'j' && mnemonic != "jmp") ||
                        mnemonic.compare(0, 2, "b.") == 0 || mnemonic == "cbz" ||
                        mnemonic == "cbnz" || mnemonic == "tbz" || mnemonic == "tbnz";
    const std::size_t lt = body.find(" <");
    if (!branch || lt == std::string::npos) continue;
    std::size_t begin = body.find_last_of(" \t,", lt - 1);
    begin = begin == std::string::npos ? 0 : begin + 1;
    const std::uint64_t target = std::strtoull(body.substr(begin, lt - begin).c_str(), nullptr, 16);
    if (target < start || target > insns[i].addr) continue;
    for (std::size_t j = 0; j <= i; ++j) {
      if (insns[j].addr >= target) in_loop[j] = true;
    }
  }
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < insns.size(); ++i) {
    char prefix[48];
    std::snprintf(prefix, sizeof(prefix), "%s <+%" PRIu64 ">:", in_loop[i] ? " *" : "  ",
                  insns[i].addr - start);
    std::string padded = prefix;
    padded.resize(std::max<std::size_t>(padded.size() + 1, 12), ' ');
    lines.push_back(padded + insns[i].text);
  }
  return lines;
}

disassembly disassemble(const std::string& title, const std::string& symbol, const void* address,
                        const std::string& file, bool is_loop = false) {
  disassembly d;
  d.title = title;
  d.symbol = symbol;
  d.file = file;
  // objdump finds the symbol itself, in .symtab or, in a stripped binary,
  // .dynsym, and stops at its end.
  const std::string only = "--disassemble=" + symbol;
#if defined(__x86_64__)
  const char* cross = "x86_64-linux-gnu-objdump";
#elif defined(__aarch64__)
  const char* cross = "aarch64-linux-gnu-objdump";
#else
  const char* cross = "objdump";
#endif
  for (const char* tool : {"objdump", cross}) {
    std::string out;
    if (run_capture({tool, "-d", "--no-show-raw-insn", only, file}, {}, true, &out) != 0) {
      continue;
    }
    d.lines = format_objdump(out, is_loop);
    if (!d.lines.empty()) {
      d.how = std::string(tool) + " -d";
      return d;
    }
  }
  const std::uint64_t size = loaded_symbol_size(address);
  if (size == 0) {
    d.how = "not shown: no objdump on PATH disassembled " + symbol + " in " + file +
            ", and the loader knows no size for it";
    return d;
  }
  // No disassembler that reads this architecture: the raw bytes, as loaded.
  d.how = "raw bytes as loaded (no objdump for this architecture found on PATH)";
  const auto* bytes = static_cast<const unsigned char*>(address);
  for (std::uint64_t off = 0; off < size; off += 16) {
    char line[128];
    int n = std::snprintf(line, sizeof(line), "   <+%" PRIu64 ">:\t", off);
    for (std::uint64_t i = off; i < std::min(size, off + 16); ++i) {
      n += std::snprintf(line + n, sizeof(line) - static_cast<std::size_t>(n), "%02x ", bytes[i]);
    }
    d.lines.push_back(line);
  }
  return d;
}

std::string library_of(const void* address) {
  Dl_info info;
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace

std::vector<disassembly> disassemble_fast_paths() {
  const std::string self = self_path();
  const auto* glibc_fn = reinterpret_cast<const void*>(&sched_getcpu);
  return {
      disassemble("glibc sched_getcpu(), which Before calls", "sched_getcpu", glibc_fn,
                  library_of(glibc_fn)),
      disassemble("get_cpu_id() Before: return sched_getcpu();", "percpu_bench_get_cpu_id_before",
                  reinterpret_cast<const void*>(&percpu_bench_get_cpu_id_before), self),
      disassemble("get_cpu_id() After: return percpu::cpu_id();", "percpu_bench_get_cpu_id_after",
                  reinterpret_cast<const void*>(&percpu_bench_get_cpu_id_after), self),
      disassemble("the percpu::cpu_id() row's loop", "percpu_bench_loop_cpu_id",
                  reinterpret_cast<const void*>(&percpu_bench_loop_cpu_id), self, true),
      disassemble("the thread_local row's loop (the limit)", "percpu_bench_loop_thread_local",
                  reinterpret_cast<const void*>(&percpu_bench_loop_thread_local), self, true),
  };
}

}  // namespace bench
}  // namespace percpu
