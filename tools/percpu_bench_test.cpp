// percpu-bench as a user meets it: the binary is run as a child process and
// judged by its exit status, its text and its JSON. No test looks at speed:
// the figures must be there, positive, consistent with each other and in the
// order the tool printed them, whatever they are.

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cinttypes>
#include <utility>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "percpu/cpu.hpp"
#include "tools/percpu_bench.hpp"
#include "tests/support/expected_backend.hpp"
#include "tests/support/files.hpp"

extern char** environ;

namespace {

struct run_output {
  int status = -1;
  std::string out;
  std::string err;
};

using percpu::bench::kSanitizerBuild;
using percpu::test::read_file;
using percpu::test::temp_path;

// Runs `program args...` with stdout and stderr captured in files (not
// terminals, so percpu-bench must stay silent on stderr).
run_output run(const std::string& program, const std::vector<std::string>& args) {
  const std::string out_path = temp_path("percpu_bench_out");
  const std::string err_path = temp_path("percpu_bench_err");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_TRUNC, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_TRUNC, 0);
  std::vector<std::string> all = {program};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  run_output r;
  pid_t pid;
  if (posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ) == 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&actions);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return r;
}

run_output bench(const std::vector<std::string>& args) { return run(PERCPU_BENCH_BINARY, args); }

// Whether the dynamic loader can find `name` where Debian installs it: then
// percpu-bench must measure the rows of that allocator.
bool library_installed(const std::string& name) {
#if defined(__x86_64__)
  const std::string triplet = "x86_64-linux-gnu";
#elif defined(__aarch64__)
  const std::string triplet = "aarch64-linux-gnu";
#else
  const std::string triplet = "none";
#endif
  for (const std::string& dir : {"/usr/lib/" + triplet, "/lib/" + triplet, std::string("/usr/lib"),
                                 std::string("/usr/local/lib")}) {
    if (access((dir + "/" + name).c_str(), R_OK) == 0) return true;
  }
  return false;
}

using json = nlohmann::json;

// Strict parsing: malformed output fails the test that reads it.
bool parse_json(const std::string& text, json* out) {
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !out->is_discarded();
}

const std::vector<std::string> kAllRows = {"glibc_sched_getcpu",
                                           "glibc_sched_getcpu_rseq_off",
                                           "percpu_sched_getcpu",
                                           "cpu_id",
                                           "vdso_getcpu",
                                           "rdpid",
                                           "rdtscp",
                                           "syscall_getcpu",
                                           "thread_local",
                                           "get_cpu_id_before",
                                           "get_cpu_id_after",
                                           "empty_call"};

std::string two_decimals(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}
std::string one_decimal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// The printed line that starts with `label`, or "".
std::string line_starting(const std::string& text, const std::string& label) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, label.size(), label) == 0) return line;
  }
  return "";
}

// ---------------------------------------------------------------------------
// The command line.

TEST(PercpuBenchCli, HelpListsEveryOptionAndExitsZero) {
  const run_output r = bench({"--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* flag : {"--calls", "--repetitions", "--threads", "--clock", "--only", "--json",
                           "--svg", "--gbench-json"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from:\n" << r.out;
  }
  EXPECT_EQ(r.out.find("--internal-child"), std::string::npos) << "the child mode is internal";
  EXPECT_EQ(r.err, "");
}

struct bad_input {
  std::vector<std::string> args;
  const char* must_mention;
};

class PercpuBenchBadInput : public ::testing::TestWithParam<bad_input> {};

TEST_P(PercpuBenchBadInput, ClearErrorUsageAndExitTwo) {
  const run_output r = bench(GetParam().args);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("percpu-bench: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(GetParam().must_mention), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Usage"), std::string::npos) << "no usage in:\n" << r.err;
  EXPECT_EQ(r.out, "") << "nothing may be measured after bad input";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PercpuBenchBadInput,
    ::testing::Values(bad_input{{"--bogus"}, "--bogus"}, bad_input{{"--calls", "0"}, "--calls"},
                      bad_input{{"--calls", "abc"}, "abc"}, bad_input{{"--calls", "-5"}, "-5"},
                      bad_input{{"--calls", "1e3x"}, "1e3x"}, bad_input{{"--calls"}, "--calls"},
                      bad_input{{"--repetitions", "0"}, "--repetitions"},
                      bad_input{{"--repetitions", "two"}, "two"},
                      bad_input{{"--only", "nosuch"}, "nosuch"},
                      bad_input{{"--only", "cpu_id,nosuch"}, "nosuch"},
                      bad_input{{"stray"}, "stray"}, bad_input{{"--threads=maybe"}, "--threads"},
                      bad_input{{"--clock", "sundial"}, "sundial"},
                      bad_input{{"--gbench-json"}, "--gbench-json"}));

