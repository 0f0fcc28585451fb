// Runs the unmodified C program getcpu_probe with and without
// LD_PRELOAD=libpercpu_getcpu.so and checks three things:
//   - its answers are right (the probe checks them against the raw system
//     call on every allowed CPU, in early threads, a signal handler and a
//     forked child, and exits non-zero on any mismatch);
//   - the preload's own code answered: its PERCPU_PRELOAD_TRACE line counts
//     exactly the calls the probe made, process by process, and says how many
//     came from an rseq area and whose area it was;
//   - nothing else changed: errno on failure, no registration in a program
//     that never calls it, and no exported symbol beyond the two it replaces.
//
// The paths of the probe, the preload and the seccomp helpers are compiled in.

#include <dlfcn.h>
#include <elf.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/files.hpp"

extern char** environ;

namespace {

struct run_result {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;
  std::string err;
  std::string trace;  // the preload's trace file
};

using percpu::test::read_file;
using percpu::test::temp_path;

bool is_controlled(const char* entry) {
  for (const char* name :
       {"LD_PRELOAD=", "GLIBC_TUNABLES=", "PERCPU_BACKEND=", "PERCPU_PRELOAD_TRACE="}) {
    if (std::strncmp(entry, name, std::strlen(name)) == 0) return true;
  }
  return false;
}

// Runs argv with this process's environment, minus the variables the test
// controls, plus `extra`. The trace file exists (empty) before the run.
// With `traced` false PERCPU_PRELOAD_TRACE is left unset, as users run it.
run_result run(const std::vector<std::string>& argv, std::vector<std::string> extra,
               bool traced = true) {
  run_result result;
  const std::string out_path = temp_path("probe_out");
  const std::string err_path = temp_path("probe_err");
  const std::string trace_path = temp_path("probe_trace");
  if (traced) extra.push_back("PERCPU_PRELOAD_TRACE=" + trace_path);

  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!is_controlled(*e)) env.push_back(*e);
  }
  for (const std::string& e : extra) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);

  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_TRUNC);
    const int err = open(err_path.c_str(), O_WRONLY | O_TRUNC);
    if (out < 0 || err < 0) _exit(126);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execve(args[0], args.data(), env.data());
    _exit(127);
  }
  int status = 0;
  if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  result.trace = read_file(trace_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  unlink(trace_path.c_str());
  return result;
}

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream lines(text);
  std::string l;
  while (std::getline(lines, l)) {
    if (l == line) return true;
  }
  return false;
}

std::string describe(const run_result& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err +
         "--- trace\n" + r.trace;
}

struct probe_calls {
  unsigned long sched_getcpu = 0;
  unsigned long getcpu = 0;
};

// "calls pid=P sched_getcpu=N getcpu=M", one per process that made calls.
std::map<long, probe_calls> parse_probe_calls(const std::string& out) {
  std::map<long, probe_calls> calls;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    long pid = 0;
    probe_calls c;
    if (std::sscanf(line.c_str(), "calls pid=%ld sched_getcpu=%lu getcpu=%lu", &pid,
                    &c.sched_getcpu, &c.getcpu) == 3) {
      calls[pid] = c;
    }
  }
  return calls;
}

struct trace_line {
  unsigned long sched_getcpu = 0, sched_getcpu_rseq = 0, getcpu = 0, getcpu_rseq = 0;
  int glibc_rseq = -1;
  std::string fallback;
};

std::map<long, trace_line> parse_trace(const std::string& trace) {
  std::map<long, trace_line> lines_by_pid;
  std::istringstream lines(trace);
  std::string line;
  while (std::getline(lines, line)) {
    long pid = 0;
    trace_line t;
    char fallback[32] = {};
    if (std::sscanf(line.c_str(),
                    "percpu_getcpu pid=%ld sched_getcpu=%lu sched_getcpu_rseq=%lu getcpu=%lu "
                    "getcpu_rseq=%lu glibc_rseq=%d fallback=%31s",
                    &pid, &t.sched_getcpu, &t.sched_getcpu_rseq, &t.getcpu, &t.getcpu_rseq,
                    &t.glibc_rseq, fallback) == 7) {
      t.fallback = fallback;
      lines_by_pid[pid] = t;
    }
  }
  return lines_by_pid;
}

int allowed_cpu_count() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  return CPU_COUNT(&allowed);
}

enum class expect_source { own_rseq, glibc_rseq, fallback };

