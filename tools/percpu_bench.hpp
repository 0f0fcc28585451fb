// percpu-bench: the tool that reproduces the two seed patches' tables (glibc's
// rseq sched_getcpu(), arm64's one-load CPU number) on the machine it runs on.
//
// Layout: percpu_bench_loops.cpp holds the timed loops; percpu_bench_measure.cpp
// gathers the environment, runs the loops and disassembles them;
// percpu_bench_structures.cpp measures the structures (--structures);
// percpu_bench_report.cpp prints the text, JSON and SVG; percpu_bench_main.cpp
// parses the command line. Everything runs on the calling thread except the
// --threads measurements, which run one pinned thread per allowed CPU.
#pragma once

#include <sched.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
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
// The same for one side of a --structures row, per thread: shorter, since
// that table has many more figures, each of a cheap operation.
constexpr double kStructureBudgetNs = 20e6;

struct options {
  std::uint64_t calls = 1000000000;
  int repetitions = 5;
  bool threads = false;
  std::string clock = "cpu";      // "cpu": the thread's CPU time; "wall": CLOCK_MONOTONIC
  std::vector<std::string> only;  // empty: everything
  std::string json_path;
  std::string svg_path;
  std::string gbench_json_path;   // Google Benchmark's JSON format, for its compare.py
  std::vector<std::string> argv;  // the command as typed, for the record
  // Hidden: run one row and print its raw figures (the rseq-off child).
  std::string child_row;
  // The structures against their alternatives instead of the seed tables.
  bool structures = false;
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
  std::string concurrency_id_source;  // percpu::concurrency_id_source()
  std::string cpu_id_backend;
  std::string fallback_backend;
  std::string rseq_sections;  // percpu::sections_status(): "on" or why not
};

// One row's figures. Times are per repetition, for `calls` calls.
struct measurement {
  const method_info* method = nullptr;
  bool available = false;
  std::string reason;              // why not, when !available
  std::string note;                // how it was measured, when unusual
  std::uint64_t calls = 0;         // per repetition (per thread with --threads)
  std::vector<double> elapsed_ns;  // per repetition; with --threads, the median over CPUs
  std::vector<int> cpus;           // with --threads: the CPU of each per_cpu entry
  std::vector<std::vector<double>> per_cpu_elapsed_ns;  // [cpu][repetition]

  double median_ns() const;  // of elapsed_ns
  double min_ns() const;     // over every figure taken (every CPU with --threads)
  double max_ns() const;
  double ns_per_call() const { return median_ns() / static_cast<double>(calls); }
  double min_ns_per_call() const { return min_ns() / static_cast<double>(calls); }
  double max_ns_per_call() const { return max_ns() / static_cast<double>(calls); }
};

struct disassembly {
  std::string title;  // what the function is
  std::string symbol;
  std::string file;
  std::string how;                 // "objdump" or the fallback used, with the reason
  std::vector<std::string> lines;  // formatted "<+off>: insn", loop lines marked
};

// --structures: one of percpu's structures, or the alternative it replaces,
// at one thread count in one mode (with or without rseq).
struct structure_side {
  bool available = false;
  std::string reason;                 // why not, when !available
  std::uint64_t calls = 0;            // operations per thread per repetition
  std::vector<double> ns_per_op;      // per repetition: the median over the threads
  std::vector<double> all_ns_per_op;  // every thread's figure of every repetition

  double median() const;
  double min() const;  // over every thread's figure
  double max() const;
};

// What a structure is held against, and the bar the project set for it.
struct structure_kind {
  const char* name;               // JSON key
  const char* label;              // the percpu operation, as printed
  const char* alternative_label;  // the alternative's operation, as printed
  const char* short_label;        // for the bar lines
  loop_fn percpu_loop;
  loop_fn alternative_loop;
  // The least ratio (the alternative's time / percpu's, so above 1 means
  // percpu is faster) the project accepts, with rseq and without it.
  double goal_with_rseq;
  double goal_without_rseq;
  // The allocator the alternative's malloc and free come from, as the
  // dynamic loader names it ("libtcmalloc_minimal.so.4"), or nullptr for
  // the C library's. Such a row is measured in child processes of this
  // binary run with LD_PRELOAD naming it: that is how these allocators are
  // normally used (they replace malloc), and percpu's side runs in the same
  // process, alternating with it, as in every other row.
  const char* malloc_library = nullptr;
};

const std::vector<structure_kind>& structure_kinds();
// The thread counts every structure is measured at.
const std::vector<int>& structure_thread_counts();

struct structure_mode {
  bool available = false;
  std::string reason;   // why not, when !available
  std::string backend;  // cpu_id()'s backend where it was measured
  structure_side percpu;
  structure_side alternative;
  // The alternative's median time / percpu's, for every kind: above 1,
  // percpu is faster. 0 when either side is missing.
  double ratio() const;
};