// The help promises exit status 1 when an output file cannot be written.
// A path that cannot be written is found before anything is measured.
class PercpuBenchUnwritable : public ::testing::TestWithParam<const char*> {};

TEST_P(PercpuBenchUnwritable, ExitsOneBeforeMeasuring) {
  const std::string flag = GetParam();
  const run_output r = bench({"--calls", "2000", "--repetitions", "1", "--only", "cpu_id", flag,
                              "/nonexistent-percpu-dir/out"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("percpu-bench: error: cannot write /nonexistent-percpu-dir/out: "
                       "directory /nonexistent-percpu-dir does not exist or is not writable"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("Usage"), std::string::npos) << "not a usage error:\n" << r.err;
  EXPECT_EQ(r.out, "") << "nothing is measured for a file that cannot be written";
}

// A file that fails only when written (a full disk): the tables are already
// on stdout, the error names the file, and the status is still 1.
TEST_P(PercpuBenchUnwritable, FailingAtTheEndKeepsTheTables) {
  const std::string flag = GetParam();
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full to fill";
  const run_output r =
      bench({"--calls", "2000", "--repetitions", "1", "--only", "cpu_id", flag, "/dev/full"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("percpu-bench: cannot write /dev/full: No space left on device"),
            std::string::npos)
      << r.err;
  EXPECT_NE(line_starting(r.out, "percpu::cpu_id() (inline load):"), "") << r.out;
  EXPECT_NE(r.out.find("Total run time:"), std::string::npos) << "the tables are whole";
}

INSTANTIATE_TEST_SUITE_P(Outputs, PercpuBenchUnwritable,
                         ::testing::Values("--json", "--svg", "--gbench-json"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param + 2) == "gbench-json"
                                      ? std::string("gbench_json")
                                      : std::string(info.param + 2);
                         });

TEST(PercpuBenchCli, OnlyMeasuresTheNamedRows) {
  const run_output r =
      bench({"--calls", "2000", "--repetitions", "2", "--only", "cpu_id,thread_local"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "") << "stderr is not a terminal: no progress expected";
  EXPECT_NE(line_starting(r.out, "percpu::cpu_id() (inline load):"), "");
  EXPECT_NE(line_starting(r.out, "thread_local int read (the limit):"), "");
  EXPECT_EQ(line_starting(r.out, "getcpu system call:"), "");
  EXPECT_EQ(line_starting(r.out, "glibc sched_getcpu():"), "");
  EXPECT_NE(r.out.find("3. The arm64 seed's table"), std::string::npos);
  EXPECT_NE(r.out.find("(not selected)"), std::string::npos);
}

TEST(PercpuBenchCli, OnlyAcceptsRepeatedNamesAndTheWallClock) {
  const run_output r = bench(
      {"--calls=1500", "--repetitions=1", "--only", "arm64", "--only=rdtscp", "--clock", "wall"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| Before |   1500"), std::string::npos) << r.out;
  EXPECT_NE(line_starting(r.out, "RDTSCP instruction:"), "");
  EXPECT_EQ(line_starting(r.out, "percpu::cpu_id() (inline load):"), "");
  EXPECT_NE(r.out.find("Clock:              wall"), std::string::npos);
}

// ---------------------------------------------------------------------------
// One full run, judged through its JSON, text and SVG.

class PercpuBenchFullRun : public ::testing::Test {
 protected:
  static constexpr int kRepetitions = 3;
  static constexpr std::uint64_t kCalls = 20000;

  static void SetUpTestSuite() {
    json_path_ = new std::string(temp_path("percpu_bench_json"));
    svg_path_ = new std::string(temp_path("percpu_bench_svg"));
    output_ = new run_output(
        bench({"--calls", std::to_string(kCalls), "--repetitions", std::to_string(kRepetitions),
               "--json", *json_path_, "--svg", *svg_path_}));
    root_ = new json;
    parsed_ = parse_json(read_file(*json_path_), root_);
  }
  static void TearDownTestSuite() {
    unlink(json_path_->c_str());
    unlink(svg_path_->c_str());
    delete json_path_;
    delete svg_path_;
    delete output_;
    delete root_;
  }
  void SetUp() override {
    ASSERT_EQ(output_->status, 0) << output_->err;
    ASSERT_TRUE(parsed_) << "the JSON does not parse:\n" << read_file(*json_path_);
  }

  static std::string* json_path_;
  static std::string* svg_path_;
  static run_output* output_;
  static json* root_;
  static bool parsed_;
};

std::string* PercpuBenchFullRun::json_path_ = nullptr;
std::string* PercpuBenchFullRun::svg_path_ = nullptr;
run_output* PercpuBenchFullRun::output_ = nullptr;
json* PercpuBenchFullRun::root_ = nullptr;
bool PercpuBenchFullRun::parsed_ = false;

TEST_F(PercpuBenchFullRun, JsonHoldsEveryMethodInPrintedOrder) {
  const json& methods = root_->at("methods");
  ASSERT_EQ(methods.size(), kAllRows.size());
  for (std::size_t i = 0; i < kAllRows.size(); ++i) {
    EXPECT_EQ(methods[i].at("name").get<std::string>(), kAllRows[i]);
  }
  // The glibc table prints its rows in the JSON's order.
  std::size_t last = 0;
  for (const json& m : methods) {
    if (m.at("table").get<std::string>() != "glibc") continue;
    const std::size_t at = output_->out.find("\n" + m.at("label").get<std::string>());
    ASSERT_NE(at, std::string::npos) << m.at("label").get<std::string>() << " not printed";
    EXPECT_GT(at, last) << m.at("label").get<std::string>() << " printed out of order";
    last = at;
  }
}

TEST_F(PercpuBenchFullRun, FiguresArePositiveAndConsistent) {
  for (const json& m : root_->at("methods")) {
    SCOPED_TRACE(m.at("name").get<std::string>());
    if (!m.at("available").get<bool>()) {
      EXPECT_FALSE(m.at("reason").get<std::string>().empty()) << "n/a needs a reason";
      EXPECT_FALSE(m.contains("ns_per_call")) << "an unavailable method must carry no figure";
      continue;
    }
    const double ns = m.at("ns_per_call").get<double>();
    EXPECT_GT(ns, 0);
    EXPECT_LE(m.at("min_ns_per_call").get<double>(), ns);
    EXPECT_GE(m.at("max_ns_per_call").get<double>(), ns);
    const double calls = m.at("calls_per_repetition").get<double>();
    EXPECT_GT(calls, 0);
    EXPECT_LE(calls, static_cast<double>(kCalls));
    if (m.at("table").get<std::string>() == "arm64") {
      EXPECT_EQ(calls, static_cast<double>(kCalls));
    }
    const json& elapsed = m.at("elapsed_ns");
    ASSERT_EQ(elapsed.size(), static_cast<std::size_t>(kRepetitions));
    for (const json& e : elapsed) EXPECT_GT(e.get<double>(), 0);
    EXPECT_NEAR(m.at("median_elapsed_ns").get<double>() / calls, ns, ns * 1e-9);
  }
}

TEST_F(PercpuBenchFullRun, CoreMethodsAreAlwaysMeasured) {
  for (const json& m : root_->at("methods")) {
    const std::string name = m.at("name").get<std::string>();
    if (name == "glibc_sched_getcpu" || name == "percpu_sched_getcpu" || name == "cpu_id" ||
        name == "thread_local" || name == "get_cpu_id_before" || name == "get_cpu_id_after" ||
        name == "empty_call") {
      EXPECT_TRUE(m.at("available").get<bool>())
          << name << ": " << (m.contains("reason") ? m.at("reason").get<std::string>() : "");
    }
    // The hardware and vDSO rows: measured exactly where this host offers
    // them (tests/support/expected_backend.hpp), with the reason otherwise.
    const std::pair<const char*, percpu::cpu_backend> offered_rows[] = {
        {"rdpid", percpu::cpu_backend::rdpid},
        {"vdso_getcpu", percpu::cpu_backend::vdso},
        {"syscall_getcpu", percpu::cpu_backend::syscall}};
    for (const auto& [row, backend] : offered_rows) {
      if (name != row) continue;
      const bool offered = percpu::test::host_offers(backend);
      std::printf("%s: %s\n", row,
                  offered ? "offered here, checked measured"
                          : (std::string("not offered (") + percpu::test::why_not_offered(backend) +
                             "), checked n/a with a reason")
                                .c_str());
      EXPECT_EQ(m.at("available").get<bool>(), offered) << row;
      EXPECT_EQ(m.contains("reason"), !offered) << row;
    }
    if (name == "rdtscp") {
      bool has_rdtscp = false;
#if defined(__x86_64__)
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      has_rdtscp = __get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx) && (edx & (1u << 27)) != 0;
#endif
      std::printf("rdtscp: the CPU %s it, checked %s\n", has_rdtscp ? "reports" : "does not report",
                  has_rdtscp ? "measured" : "n/a");
      EXPECT_EQ(m.at("available").get<bool>(), has_rdtscp);
    }
  }
}

TEST_F(PercpuBenchFullRun, JsonMatchesThePrintedTables) {
  for (const json& m : root_->at("methods")) {
    SCOPED_TRACE(m.at("name").get<std::string>());
    if (m.at("table").get<std::string>() == "glibc") {
      const std::string line = line_starting(output_->out, m.at("label").get<std::string>());
      ASSERT_NE(line, "");
      if (!m.at("available").get<bool>()) {
        EXPECT_NE(line.find("n/a (" + m.at("reason").get<std::string>() + ")"), std::string::npos)
            << line;
        continue;
      }
      EXPECT_NE(line.find(" " + two_decimals(m.at("ns_per_call").get<double>()) + " ns"),
                std::string::npos)
          << line;
      EXPECT_NE(line.find(two_decimals(m.at("min_ns_per_call").get<double>()) + "-" +
                          two_decimals(m.at("max_ns_per_call").get<double>())),
                std::string::npos)
          << line;
      char calls[32];
      std::snprintf(calls, sizeof(calls), " %" PRIu64,
                    static_cast<std::uint64_t>(m.at("calls_per_repetition").get<double>()));
      EXPECT_NE(line.find(calls), std::string::npos) << line;
    } else if (m.at("name").get<std::string>() != "empty_call") {
      const std::string row =
          m.at("name").get<std::string>() == "get_cpu_id_before" ? "| Before |" : "| After  |";
      const std::string line = line_starting(output_->out, "      " + row);
      ASSERT_NE(line, "");
      const std::string taken =
          std::to_string(std::llround(m.at("median_elapsed_ns").get<double>())) + "ns";
      EXPECT_NE(line.find(taken), std::string::npos) << line << " vs " << taken;
    }
  }
  const std::string speedup_line = line_starting(output_->out, "percpu::cpu_id() (inline load):");
  for (const json& m : root_->at("methods")) {
    if (m.at("name").get<std::string>() == "cpu_id" && m.contains("speedup_vs_baseline") &&
        m.at("speedup_vs_baseline").get<double>() >= 1) {
      char expected[48];
      std::snprintf(expected, sizeof(expected), "(speedup: %4.1fx)",
                    m.at("speedup_vs_baseline").get<double>());
      EXPECT_NE(speedup_line.find(expected), std::string::npos) << speedup_line;
    }
  }
}

// The ratios are shown beside the seed patch's own, not as goals the user
// must meet: the tool has no business grading the user's machine.
TEST_F(PercpuBenchFullRun, RatiosAreShownBesideTheSeedsNotAsGoals) {
  EXPECT_EQ(output_->out.find("goal:"), std::string::npos) << output_->out;
  const json& bar = root_->at("bar");
  ASSERT_FALSE(bar.empty());
  bool any_seed = false;
  for (const json& b : bar) {
    EXPECT_FALSE(b.contains("met")) << b.at("check").get<std::string>();
    const std::string line = line_starting(output_->out, "   " + b.at("check").get<std::string>());
    ASSERT_NE(line, "") << b.at("check").get<std::string>() << " not printed";
    EXPECT_NE(line.find(two_decimals(b.at("ratio").get<double>()) + "x"), std::string::npos)
        << line;
    if (b.at("seed_ratio").is_number()) {
      any_seed = true;
      char seed[48];
      std::snprintf(seed, sizeof(seed), "(the seed's: %.1fx)", b.at("seed_ratio").get<double>());
      EXPECT_NE(line.find(seed), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(any_seed) << "the glibc seed's ratios are shown when glibc's row is measured";
}

TEST_F(PercpuBenchFullRun, EnvironmentIsThisProcesssEnvironment) {
  const json& env = root_->at("environment");
  EXPECT_EQ(env.at("rseq_owner").get<std::string>(), percpu::to_string(percpu::rseq_ownership()));
  EXPECT_EQ(env.at("rseq_sections").get<std::string>(),
            percpu::to_string(percpu::sections_status()));
  const std::string sections = percpu::to_string(percpu::sections_status());
  EXPECT_NE(output_->out.find(
                "rseq sections:      " + (sections == "on" ? sections : "off: " + sections) + "\n"),
            std::string::npos)
      << "the Environment block says whether the structures run rseq sections";
  EXPECT_EQ(env.at("rseq_feature_size").get<double>(),
            static_cast<double>(percpu::rseq_feature_size()));
  const std::string source = percpu::to_string(percpu::concurrency_id_source());
  EXPECT_EQ(env.at("concurrency_id_source").get<std::string>(), source);
  EXPECT_NE(output_->out.find("concurrency_id():   " + source + " "), std::string::npos)
      << "the Environment block says what concurrency_id() answers";
  EXPECT_EQ(env.at("cpu_id_backend").get<std::string>(), percpu::to_string(percpu::backend()));
  for (const char* key : {"date", "cpu_model", "kernel", "machine", "glibc", "compiler"}) {
    EXPECT_FALSE(env.at(key).get<std::string>().empty()) << key;
    EXPECT_NE(output_->out.find(env.at(key).get<std::string>()), std::string::npos)
        << key << " not printed";
  }
  EXPECT_GT(env.at("cpus_online").get<double>(), 0);
  EXPECT_EQ(root_->at("options").at("calls").get<double>(), static_cast<double>(kCalls));
}

TEST_F(PercpuBenchFullRun, DisassemblyShowsTheFastPaths) {
  const json& listings = root_->at("disassembly");
  ASSERT_FALSE(listings.empty());
  for (const json& d : listings) {
    EXPECT_FALSE(d.at("lines").empty())
        << d.at("symbol").get<std::string>() << ": " << d.at("how").get<std::string>();
    EXPECT_NE(output_->out.find("Dump of assembler code for function " +
                                d.at("symbol").get<std::string>()),
              std::string::npos);
  }
}

TEST_F(PercpuBenchFullRun, SvgNamesEveryRow) {
  const std::string svg = read_file(*svg_path_);
  EXPECT_EQ(svg.compare(0, 5, "<?xml"), 0);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("linear scale"), std::string::npos);
  for (const json& m : root_->at("methods")) {
    if (m.at("available").get<bool>()) {
      EXPECT_NE(svg.find(two_decimals(m.at("ns_per_call").get<double>()) + " ns"),
                std::string::npos)
          << m.at("name").get<std::string>();
    } else {
      EXPECT_NE(svg.find("n/a: "), std::string::npos) << m.at("name").get<std::string>();
    }
  }
}

// An independent parser: the JSON and the SVG must satisfy Python's too.
// Without a Python 3 that CMake found, the test is reported as skipped
// rather than left out of the count.
TEST_F(PercpuBenchFullRun, PythonParsesJsonAndSvg) {
#if !defined(PERCPU_BENCH_PYTHON)
  GTEST_SKIP() << "CMake found no Python 3 interpreter (find_package(Python3)): "
                  "the JSON and SVG were not checked by an independent parser";
#else
  const run_output r =
      run(PERCPU_BENCH_PYTHON, {"-c",
                                "import json, sys, xml.etree.ElementTree as ET\n"
                                "d = json.load(open(sys.argv[1]))\n"
                                "assert len(d['methods']) == 12, len(d['methods'])\n"
                                "ET.parse(sys.argv[2])\n"
                                "print('ok')\n",
                                *json_path_, *svg_path_});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ok\n");
#endif
}

// ---------------------------------------------------------------------------
// --gbench-json: Google Benchmark's own tools/compare.py reads the run. Its
// "filters" mode sets two rows of one run against each other; --dump_to_json
// writes what it compared, which must be the figures percpu-bench wrote.

TEST(PercpuBenchGbench, CompareReadsTheRun) {
#if !defined(PERCPU_GBENCH_COMPARE) || !defined(PERCPU_GBENCH_PYTHON)
  GTEST_SKIP() << "Google Benchmark's compare.py (Debian: libbenchmark-tools) or a Python 3 "
                  "with scipy (python3-scipy) was not found at configure time: the format is "
                  "checked field by field in percpu_bench_report_test only";
#else
  const std::string path = temp_path("percpu_bench_gbench");
  const std::string diff_path = temp_path("percpu_bench_gbench_diff");
  const run_output r = bench({"--calls", "20000", "--repetitions", "3", "--only",
                              "cpu_id,thread_local", "--gbench-json", path});
  ASSERT_EQ(r.status, 0) << r.err;
  json written;
  ASSERT_TRUE(parse_json(read_file(path), &written)) << read_file(path);
  const run_output c =
      run(PERCPU_GBENCH_PYTHON, {PERCPU_GBENCH_COMPARE, "--no-utest", "--no-color", "-d", diff_path,
                                 "filters", path, "cpu_id", "thread_local"});
  json diff;
  const bool parsed = parse_json(read_file(diff_path), &diff);
  unlink(path.c_str());
  unlink(diff_path.c_str());
  ASSERT_EQ(c.status, 0) << c.out << c.err;
  EXPECT_NE(c.out.find("[cpu_id vs. thread_local]"), std::string::npos) << c.out;
  ASSERT_TRUE(parsed);
  std::map<std::string, std::vector<double>> times;  // run name -> cpu_time per repetition
  for (const json& b : written.at("benchmarks")) {
    if (b.at("run_type") == "iteration") {
      times[b.at("name").get<std::string>()].push_back(b.at("cpu_time").get<double>());
    }
  }
  bool compared = false;
  for (const json& d : diff) {
    if (d.at("name") != "[cpu_id vs. thread_local]") continue;
    compared = true;
    ASSERT_EQ(d.at("measurements").size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      const json& m = d.at("measurements")[i];
      EXPECT_DOUBLE_EQ(m.at("cpu_time").get<double>(), times["cpu_id"][i]);
      EXPECT_DOUBLE_EQ(m.at("cpu_time_other").get<double>(), times["thread_local"][i]);
      EXPECT_DOUBLE_EQ(m.at("real_time").get<double>(), times["cpu_id"][i]);
    }
  }
  EXPECT_TRUE(compared) << c.out;
#endif
}

// ---------------------------------------------------------------------------
// --structures: every structure against its alternative, with and without
// rseq, in the text, the JSON and the SVG.

TEST(PercpuBenchStructures, TableJsonAndSvgHoldEveryRow) {
  const std::string json_path = temp_path("percpu_bench_structures_json");
  const std::string svg_path = temp_path("percpu_bench_structures_svg");
  const run_output r = bench({"--structures", "--calls", "300", "--repetitions", "2", "--json",
                              json_path, "--svg", svg_path});
  ASSERT_EQ(r.status, 0) << r.err;
  json root;
  ASSERT_TRUE(parse_json(read_file(json_path), &root)) << read_file(json_path);
  const std::string svg = read_file(svg_path);
  unlink(json_path.c_str());
  unlink(svg_path.c_str());
  EXPECT_NE(r.out.find("2. percpu's structures against what they replace"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("The glibc seed's table"), std::string::npos) << "--structures replaces it";
  EXPECT_TRUE(root.at("options").at("structures").get<bool>());
  EXPECT_TRUE(root.at("methods").empty());

  // Each kind, and the allocator its alternative's malloc comes from (empty:
  // the C library's, in this process).
  const std::vector<std::pair<std::string, std::string>> kinds = {
      {"counter_add", ""},
      {"free_list_push_pop", ""},
      {"object_pool_allocate_deallocate", ""},
      {"shared_mutex_read", ""},
      {"shared_mutex_write", ""},
      {"ref_get_put", ""},
      {"ref_get_put_killed", ""},
      {"object_pool_vs_tcmalloc", "libtcmalloc_minimal.so.4"},
      {"object_pool_vs_jemalloc", "libjemalloc.so.2"},
      {"object_pool_vs_mimalloc", "libmimalloc.so.2"},
      {"object_pool_burst_vs_tcmalloc", "libtcmalloc_minimal.so.4"},
      {"object_pool_burst_vs_jemalloc", "libjemalloc.so.2"},
      {"object_pool_burst_vs_mimalloc", "libmimalloc.so.2"},
      {"object_pool_handoff_vs_tcmalloc", "libtcmalloc_minimal.so.4"},
      {"object_pool_handoff_vs_jemalloc", "libjemalloc.so.2"},
      {"object_pool_handoff_vs_mimalloc", "libmimalloc.so.2"}};
  const json& rows = root.at("structures");
  ASSERT_EQ(rows.size(), kinds.size() * 2);
  // This process's rseq decides whether the "with rseq" column can exist;
  // the child without rseq must work everywhere the filter can be installed.
  const bool have_rseq = percpu::backend() == percpu::cpu_backend::rseq;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    SCOPED_TRACE(row.at("name").get<std::string>() + " x" +
                 std::to_string(static_cast<int>(row.at("threads").get<double>())));
    EXPECT_EQ(row.at("name").get<std::string>(), kinds[i / 2].first);
    EXPECT_EQ(row.at("threads").get<double>(), static_cast<double>(1 + i % 2));
    const std::string& library = kinds[i / 2].second;
    for (const char* mode : {"with_rseq", "without_rseq"}) {
      const json& m = row.at(mode);
      const std::string reason = m.contains("reason") ? m.at("reason").get<std::string>() : "";
      if (!library.empty() && (kSanitizerBuild || !library_installed(library))) {
        // The peer's rows say why they have no figures, naming what is
        // missing (where this process has rseq to measure with at all).
        EXPECT_FALSE(m.at("available").get<bool>()) << mode;
        if (kSanitizerBuild || have_rseq || std::string(mode) == "without_rseq") {
          EXPECT_NE(reason.find(kSanitizerBuild ? std::string("sanitizer") : library),
                    std::string::npos)
              << mode << ": " << reason;
        }
        continue;
      }
      const bool expected = std::string(mode) == "without_rseq" || have_rseq;
      ASSERT_EQ(m.at("available").get<bool>(), expected) << mode << ": " << reason;
      if (!expected) continue;
      EXPECT_EQ(m.at("backend").get<std::string>() == "rseq", std::string(mode) == "with_rseq")
          << mode;
      for (const char* side : {"percpu", "alternative"}) {
        const json& s = m.at(side);
        ASSERT_TRUE(s.at("available").get<bool>()) << mode << " " << side;
        EXPECT_GT(s.at("ns_per_op").get<double>(), 0);
        EXPECT_LE(s.at("min_ns_per_op").get<double>(), s.at("ns_per_op").get<double>());
        EXPECT_GE(s.at("max_ns_per_op").get<double>(), s.at("ns_per_op").get<double>());
        EXPECT_EQ(s.at("repetitions_ns_per_op").size(), 2u);
        EXPECT_LE(s.at("calls_per_repetition").get<double>(), 300);
      }
      EXPECT_GT(m.at("ratio").get<double>(), 0);
      // The printed table shows the same medians, on the row's own line.
      const std::string line = line_starting(r.out, row.at("label").get<std::string>());
      EXPECT_NE(r.out.find(two_decimals(m.at("percpu").at("ns_per_op").get<double>()) + "  " +
                           two_decimals(m.at("percpu").at("min_ns_per_op").get<double>()) + "-"),
                std::string::npos)
          << line;
      EXPECT_NE(svg.find(two_decimals(m.at("percpu").at("ns_per_op").get<double>()) + " ns"),
                std::string::npos);
      EXPECT_NE(svg.find(two_decimals(m.at("alternative").at("ns_per_op").get<double>()) + " ns"),
                std::string::npos);
    }
  }
  EXPECT_EQ(root.at("structures_bar").size(), kinds.size() * 2);
  for (const json& b : root.at("structures_bar")) {
    EXPECT_NE(r.out.find(b.at("check").get<std::string>()), std::string::npos)
        << b.at("check").get<std::string>() << " not printed";
  }
  EXPECT_NE(svg.find("</svg>"), std::string::npos);

  // The memory table: every structure, each figure from its own child, in
  // the text, the JSON and the SVG alike.
  EXPECT_NE(r.out.find("3. Memory per instance"), std::string::npos) << r.out;
  const std::vector<std::string> memory_kinds = {"counter",      "per_cpu",   "ref",
                                                 "shared_mutex", "free_list", "object_pool"};
  const json& memory = root.at("memory");
  ASSERT_EQ(memory.size(), memory_kinds.size());
  for (std::size_t i = 0; i < memory.size(); ++i) {
    const json& m = memory[i];
    SCOPED_TRACE(memory_kinds[i]);
    EXPECT_EQ(m.at("structure").get<std::string>(), memory_kinds[i]);
    EXPECT_GT(m.at("instances").get<double>(), 0);
    for (const char* figure : {"bytes_with_rseq", "bytes_without_rseq"}) {
      ASSERT_TRUE(m.at(figure).is_number()) << figure;
      // At least the object itself, and no more than a few pages.
      EXPECT_GT(m.at(figure).get<double>(), 4) << figure;
      EXPECT_LT(m.at(figure).get<double>(), 64 * 1024) << figure;
    }
    const std::string table =
        r.out.substr(std::min(r.out.find("3. Memory per instance"), r.out.size()));
    const std::string line = line_starting(table, m.at("label").get<std::string>() + " ");
    EXPECT_NE(line.find(one_decimal(m.at("bytes_with_rseq").get<double>())), std::string::npos)
        << line;
    EXPECT_NE(svg.find(m.at("label").get<std::string>() + ": " +
                       one_decimal(m.at("bytes_with_rseq").get<double>())),
              std::string::npos);
  }
  // A std::atomic is 8 bytes: the measure must not invent overhead (but a
  // sanitizer's shadow of the heap is resident memory too).
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(memory[0].at("alternative_bytes").get<double>(), 12);
  EXPECT_LT(memory[1].at("alternative_bytes").get<double>(), 20);
#endif
  EXPECT_TRUE(memory.back().at("alternative_bytes").is_null()) << "malloc has no instances";
}

TEST(PercpuBenchStructures, RefusesThreadsAndOnly) {
  EXPECT_EQ(bench({"--structures", "--threads"}).status, 2);
  EXPECT_EQ(bench({"--structures", "--only", "cpu_id"}).status, 2);
}

// ---------------------------------------------------------------------------
// --threads: every allowed CPU measures at once.

TEST(PercpuBenchThreads, ReportsEveryAllowedCpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const std::size_t cpus = static_cast<std::size_t>(CPU_COUNT(&set));
  const std::string json_path = temp_path("percpu_bench_threads");
  const run_output r = bench({"--threads", "--calls", "3000", "--repetitions", "2", "--only",
                              "cpu_id,glibc_sched_getcpu_rseq_off,arm64", "--json", json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  json root;
  ASSERT_TRUE(parse_json(read_file(json_path), &root));
  unlink(json_path.c_str());
  EXPECT_TRUE(root.at("options").at("threads").get<bool>());
  EXPECT_NE(r.out.find("5. Per CPU"), std::string::npos);
  for (const json& m : root.at("methods")) {
    SCOPED_TRACE(m.at("name").get<std::string>());
    if (m.at("name").get<std::string>() == "glibc_sched_getcpu_rseq_off") {
      EXPECT_FALSE(m.at("available").get<bool>()) << "the child row is single-threaded only";
      continue;
    }
    ASSERT_TRUE(m.at("available").get<bool>());
    ASSERT_EQ(m.at("per_cpu").size(), cpus);
    for (const json& c : m.at("per_cpu")) {
      EXPECT_TRUE(CPU_ISSET(static_cast<int>(c.at("cpu").get<double>()), &set));
      EXPECT_GT(c.at("ns_per_call").get<double>(), 0);
      EXPECT_EQ(c.at("elapsed_ns").size(), 2u);
    }
  }
}

}  // namespace