// The probe passed, and for each of its processes (parent and forked child)
// the preload counted exactly the probe's calls, answered from `source`.
void expect_preload_answered(const run_result& r, expect_source source) {
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(has_line(r.out, "checked " + std::to_string(allowed_cpu_count()) + " CPUs: ok"))
      << describe(r);
  const auto probe = parse_probe_calls(r.out);
  const auto trace = parse_trace(r.trace);
  ASSERT_EQ(probe.size(), 2u) << "expected the parent's and the child's counts\n" << describe(r);
  ASSERT_EQ(trace.size(), probe.size()) << describe(r);
  for (const auto& [pid, calls] : probe) {
    const auto it = trace.find(pid);
    ASSERT_NE(it, trace.end()) << "no trace line for pid " << pid << "\n" << describe(r);
    const trace_line& t = it->second;
    EXPECT_GT(calls.sched_getcpu, 0u);
    EXPECT_EQ(t.sched_getcpu, calls.sched_getcpu) << describe(r);
    EXPECT_EQ(t.getcpu, calls.getcpu) << describe(r);
    switch (source) {
      case expect_source::own_rseq:
      case expect_source::glibc_rseq:
        EXPECT_EQ(t.glibc_rseq, source == expect_source::glibc_rseq ? 1 : 0) << describe(r);
        EXPECT_EQ(t.sched_getcpu_rseq, t.sched_getcpu) << describe(r);
        // getcpu(cpu, NULL) reads rseq; a call asking for the node does not.
        EXPECT_GT(t.getcpu_rseq, 0u) << describe(r);
        EXPECT_LT(t.getcpu_rseq, t.getcpu) << describe(r);
        break;
      case expect_source::fallback:
        EXPECT_EQ(t.sched_getcpu_rseq, 0u) << describe(r);
        EXPECT_EQ(t.getcpu_rseq, 0u) << describe(r);
        break;
    }
  }
}

const char kTunableOff[] = "GLIBC_TUNABLES=glibc.pthread.rseq=0";
const std::string kPreload = std::string("LD_PRELOAD=") + PERCPU_PRELOAD_PATH;

bool glibc_registers_rseq_here() {
  const auto* size = static_cast<const unsigned*>(dlsym(RTLD_DEFAULT, "__rseq_size"));
  return size != nullptr && *size != 0;
}

TEST(GetcpuPreload, ProbeIsRightAndUntracedWithoutThePreload) {
  // Guards the test itself: the probe passes on glibc alone, and a trace line
  // can only come from the preload.
  for (bool tunable_off : {true, false}) {
    std::vector<std::string> env;
    if (tunable_off) env.push_back(kTunableOff);
    const run_result r = run({PERCPU_PROBE_PATH, "check"}, env);
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_EQ(r.trace, "") << describe(r);
  }
}

TEST(GetcpuPreload, AnswersFromItsOwnRegistrationWhenGlibcHasNone) {
  const run_result r = run({PERCPU_PROBE_PATH, "check"}, {kPreload, kTunableOff});
  expect_preload_answered(r, expect_source::own_rseq);
}

TEST(GetcpuPreload, AnswersRightBeforeItsConstructorsRan) {
  // Allocators call sched_getcpu() from their first malloc, which may come
  // before the preload is initialised; getcpu_early_caller does that.
  for (bool tunable_off : {true, false}) {
    std::vector<std::string> env = {kPreload + ":" + PERCPU_EARLY_CALLER_PATH};
    if (tunable_off) env.push_back(kTunableOff);
    const run_result r = run({PERCPU_PROBE_PATH, "check"}, env);
    EXPECT_TRUE(has_line(r.out, "early calls: ok")) << describe(r);
    expect_preload_answered(r, tunable_off || !glibc_registers_rseq_here()
                                   ? expect_source::own_rseq
                                   : expect_source::glibc_rseq);
  }
}

TEST(GetcpuPreload, AnswersFromGlibcsRegistration) {
  const run_result r = run({PERCPU_PROBE_PATH, "check"}, {kPreload});
  // On a glibc that does not register rseq this is the own-registration case.
  expect_preload_answered(
      r, glibc_registers_rseq_here() ? expect_source::glibc_rseq : expect_source::own_rseq);
}