struct structure_row {
  const structure_kind* kind = nullptr;
  int threads = 1;
  structure_mode with_rseq;     // in this process
  structure_mode without_rseq;  // in a child whose rseq(2) fails with ENOSYS
};

// --structures' memory table: bytes of resident memory per instance, each
// figure from a fresh run of this binary that makes `instances` objects,
// uses each once and keeps them (percpu_bench_memory.cpp). Negative: not
// measured (the reason says why).
struct memory_row {
  const char* name;               // JSON key
  const char* label;              // percpu's structure, as printed
  const char* alternative_label;  // what a user would pick instead
  long instances = 0;
  double with_rseq = -1;     // percpu's structure, in a process with rseq
  double without_rseq = -1;  // ... in one whose rseq(2) fails with ENOSYS
  double alternative = -1;
  std::string reason;  // why a figure is missing
};

struct run_result {
  options opts;
  environment env;
  std::vector<structure_row> structures;  // with --structures
  std::vector<memory_row> memory;         // with --structures
  std::vector<measurement> rows;          // selected rows, in printed order
  std::vector<disassembly> listings;
  double wall_seconds = 0;
  double on_cpu_share = 0;  // CPU time / wall time of the timed loops (cpu clock only)
};

double median(std::vector<double> values);

// Shared by the seed tables and the structures (percpu_bench_measure.cpp).
void use_clock(const options& opts);
// The loop's duration on the chosen clock (the thread's CPU time by default).
double time_loop(loop_fn loop, std::uint64_t n);
std::vector<int> allowed_cpus();
std::string self_path();
// Runs args with `extra_env` added, capturing stdout. Returns the exit
// status, or -1 when the program could not be started or was killed.
int run_capture(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
                bool search_path, std::string* out);

// Pins the calling thread to one CPU for its lifetime and restores the
// previous mask afterwards, so a repetition is not split across CPUs.
class pin_guard {
 public:
  explicit pin_guard(int cpu);
  ~pin_guard();
  pin_guard(const pin_guard&) = delete;
  pin_guard& operator=(const pin_guard&) = delete;

 private:
  cpu_set_t saved_;
  bool pinned_ = false;
};

// A reusable barrier: threads that must start each timed loop together, so
// the figures are truly taken on every CPU at once.
class barrier {
 public:
  explicit barrier(int parties) : parties_(parties) {}
  void wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int parties_;
  int arrived_ = 0;
  long generation_ = 0;
};

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

// percpu_bench_memory.cpp
// Child rows: "memory:NAME:SIDE" (SIDE percpu or alternative) measures one
// figure here; "memory-without-rseq:NAME:percpu" re-runs this binary under a
// seccomp filter that fails rseq(2) first.
constexpr const char* kMemoryChildPrefix = "memory";
std::vector<memory_row> measure_memory(const options& opts);
int run_memory_child(const options& opts);

// percpu_bench_structures.cpp
constexpr const char* kStructuresChild = "structures";
constexpr const char* kStructuresDenyChild = "structures-without-rseq";
// A child's row followed by this and a malloc_library measures only the
// rows of that allocator, which LD_PRELOAD has loaded into it.
constexpr char kMallocLibrarySeparator = '@';
// Whether this build runs under a sanitizer, whose own malloc a preloaded
// allocator cannot replace: the rows of another malloc then say so instead
// of a figure (and the tests expect that).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif
#else
constexpr bool kSanitizerBuild = false;
#endif
// Every structure and alternative at every thread count, with rseq in this
// process and without it in a child process.
std::vector<structure_row> measure_structures(const options& opts);
// The child modes: kStructuresDenyChild installs the filter and execs
// kStructuresChild, which measures and prints its figures on stdout.
int run_structures_child(const options& opts);

// percpu_bench_report.cpp
void print_text(const run_result& run, std::FILE* out);
bool write_json(const run_result& run, const std::string& path, std::string* error);
bool write_svg(const run_result& run, const std::string& path, std::string* error);
// The same figures as Google Benchmark writes them (--benchmark_format=json,
// json_schema_version 1): one entry per repetition, then the mean, median and
// stddev aggregates, so Google Benchmark's tools/compare.py reads a run.
bool write_gbench_json(const run_result& run, const std::string& path, std::string* error);
// The version of write_json's record, its "schema_version" field; raised
// whenever a field changes meaning or goes away (docs/results.md lists them).
constexpr int kJsonSchemaVersion = 1;
// The figure as the text table prints it, so tests can match JSON to text.
std::string format_ns(double ns_per_call);

}  // namespace bench
}  // namespace percpu
