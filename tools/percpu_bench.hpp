// percpu-bench: the tool that reproduces the two seed patches' tables (glibc's
// rseq sched_getcpu(), arm64's one-load CPU number) on the machine it runs on.
//
// Layout: percpu_bench_loops.cpp holds the timed loops; percpu_bench_measure.cpp
// gathers the environment, runs the loops and disassembles them;
// percpu_bench_report.cpp prints the text, JSON and SVG; percpu_bench_main.cpp
// parses the command line. Everything runs on the calling thread except the
// --threads measurements, which run one pinned thread per allowed CPU.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/percpu_bench_loops.hpp"

namespace percpu {
namespace bench {

// Which seed's table a row belongs to.
enum class table { glibc, arm64 };

struct method_info {
  const char* name;   // --only and JSON key
  const char* label;  // as printed in the table
  table where;
  loop_fn loop;       // null for the row measured in a child process
  bool is_baseline;   // the glibc table's reference row
  bool is_limit;      // the physical limit cpu_id() is held against
  bool fitted_calls;  // may run fewer than --calls calls to fit the time budget
};

// Every row, in printed order.
const std::vector<method_info>& methods();
// The names --only accepts: every glibc-table row, plus "arm64" for all the
// rows of the arm64 table.
std::vector<std::string> only_names();
constexpr const char* kArm64Group = "arm64";
constexpr const char* kRseqOffRow = "glibc_sched_getcpu_rseq_off";

// How long one repetition of a fitted row may take. Long enough that the
// clock's granularity and a stray interrupt vanish in the median, short
// enough that a default run stays well under a minute on two cores.
constexpr double kRepetitionBudgetNs = 100e6;

struct options {
  std::uint64_t calls = 1000000000;
  int repetitions = 5;
  bool threads = false;
  std::string clock = "cpu";      // "cpu": the thread's CPU time; "wall": CLOCK_MONOTONIC
  std::vector<std::string> only;  // empty: everything
  std::string json_path;
  std::string svg_path;
  std::vector<std::string> argv;  // the command as typed, for the record
  // Hidden: run one row and print its raw figures (the rseq-off child).
  std::string child_row;
};

struct environment {
  std::string date;  // UTC, ISO 8601
  std::string cpu_model;
  int cpus_online = 0;
  int cpus_allowed = 0;
  std::string kernel;
  std::string machine;
  std::string glibc;
  std::string compiler;
  bool optimized = false;
  std::string rseq_owner;
  unsigned rseq_feature_size = 0;
  std::string cpu_id_backend;
  std::string fallback_backend;
};

// One row's figures. Times are per repetition, for `calls` calls.
struct measurement {
  const method_info* method = nullptr;
  bool available = false;
  std::string reason;             // why not, when !available
  std::string note;               // how it was measured, when unusual
  std::uint64_t calls = 0;        // per repetition (per thread with --threads)
  std::vector<double> elapsed_ns; // per repetition; with --threads, the median over CPUs
  std::vector<int> cpus;          // with --threads: the CPU of each per_cpu entry
  std::vector<std::vector<double>> per_cpu_elapsed_ns;  // [cpu][repetition]

  double median_ns() const;  // of elapsed_ns
  double min_ns() const;     // over every figure taken (every CPU with --threads)
  double max_ns() const;
  double ns_per_call() const { return median_ns() / static_cast<double>(calls); }
  double min_ns_per_call() const { return min_ns() / static_cast<double>(calls); }
  double max_ns_per_call() const { return max_ns() / static_cast<double>(calls); }
};

struct disassembly {
  std::string title;   // what the function is
  std::string symbol;
  std::string file;
  std::string how;     // "objdump" or the fallback used, with the reason
  std::vector<std::string> lines;  // formatted "<+off>: insn", loop lines marked
};

struct run_result {
  options opts;
  environment env;
  std::vector<measurement> rows;  // selected rows, in printed order
  std::vector<disassembly> listings;
  double wall_seconds = 0;
  double on_cpu_share = 0;  // CPU time / wall time of the timed loops (cpu clock only)
};

double median(std::vector<double> values);

// percpu_bench_measure.cpp
environment gather_environment();
// Runs every selected row. Progress goes to stderr when it is a terminal
// and the work is expected to take more than about a second.
std::vector<measurement> measure(const options& opts);
// With the cpu clock: the timed loops' CPU time over their wall time, so a
// reader can see how busy the machine was; 0 with the wall clock.
double on_cpu_share();
std::vector<disassembly> disassemble_fast_paths();
// The hidden child mode: measures one row and prints its figures on stdout.
int run_child(const options& opts);

// percpu_bench_report.cpp
void print_text(const run_result& run, std::FILE* out);
bool write_json(const run_result& run, const std::string& path, std::string* error);
bool write_svg(const run_result& run, const std::string& path, std::string* error);
// The figure as the text table prints it, so tests can match JSON to text.
std::string format_ns(double ns_per_call);

}  // namespace bench
}  // namespace percpu