// Users run the preload untraced, and untraced calls take the inline path
// that every traced run above leaves for the counting slow path: the probe
// must pass there too, with glibc's rseq, percpu's own and the fallback.
TEST(GetcpuPreload, AnswersRightUntraced) {
  for (bool tunable_off : {true, false}) {
    for (bool deny_rseq : {false, true}) {
      SCOPED_TRACE(std::string(tunable_off ? "glibc's rseq off" : "glibc's rseq on") +
                   (deny_rseq ? ", rseq denied" : ""));
      std::vector<std::string> env = {kPreload};
      if (tunable_off) env.push_back(kTunableOff);
      std::vector<std::string> argv = {PERCPU_PROBE_PATH, "check"};
      if (deny_rseq) argv.insert(argv.begin(), {PERCPU_SECCOMP_EXEC_PATH, "ENOSYS"});
      const run_result r = run(argv, env, false);
      EXPECT_EQ(r.exit_code, 0) << describe(r);
      EXPECT_TRUE(has_line(r.out, "checked " + std::to_string(allowed_cpu_count()) + " CPUs: ok"))
          << describe(r);
      EXPECT_EQ(r.trace, "") << "untraced runs write no trace";
    }
  }
}

TEST(GetcpuPreload, AnswersFromTheFallbackWhenRseqFails) {
  for (bool tunable_off : {true, false}) {
    std::vector<std::string> env = {kPreload};
    if (tunable_off) env.push_back(kTunableOff);
    const run_result r = run({PERCPU_SECCOMP_EXEC_PATH, "ENOSYS", PERCPU_PROBE_PATH, "check"}, env);
    expect_preload_answered(r, expect_source::fallback);
  }
}

TEST(GetcpuPreload, AnswersFromEachForcedFallback) {
  for (const char* forced : {"rdpid", "vdso", "syscall"}) {
    const run_result r = run({PERCPU_PROBE_PATH, "check"},
                             {kPreload, kTunableOff, std::string("PERCPU_BACKEND=") + forced});
    SCOPED_TRACE(forced);
    expect_preload_answered(r, expect_source::fallback);
    // An unavailable forced choice falls to the next one and says so.
    const auto trace = parse_trace(r.trace);
    ASSERT_FALSE(trace.empty());
    const std::string used = trace.begin()->second.fallback;
    if (used != forced) {
      EXPECT_NE(r.err.find(std::string("PERCPU_BACKEND=") + forced + " is unavailable"),
                std::string::npos)
          << describe(r);
    }
  }
  // The system call is always there on Linux, so forcing it must stick.
  const run_result r =
      run({PERCPU_PROBE_PATH, "check"}, {kPreload, kTunableOff, "PERCPU_BACKEND=syscall"});
  const auto trace = parse_trace(r.trace);
  ASSERT_FALSE(trace.empty()) << describe(r);
  EXPECT_EQ(trace.begin()->second.fallback, "syscall");
}

TEST(GetcpuPreload, FailsWithTheKernelsErrnoWhenNoSourceWorks) {
  for (const char* error : {"ENOSYS", "EPERM"}) {
    SCOPED_TRACE(error);
    const run_result r = run({PERCPU_DENY_GETCPU_EXEC_PATH, error, PERCPU_PROBE_PATH, "fail"},
                             {kPreload, kTunableOff, "PERCPU_BACKEND=syscall"});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    const std::string e = std::string(" errno=") + error;
    EXPECT_TRUE(has_line(r.out, "sched_getcpu=-1" + e)) << describe(r);
    EXPECT_TRUE(has_line(r.out, "getcpu=-1" + e)) << describe(r);
    EXPECT_TRUE(has_line(r.out, "getcpu_cpu_only=-1" + e)) << describe(r);
    const auto trace = parse_trace(r.trace);
    ASSERT_EQ(trace.size(), 1u) << describe(r);
    EXPECT_EQ(trace.begin()->second.sched_getcpu, 1u) << describe(r);
    EXPECT_EQ(trace.begin()->second.getcpu, 2u) << describe(r);
  }
}

TEST(GetcpuPreload, NeverRegistersRseqInAProgramThatNeverCallsIt) {
  // The probe registers an rseq area itself; the kernel would refuse that
  // with EBUSY had anything registered the thread before.
  const run_result r = run({PERCPU_PROBE_PATH, "idle"}, {kPreload, kTunableOff});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(has_line(r.out, "rseq registration by the program: accepted")) << describe(r);
  EXPECT_TRUE(has_line(r.out, "preload mapped: yes")) << describe(r);
}

