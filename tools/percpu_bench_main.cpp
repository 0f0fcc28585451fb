// percpu-bench's command line. Parsing is CLI11's; a bad flag or value gets a
// one-line error plus the usage on stderr and the usage-error exit status,
// and is caught before any measuring starts, so nothing is lost to a typo.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <string>

#include "percpu/version.h"
#include "tools/percpu_bench.hpp"

namespace {

using percpu::bench::options;

constexpr int kUsageError = 2;
constexpr int kOutputError = 1;

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Whether `path` can be written, checked without creating or truncating it.
bool writable(const std::string& path, std::string* why) {
  if (access(path.c_str(), F_OK) == 0) {
    if (access(path.c_str(), W_OK) == 0) return true;
    *why = "the file is not writable";
    return false;
  }
  if (access(directory_of(path).c_str(), W_OK) == 0) return true;
  *why = "directory " + directory_of(path) + " does not exist or is not writable";
  return false;
}

double seconds_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  for (int i = 0; i < argc; ++i) opts.argv.push_back(argv[i]);

  CLI::App app{
      "percpu-bench: reproduces the glibc rseq sched_getcpu() table and the arm64 get_cpu_id()\n"
      "table on this machine, beside every other way of asking which CPU a thread is on.",
      "percpu-bench"};
  app.add_option("--calls", opts.calls,
                 "Calls per repetition (the arm64 table's nr_function_calls; slow rows of the "
                 "glibc table use fewer so a repetition stays short)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 50));
  app.add_option("--repetitions", opts.repetitions,
                 "Repetitions of every row; the tables show the median and the min-max spread")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  CLI::Option* threads = app.add_flag(
      "--threads", opts.threads, "Measure on every allowed CPU at once, one pinned thread per CPU");
  app.add_option("--clock", opts.clock,
                 "cpu: the measuring thread's CPU time, which leaves out time other programs "
                 "held the CPU; wall: CLOCK_MONOTONIC")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "wall"}));
  CLI::Option* only =
      app.add_option("--only", opts.only, "Measure only these rows (comma-separated)")
          ->delimiter(',')
          ->check(CLI::IsMember(percpu::bench::only_names()));
  app.add_flag("--structures", opts.structures,
               "Instead of the seed tables: percpu's structures against the alternatives they "
               "replace, at 1 and 2 threads, with rseq and without it (in a child process whose "
               "rseq system call fails with ENOSYS)")
      ->excludes(threads)
      ->excludes(only);
  app.add_option("--json", opts.json_path, "Also write every figure and the environment as JSON");
  app.add_option("--svg", opts.svg_path, "Also write a bar chart of ns per call (linear, from 0)");
  app.add_option("--gbench-json", opts.gbench_json_path,
                 "Also write the figures in Google Benchmark's JSON format, which its "
                 "tools/compare.py reads");
  app.add_option("--internal-child", opts.child_row)->group("");  // the rseq-off child
  app.set_version_flag("--version", "percpu-bench " PERCPU_VERSION_STRING);
  app.footer(
      "Rows for --only: glibc_sched_getcpu, glibc_sched_getcpu_rseq_off, percpu_sched_getcpu,\n"
      "cpu_id, vdso_getcpu, rdpid, rdtscp, syscall_getcpu, thread_local, arm64 (the arm64 table).\n"
      "Exit status: 0 on success, 2 for a bad flag or value, 1 when an output file cannot be "
      "written\n(checked before measuring; if writing fails after all, the tables are printed "
      "first).");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "percpu-bench: error: " << e.what() << "\n\n" << app.help();
    return kUsageError;
  }
  // An output file that cannot be written is found before a long run, not
  // after it.
  for (const std::string* path : {&opts.json_path, &opts.svg_path, &opts.gbench_json_path}) {
    std::string why;
    if (!path->empty() && !writable(*path, &why)) {
      std::fprintf(stderr, "percpu-bench: error: cannot write %s: %s\n", path->c_str(),
                   why.c_str());
      return kOutputError;
    }
  }

  if (opts.child_row.rfind(percpu::bench::kMemoryChildPrefix, 0) == 0) {
    return percpu::bench::run_memory_child(opts);
  }
  if (opts.child_row.rfind(percpu::bench::kStructuresChild, 0) == 0) {  // and ...-without-rseq
    return percpu::bench::run_structures_child(opts);
  }
  if (!opts.child_row.empty()) return percpu::bench::run_child(opts);

  const double start = seconds_now();
  percpu::bench::run_result run;
  run.opts = opts;
  run.env = percpu::bench::gather_environment();
  if (opts.structures) {
    run.structures = percpu::bench::measure_structures(opts);
    run.memory = percpu::bench::measure_memory(opts);
  } else {
    run.rows = percpu::bench::measure(opts);
    run.listings = percpu::bench::disassemble_fast_paths();
  }
  run.on_cpu_share = percpu::bench::on_cpu_share();
  run.wall_seconds = seconds_now() - start;

  percpu::bench::print_text(run, stdout);
  std::fflush(stdout);
  int status = 0;
  std::string error;
  if (!opts.json_path.empty() && !percpu::bench::write_json(run, opts.json_path, &error)) {
    std::fprintf(stderr, "percpu-bench: %s\n", error.c_str());
    status = kOutputError;
  }
  if (!opts.svg_path.empty() && !percpu::bench::write_svg(run, opts.svg_path, &error)) {
    std::fprintf(stderr, "percpu-bench: %s\n", error.c_str());
    status = kOutputError;
  }
  if (!opts.gbench_json_path.empty() &&
      !percpu::bench::write_gbench_json(run, opts.gbench_json_path, &error)) {
    std::fprintf(stderr, "percpu-bench: %s\n", error.c_str());
    status = kOutputError;
  }
  return status;
}