// A process that made no call writes no line: a shell script under the
// preload would otherwise add one line per command it runs.
TEST(GetcpuPreload, ProcessesWithoutCallsWriteNoLine) {
  for (bool tunable_off : {true, false}) {
    SCOPED_TRACE(tunable_off ? "glibc's rseq off" : "glibc's rseq on");
    std::vector<std::string> env = {kPreload};
    if (tunable_off) env.push_back(kTunableOff);
    // (With glibc's rseq on, the idle probe's own registration is refused,
    // which it reports; only its calls matter here.)
    const run_result idle = run({PERCPU_PROBE_PATH, "idle"}, env);
    EXPECT_TRUE(has_line(idle.out, "preload mapped: yes")) << describe(idle);
    EXPECT_EQ(idle.trace, "") << "the idle probe made no call\n" << describe(idle);
    // A shell that runs commands, none of which makes a call.
    const run_result shell = run(
        {"/bin/sh", "-c", std::string(PERCPU_PROBE_PATH) + " idle; /bin/true && /bin/true"}, env);
    EXPECT_EQ(shell.exit_code, 0) << describe(shell);
    EXPECT_TRUE(has_line(shell.out, "preload mapped: yes")) << describe(shell);
    EXPECT_EQ(shell.trace, "") << describe(shell);
  }
}

// A child that leaves with _exit() or _Exit() runs no destructor, but its
// calls are counted all the same; its parent, which made none, writes nothing.
TEST(GetcpuPreload, ChildrenThatLeaveWithExitGetTheirLine) {
  for (bool tunable_off : {true, false}) {
    SCOPED_TRACE(tunable_off ? "glibc's rseq off" : "glibc's rseq on");
    std::vector<std::string> env = {kPreload};
    if (tunable_off) env.push_back(kTunableOff);
    const run_result r = run({PERCPU_PROBE_PATH, "exit-children", "1000"}, env);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto probe = parse_probe_calls(r.out);
    const auto trace = parse_trace(r.trace);
    ASSERT_EQ(probe.size(), 2u) << "one line per child\n" << describe(r);
    EXPECT_EQ(trace.size(), probe.size()) << describe(r);
    for (const auto& [pid, calls] : probe) {
      EXPECT_EQ(calls.sched_getcpu, 1000u) << describe(r);
      const auto it = trace.find(pid);
      ASSERT_NE(it, trace.end()) << "no trace line for the child " << pid << "\n" << describe(r);
      EXPECT_EQ(it->second.sched_getcpu, 1000u) << describe(r);
      EXPECT_EQ(it->second.getcpu, 0u) << describe(r);
    }
  }
}

// The defined, global or weak symbols in the dynamic symbol table.
std::set<std::string> exported_symbols(const char* path) {
  std::set<std::string> names;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) return names;
  void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return names;
  const auto* base = static_cast<const char*>(map);
  const auto* header = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (std::memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 ||
      header->e_ident[EI_CLASS] != ELFCLASS64) {
    munmap(map, static_cast<size_t>(st.st_size));
    return names;
  }
  const auto* sections = reinterpret_cast<const Elf64_Shdr*>(base + header->e_shoff);
  for (int i = 0; i < header->e_shnum; ++i) {
    if (sections[i].sh_type != SHT_DYNSYM) continue;
    const char* strings = base + sections[sections[i].sh_link].sh_offset;
    const auto* symbols = reinterpret_cast<const Elf64_Sym*>(base + sections[i].sh_offset);
    const size_t count = sections[i].sh_size / sizeof(Elf64_Sym);
    for (size_t s = 1; s < count; ++s) {
      const int binding = ELF64_ST_BIND(symbols[s].st_info);
      if (symbols[s].st_shndx == SHN_UNDEF) continue;
      if (binding != STB_GLOBAL && binding != STB_WEAK) continue;
      names.insert(strings + symbols[s].st_name);
    }
  }
  munmap(map, static_cast<size_t>(st.st_size));
  return names;
}

TEST(GetcpuPreload, ExportsOnlyTheFunctionsItReplaces) {
  const std::set<std::string> names = exported_symbols(PERCPU_PRELOAD_PATH);
  // _exit and _Exit pass straight through to glibc's, after the trace line.
  const std::set<std::string> expected = {"getcpu", "sched_getcpu", "_exit", "_Exit"};
  EXPECT_EQ(names, expected);
}

}  // namespace
