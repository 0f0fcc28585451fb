// What percpu-bench prints and writes: the text tables, the JSON record and
// the SVG chart. Every figure comes from the same run_result, so the three
// always agree.

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "tools/percpu_bench.hpp"

namespace percpu {
namespace bench {
namespace {

const measurement* find_row(const run_result& run, const char* name) {
  for (const measurement& row : run.rows) {
    if (std::strcmp(row.method->name, name) == 0 && row.available) return &row;
  }
  return nullptr;
}

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::size_t label_width(const run_result& run) {
  std::size_t width = 0;
  for (const measurement& row : run.rows) {
    if (row.method->where == table::glibc) width = std::max(width, std::strlen(row.method->label));
  }
  return width + 1;
}

// A ratio of two medians, beside the one the glibc seed patch reported for
// the same pair on its own machine (0 where it reported none). These are
// the seed's figures, not targets: this machine's glibc, CPU and kernel differ.
struct bar_check {
  const char* text;
  double ratio;
  double seed_ratio;
};

// What the glibc seed patch measured: sched_getcpu() through the vDSO, the
// same through rseq, and an inline load of rseq's cpu_id field.
constexpr double kSeedVdsoNs = 13.7;
constexpr double kSeedRseqNs = 2.5;
constexpr double kSeedInlineNs = 0.8;

std::vector<bar_check> bar_checks(const run_result& run) {
  std::vector<bar_check> checks;
  const measurement* cpu = find_row(run, "cpu_id");
  const measurement* glibc = find_row(run, "glibc_sched_getcpu");
  const measurement* off = find_row(run, kRseqOffRow);
  if (glibc != nullptr && off != nullptr) {
    checks.push_back({"glibc sched_getcpu() with rseq vs with rseq off: faster by",
                      off->ns_per_call() / glibc->ns_per_call(), kSeedVdsoNs / kSeedRseqNs});
  }
  if (cpu == nullptr) return checks;
  if (off != nullptr) {
    checks.push_back({"percpu::cpu_id() vs glibc sched_getcpu() with rseq off: faster by",
                      off->ns_per_call() / cpu->ns_per_call(), kSeedVdsoNs / kSeedInlineNs});
  }
  if (glibc != nullptr) {
    checks.push_back({"percpu::cpu_id() vs glibc sched_getcpu(): faster by",
                      glibc->ns_per_call() / cpu->ns_per_call(), kSeedRseqNs / kSeedInlineNs});
  }
  if (const measurement* sys = find_row(run, "syscall_getcpu")) {
    checks.push_back({"percpu::cpu_id() vs getcpu system call: faster by",
                      sys->ns_per_call() / cpu->ns_per_call(), 0});
  }
  if (const measurement* limit = find_row(run, "thread_local")) {
    checks.push_back({"percpu::cpu_id() vs thread_local read: slower by",
                      cpu->ns_per_call() / limit->ns_per_call(), 0});
  }
  return checks;
}

void print_environment(const run_result& run, std::FILE* out) {
  const environment& e = run.env;
  std::fprintf(out, "1. Environment\n");
  std::fprintf(out, "   CPU:                %s (%d online, %d allowed to this process)\n",
               e.cpu_model.c_str(), e.cpus_online, e.cpus_allowed);
  std::fprintf(out, "   Kernel:             %s %s\n", e.kernel.c_str(), e.machine.c_str());
  std::fprintf(out, "   glibc:              %s\n", e.glibc.c_str());
  std::fprintf(out, "   Compiler:           %s%s\n", e.compiler.c_str(),
               e.optimized ? "" : " (NOT optimized: figures mean little)");
  std::fprintf(out, "   rseq owner:         %s\n", e.rseq_owner.c_str());
  std::fprintf(out, "   rseq feature size:  %u\n", e.rseq_feature_size);
  std::fprintf(out, "   concurrency_id():   %s (what cid_counter indexes by)\n",
               e.concurrency_id_source.c_str());
  std::fprintf(out, "   cpu_id() backend:   %s (fallback for threads without rseq: %s)\n",
               e.cpu_id_backend.c_str(), e.fallback_backend.c_str());
  std::fprintf(out, "   rseq sections:      %s%s\n",
               e.rseq_sections == "on" ? "" : "off: ", e.rseq_sections.c_str());
  std::fprintf(out, "   Date:               %s\n", e.date.c_str());
  if (run.opts.clock == "wall") {
    std::fprintf(out,
                 "   Clock:              wall (CLOCK_MONOTONIC): time other programs held the "
                 "CPU counts\n");
  } else {
    std::fprintf(out,
                 "   Clock:              the measuring thread's CPU time; it was on a CPU %.0f%% "
                 "of the wall time%s\n",
                 100 * run.on_cpu_share,
                 run.on_cpu_share < 0.9 ? " (a busy machine: expect noisy figures)" : "");
  }
  std::string command;
  for (const std::string& a : run.opts.argv) command += (command.empty() ? "" : " ") + a;
  std::fprintf(out, "   Command:            %s\n", command.c_str());
}

void print_glibc_table(const run_result& run, std::FILE* out) {
  std::fprintf(out, "\n2. The glibc seed's table: ns per call, median of %d repetition%s%s\n",
               run.opts.repetitions, run.opts.repetitions == 1 ? "" : "s",
               run.opts.threads ? " (median over every CPU, all measuring at once)" : "");
  std::fprintf(out,
               "   (each row: calls in a loop, each result kept in a register; calls per "
               "repetition: --calls, or fewer where that would take over %.1f s)\n\n",
               kRepetitionBudgetNs / 1e9);
  const std::size_t width = label_width(run);
  const measurement* base = find_row(run, "glibc_sched_getcpu");
  std::fprintf(out, "%-*s %10s %-20s %16s %12s\n", static_cast<int>(width), "", "", "",
               "min-max ns", "calls/rep");
  bool any_row = false;
  for (const measurement& row : run.rows) {
    if (row.method->where != table::glibc) continue;
    any_row = true;
    if (!row.available) {
      std::fprintf(out, "%-*s %10s (%s)\n", static_cast<int>(width), row.method->label, "n/a",
                   row.reason.c_str());
      continue;
    }
    std::string relation;
    if (row.method->is_baseline) {
      relation = "(baseline)";
    } else if (base == nullptr) {
      relation = "";
    } else {
      const double r = base->ns_per_call() / row.ns_per_call();
      relation = r >= 1 ? printf_string("(speedup: %4.1fx)", r)
                        : printf_string("(slowdown: %4.1fx)", 1 / r);
    }
    const std::string spread =
        format_ns(row.min_ns_per_call()) + "-" + format_ns(row.max_ns_per_call());
    std::fprintf(out, "%-*s %7s ns %-20s %16s %12" PRIu64 "%s\n", static_cast<int>(width),
                 row.method->label, format_ns(row.ns_per_call()).c_str(), relation.c_str(),
                 spread.c_str(), row.calls, row.method->is_limit ? "  <- the limit" : "");
  }
  if (!any_row) {
    std::fprintf(out, "   (no row of this table selected)\n");
    return;
  }
  for (const measurement& row : run.rows) {
    if (row.available && !row.note.empty()) {
      std::fprintf(out, "   %s %s\n", row.method->label, row.note.c_str());
    }
  }
  if (base != nullptr) {
    std::fprintf(out, "   glibc %s's sched_getcpu() %s\n", run.env.glibc.c_str(),
                 run.env.rseq_owner == "glibc"
                     ? "reads cpu_id from glibc's rseq area here (as the seed patch proposed)"
                     : "cannot read rseq here (glibc does not own it), so it asks the vDSO");
  }
  const std::vector<bar_check> checks = bar_checks(run);
  if (!checks.empty()) {
    std::fprintf(
        out,
        "\n   Ratios of the medians above, beside the glibc seed's on its machine (%.1f ns "
        "glibc through the vDSO,\n   %.1f ns through rseq, %.1f ns for an inline load of "
        "rseq's cpu_id):\n",
        kSeedVdsoNs, kSeedRseqNs, kSeedInlineNs);
  }
  for (const bar_check& c : checks) {
    const std::string seed =
        c.seed_ratio > 0 ? printf_string("(the seed's: %.1fx)", c.seed_ratio) : "";
    std::fprintf(out, "   %-66s %7.2fx%s%s\n", c.text, c.ratio, seed.empty() ? "" : "  ",
                 seed.c_str());
  }
}

std::string box_cell(const std::string& text, std::size_t width) {
  std::string cell = "   " + text;
  cell.resize(std::max(width, cell.size() + 1), ' ');
  return cell;
}

void print_arm64_table(const run_result& run, std::FILE* out) {
  const measurement* before = nullptr;
  const measurement* after = nullptr;
  const measurement* empty = nullptr;
  bool selected = false;
  for (const measurement& row : run.rows) {
    if (row.method->where != table::arm64) continue;
    selected = true;
    const std::string name = row.method->name;
    if (!row.available) continue;
    if (name == "get_cpu_id_before") before = &row;
    if (name == "get_cpu_id_after") after = &row;
    if (name == "empty_call") empty = &row;
  }
  std::fprintf(out,
               "\n3. The arm64 seed's table: %" PRIu64
               " calls of a noinline get_cpu_id(), median of %d repetition%s%s\n\n",
               run.opts.calls, run.opts.repetitions, run.opts.repetitions == 1 ? "" : "s",
               run.opts.threads ? " (median over every CPU, all measuring at once)" : "");
  if (!selected) {
    std::fprintf(out, "   (not selected)\n");
    return;
  }
  if (before == nullptr || after == nullptr) {
    for (const measurement& row : run.rows) {
      if (row.method->where == table::arm64 && !row.available) {
        std::fprintf(out, "   %s: n/a (%s)\n", row.method->label, row.reason.c_str());
      }
    }
    return;
  }
  const std::string calls = std::to_string(run.opts.calls);
  const auto total = [](const measurement* m) {
    return static_cast<std::uint64_t>(std::llround(m->median_ns()));
  };
  const std::uint64_t t_before = total(before);
  const std::uint64_t t_after = total(after);
  const bool decrease = t_after <= t_before;
  const std::uint64_t diff = decrease ? t_before - t_after : t_after - t_before;
  char diff_text[96];
  std::snprintf(diff_text, sizeof(diff_text), "%" PRIu64 "ns (%.2f%%)", diff,
                100.0 * static_cast<double>(diff) / static_cast<double>(t_before));
  const std::string before_text = std::to_string(t_before) + "ns";
  const std::string after_text = std::to_string(t_after) + "ns";
  const std::size_t w1 = 8;
  const std::size_t w2 = std::max<std::size_t>(17, calls.size() + 7);
  std::size_t w3 = 24;
  for (const std::string& s : {before_text, after_text, std::string(diff_text)}) {
    w3 = std::max(w3, s.size() + 4);
  }
  const std::string indent = "      ";
  const std::string rule =
      indent + "+" + std::string(w1 + 1 + w2, '-') + "+" + std::string(w3, '-') + "+";
  const std::string split = indent + "+" + std::string(w1, '-') + "+" + std::string(w2, '-') + "+" +
                            std::string(w3, '-') + "+";
  auto row = [&](const char* name, const std::string& time) {
    std::string first = std::string(" ") + name;
    first.resize(w1, ' ');
    return indent + "|" + first + "|" + box_cell(calls, w2) + "|" + box_cell(time, w3) + "|";
  };
  std::string header_time = "    Time taken";
  header_time.resize(w3, ' ');
  std::string header_calls = " Number of Calls";
  header_calls.resize(w2, ' ');
  std::string diff_label = decrease ? "  Difference (decrease)" : "  Difference (increase)";
  diff_label.resize(w1 + 1 + w2, ' ');
  std::fprintf(out, "%s\n", rule.c_str());
  std::fprintf(out, "%s|%s|%s|%s|\n", indent.c_str(), std::string(w1, ' ').c_str(),
               header_calls.c_str(), header_time.c_str());
  std::fprintf(out, "%s\n", split.c_str());
  std::fprintf(out, "%s\n", row("Before", before_text).c_str());
  std::fprintf(out, "%s\n", split.c_str());
  std::fprintf(out, "%s\n", row("After", after_text).c_str());
  std::fprintf(out, "%s\n", split.c_str());
  std::fprintf(out, "%s|%s|%s|\n", indent.c_str(), diff_label.c_str(),
               box_cell(diff_text, w3).c_str());
  std::fprintf(out, "%s+%s+\n\n", indent.c_str(), std::string(w1 + 1 + w2 + 1 + w3, '-').c_str());

  std::fprintf(
      out, "   Before: get_cpu_id() { return sched_getcpu(); }      %7s ns/call  (min-max %s-%s)\n",
      format_ns(before->ns_per_call()).c_str(), format_ns(before->min_ns_per_call()).c_str(),
      format_ns(before->max_ns_per_call()).c_str());
  std::fprintf(
      out, "   After:  get_cpu_id() { return percpu::cpu_id(); }   %7s ns/call  (min-max %s-%s)\n",
      format_ns(after->ns_per_call()).c_str(), format_ns(after->min_ns_per_call()).c_str(),
      format_ns(after->max_ns_per_call()).c_str());
  if (empty != nullptr) {
    std::fprintf(out,
                 "   Empty noinline call (the call overhead in both): %" PRIu64 " calls, %" PRIu64
                 "ns, %s ns/call  (min-max %s-%s)\n",
                 empty->calls, total(empty), format_ns(empty->ns_per_call()).c_str(),
                 format_ns(empty->min_ns_per_call()).c_str(),
                 format_ns(empty->max_ns_per_call()).c_str());
  }
  std::fprintf(out, "   The bar: After below Before: %s (After/Before = %.2f)\n",
               t_after < t_before ? "met" : "NOT met",
               static_cast<double>(t_after) / static_cast<double>(t_before));
}

std::string side_cells(const structure_mode& m, const structure_side& side) {
  if (!m.available) return "n/a";
  if (!side.available) return "n/a (" + side.reason + ")";
  return format_ns(side.median()) + "  " + format_ns(side.min()) + "-" + format_ns(side.max());
}

double structure_goal(const structure_kind& kind, bool rseq) {
  return rseq ? kind.goal_with_rseq : kind.goal_without_rseq;
}

// One row's ratio against its goal, as the table, the SVG and the JSON say it.
struct goal_check {
  double ratio;  // the alternative's time / percpu's; 0 when not measured
  double goal;
  bool measured() const { return ratio > 0; }
  bool met() const { return measured() && ratio >= goal; }
  const char* verdict() const { return !measured() ? "not measured" : met() ? "met" : "NOT met"; }
};

goal_check check_goal(const structure_row& row, bool rseq) {
  return {(rseq ? row.with_rseq : row.without_rseq).ratio(), structure_goal(*row.kind, rseq)};
}

// The goal cell of the table: "6.91x (goal 2.33x) met".
std::string goal_cell(const structure_row& row, bool rseq) {
  const goal_check c = check_goal(row, rseq);
  const std::string goal = printf_string("(goal %.2fx)", c.goal);
  if (!c.measured()) return "n/a " + goal;
  return printf_string("%.2fx ", c.ratio) + goal + " " + c.verdict();
}

// The summary lines under the structures table: one per structure and mode,
// with every thread count's ratio.
struct structure_bar {
  std::string text;
  std::vector<double> ratios;  // per thread count; 0 where not measured
  bool measured;
  bool met;
};

std::vector<structure_bar> structure_bars(const run_result& run) {
  std::vector<structure_bar> bars;
  for (const structure_kind& kind : structure_kinds()) {
    for (const bool rseq : {true, false}) {
      structure_bar b;
      b.text = std::string(kind.short_label) + (rseq ? ", with rseq" : ", without rseq") +
               printf_string(" (goal: at least %.2fx)", structure_goal(kind, rseq));
      b.measured = true;
      b.met = true;
      for (const structure_row& row : run.structures) {
        if (row.kind != &kind) continue;
        const goal_check c = check_goal(row, rseq);
        b.ratios.push_back(c.ratio);
        b.measured = b.measured && c.measured();
        b.met = b.met && c.met();
      }
      bars.push_back(b);
    }
  }
  return bars;
}

// Said once at the head of the table and of the chart, so no reader has to
// guess which way round a ratio is.
constexpr const char* kRatioMeaning =
    "ratio = the alternative's median time / percpu's: above 1x, percpu is faster; "
    "goal: the least ratio the project accepts";

void print_structures(const run_result& run, std::FILE* out) {
  std::fprintf(out,
               "\n2. percpu's structures against what they replace: ns per operation, median of "
               "%d repetition%s, then min-max over every thread\n",
               run.opts.repetitions, run.opts.repetitions == 1 ? "" : "s");
  std::fprintf(out, "   %s\n", kRatioMeaning);
  std::fprintf(out,
               "   (each thread pinned to its own CPU where there are enough; \"without rseq\": "
               "this binary again,\n    in a child process whose rseq system call a seccomp "
               "filter fails with ENOSYS; operations per thread\n    per repetition: --calls, "
               "or fewer where that would take over %.2f s)\n\n",
               kStructureBudgetNs / 1e9);
  std::size_t width = 0;
  for (const structure_kind& kind : structure_kinds()) {
    width = std::max({width, std::strlen(kind.label), std::strlen(kind.alternative_label) + 2});
  }
  const int w = static_cast<int>(width + 1);
  std::fprintf(out, "%-*s %7s   %-30s %s\n", w, "", "threads", "with rseq", "without rseq [child]");
  for (const structure_row& row : run.structures) {
    std::fprintf(out, "%-*s %7d   %-30s %s\n", w, row.kind->label, row.threads,
                 side_cells(row.with_rseq, row.with_rseq.percpu).c_str(),
                 side_cells(row.without_rseq, row.without_rseq.percpu).c_str());
    std::fprintf(out, "%-*s %7d   %-30s %s\n", w,
                 (std::string("  ") + row.kind->alternative_label).c_str(), row.threads,
                 side_cells(row.with_rseq, row.with_rseq.alternative).c_str(),
                 side_cells(row.without_rseq, row.without_rseq.alternative).c_str());
    std::fprintf(out, "%-*s %7d   %-30s %s\n", w, "  ratio, goal", row.threads,
                 goal_cell(row, true).c_str(), goal_cell(row, false).c_str());
  }
  const structure_row* first = run.structures.empty() ? nullptr : &run.structures.front();
  if (first != nullptr) {
    for (const auto& mode : {std::make_pair("with rseq", &first->with_rseq),
                             std::make_pair("without rseq", &first->without_rseq)}) {
      if (mode.second->available) {
        std::fprintf(out, "   %s: cpu_id() backend %s\n", mode.first, mode.second->backend.c_str());
      } else {
        std::fprintf(out, "   %s: n/a (%s)\n", mode.first, mode.second->reason.c_str());
      }
    }
  }
  // The rows measured in a child with another malloc preloaded: where they
  // are missing, why, once per allocator and mode.
  std::vector<std::string> said;
  for (const structure_row& row : run.structures) {
    if (row.kind->malloc_library == nullptr) continue;
    for (const auto& mode : {std::make_pair("with rseq", &row.with_rseq),
                             std::make_pair("without rseq", &row.without_rseq)}) {
      if (mode.second->available) continue;
      const std::string line = std::string("   ") + row.kind->malloc_library + " rows, " +
                               mode.first + ": n/a (" + mode.second->reason + ")";
      if (std::find(said.begin(), said.end(), line) != said.end()) continue;
      said.push_back(line);
      std::fprintf(out, "%s\n", line.c_str());
    }
  }
  std::fprintf(
      out, "\n   The goals, per structure and mode (alternative / percpu, at 1 / 2 threads):\n");
  for (const structure_bar& b : structure_bars(run)) {
    std::string ratios;
    for (double r : b.ratios) {
      ratios += (ratios.empty() ? "" : " / ") + (r > 0 ? printf_string("%.2fx", r) : "n/a");
    }
    std::fprintf(out, "   %-72s %17s  %s\n", b.text.c_str(), ratios.c_str(),
                 !b.measured ? "not measured"
                 : b.met     ? "met"
                             : "NOT met");
  }
}

std::string bytes_cell(double bytes) { return bytes < 0 ? "n/a" : printf_string("%.1f", bytes); }

void print_memory(const run_result& run, std::FILE* out) {
  if (run.memory.empty()) return;
  std::fprintf(out,
               "\n3. Memory per instance: bytes of resident memory each, for N instances made "
               "and each used once\n   (a fresh process per figure; the objects, their "
               "per-CPU and per-thread memory, their mappings and heap)\n\n");
  std::fprintf(out, "%-38s %7s %11s %13s   %-42s %s\n", "", "N", "with rseq", "without rseq",
               "alternative", "bytes");
  for (const memory_row& m : run.memory) {
    std::fprintf(out, "%-38s %7ld %11s %13s   %-42s %s\n", m.label, m.instances,
                 bytes_cell(m.with_rseq).c_str(), bytes_cell(m.without_rseq).c_str(),
                 m.alternative_label, bytes_cell(m.alternative).c_str());
    if (!m.reason.empty()) std::fprintf(out, "   (%s: %s)\n", m.label, m.reason.c_str());
  }
}

void print_listings(const run_result& run, std::FILE* out) {
  std::fprintf(out,
               "\n4. The instructions as built, disassembled from the binaries themselves\n"
               "   (in the loops, lines marked * are the loop body: what each call costs)\n");
  for (const disassembly& d : run.listings) {
    std::fprintf(out, "\nDump of assembler code for function %s (%s)\n   from %s, by %s:\n",
                 d.symbol.c_str(), d.title.c_str(), d.file.c_str(), d.how.c_str());
    for (const std::string& line : d.lines) std::fprintf(out, "%s\n", line.c_str());
  }
}

void print_per_cpu(const run_result& run, std::FILE* out) {
  std::vector<int> cpus;
  for (const measurement& row : run.rows) {
    if (!row.cpus.empty()) cpus = row.cpus;
  }
  if (cpus.empty()) return;
  std::fprintf(out,
               "\n5. Per CPU (--threads: one pinned thread per CPU, all timed at once): "
               "median ns per call\n\n");
  const int width = static_cast<int>(label_width(run));
  std::fprintf(out, "%-*s", width, "");
  for (int cpu : cpus) std::fprintf(out, " %9s", ("cpu" + std::to_string(cpu)).c_str());
  std::fprintf(out, "\n");
  for (const measurement& row : run.rows) {
    std::string label = row.method->label;
    if (row.method->where == table::arm64) label = std::string("get_cpu_id() ") + label + ":";
    std::fprintf(out, "%-*s", width, label.c_str());
    if (!row.available || row.per_cpu_elapsed_ns.empty()) {
      std::fprintf(out, " %9s\n", "n/a");
      continue;
    }
    for (const auto& reps : row.per_cpu_elapsed_ns) {
      std::fprintf(out, " %9s", format_ns(median(reps) / static_cast<double>(row.calls)).c_str());
    }
    std::fprintf(out, "\n");
  }
}

// --- JSON -------------------------------------------------------------------
// ordered_json keeps the keys in the order written here, so the record reads
// in the same order as the text tables.

using json = nlohmann::ordered_json;

// Non-finite figures (a ratio over a zero time) become null, as JSON has no
// NaN; nlohmann writes them so too, but saying it here keeps the promise
// independent of that library's choice.
json json_number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json json_numbers(const std::vector<double>& values) {
  json out = json::array();
  for (const double v : values) out.push_back(json_number(v));
  return out;
}

json json_row(const run_result& run, const measurement& row) {
  const measurement* base = find_row(run, "glibc_sched_getcpu");
  json r = {{"name", row.method->name},
            {"label", row.method->label},
            {"table", row.method->where == table::glibc ? "glibc" : "arm64"},
            {"baseline", row.method->is_baseline},
            {"limit", row.method->is_limit},
            {"available", row.available}};
  if (!row.available) {
    r["reason"] = row.reason;
    return r;
  }
  r["calls_per_repetition"] = row.calls;
  r["ns_per_call"] = json_number(row.ns_per_call());
  r["min_ns_per_call"] = json_number(row.min_ns_per_call());
  r["max_ns_per_call"] = json_number(row.max_ns_per_call());
  r["median_elapsed_ns"] = json_number(row.median_ns());
  if (base != nullptr && row.method->where == table::glibc) {
    r["speedup_vs_baseline"] = json_number(base->ns_per_call() / row.ns_per_call());
  }
  if (!row.note.empty()) r["note"] = row.note;
  r["elapsed_ns"] = json_numbers(row.elapsed_ns);
  if (!row.cpus.empty()) {
    json per_cpu = json::array();
    for (std::size_t i = 0; i < row.cpus.size(); ++i) {
      per_cpu.push_back({{"cpu", row.cpus[i]},
                         {"ns_per_call", json_number(median(row.per_cpu_elapsed_ns[i]) /
                                                     static_cast<double>(row.calls))},
                         {"elapsed_ns", json_numbers(row.per_cpu_elapsed_ns[i])}});
    }
    r["per_cpu"] = std::move(per_cpu);
  }
  return r;
}

json json_side(const structure_side& side) {
  if (!side.available) return {{"available", false}, {"reason", side.reason}};
  return {{"available", true},
          {"calls_per_repetition", side.calls},
          {"ns_per_op", json_number(side.median())},
          {"min_ns_per_op", json_number(side.min())},
          {"max_ns_per_op", json_number(side.max())},
          {"repetitions_ns_per_op", json_numbers(side.ns_per_op)}};
}

json json_mode(const structure_row& row, bool rseq) {
  const structure_mode& m = rseq ? row.with_rseq : row.without_rseq;
  const goal_check c = check_goal(row, rseq);
  json out = {{"available", m.available}};
  if (!m.available) {
    out["reason"] = m.reason;
  } else {
    out["backend"] = m.backend;
    out["percpu"] = json_side(m.percpu);
    out["alternative"] = json_side(m.alternative);
  }
  out["ratio"] = c.measured() ? json_number(c.ratio) : json(nullptr);
  out["goal"] = json_number(c.goal);
  out["goal_met"] = c.measured() ? json(c.met()) : json(nullptr);
  return out;
}

json json_structures(const run_result& run) {
  json out = json::array();
  for (const structure_row& row : run.structures) {
    out.push_back({{"name", row.kind->name},
                   {"threads", row.threads},
                   {"label", row.kind->label},
                   {"alternative", row.kind->alternative_label},
                   {"ratio_is", "alternative/percpu"},
                   {"with_rseq", json_mode(row, true)},
                   {"without_rseq", json_mode(row, false)}});
    // Added in schema 1: where the alternative's malloc came from, when it
    // is not the C library's (the row ran in a child with it preloaded).
    if (row.kind->malloc_library != nullptr) {
      out.back()["malloc_library"] = row.kind->malloc_library;
    }
  }
  return out;
}

// --- SVG --------------------------------------------------------------------

std::string xml_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string svg_label(const measurement& row) {
  if (row.method->where == table::glibc) {
    std::string label = row.method->label;
    if (!label.empty() && label.back() == ':') label.pop_back();
    return label;
  }
  const std::string name = row.method->name;
  if (name == "get_cpu_id_before") return "get_cpu_id() Before: sched_getcpu()";
  if (name == "get_cpu_id_after") return "get_cpu_id() After: percpu::cpu_id()";
  return "empty noinline call (call overhead)";
}

// Writes the whole of `text` to `path`; on failure says why in *error. A
// full disk shows only when the buffered bytes go out, so fclose() counts.
bool write_file(const std::string& path, const std::string& text, std::string* error) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    *error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    *error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

// Text the tool did not make (a CPU model, a compiler's version string) may
// hold bytes that are not UTF-8: replace them rather than fail the run.
std::string dump(const json& doc) {
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

std::string format_ns(double ns_per_call) { return printf_string("%.2f", ns_per_call); }

void print_text(const run_result& run, std::FILE* out) {
  if (run.opts.structures) {
    std::fprintf(out, "percpu-bench --structures: percpu's structures, with and without rseq\n\n");
    print_environment(run, out);
    print_structures(run, out);
    print_memory(run, out);
    std::fprintf(out, "\nTotal run time: %.1f s\n", run.wall_seconds);
    return;
  }
  std::fprintf(out, "percpu-bench: which CPU am I on, and what does asking cost?\n\n");
  print_environment(run, out);
  print_glibc_table(run, out);
  print_arm64_table(run, out);
  print_listings(run, out);
  if (run.opts.threads) print_per_cpu(run, out);
  std::fprintf(out, "\nTotal run time: %.1f s\n", run.wall_seconds);
}

bool write_json(const run_result& run, const std::string& path, std::string* error) {
  const environment& e = run.env;
  json doc;
  doc["schema_version"] = kJsonSchemaVersion;
  doc["tool"] = "percpu-bench";
  doc["command"] = run.opts.argv;
  doc["options"] = {{"calls", run.opts.calls},
                    {"repetitions", run.opts.repetitions},
                    {"threads", run.opts.threads},
                    {"clock", run.opts.clock},
                    {"structures", run.opts.structures}};
  doc["environment"] = {{"date", e.date},
                        {"cpu_model", e.cpu_model},
                        {"cpus_online", e.cpus_online},
                        {"cpus_allowed", e.cpus_allowed},
                        {"kernel", e.kernel},
                        {"machine", e.machine},
                        {"glibc", e.glibc},
                        {"compiler", e.compiler},
                        {"optimized", e.optimized},
                        {"rseq_owner", e.rseq_owner},
                        {"rseq_feature_size", e.rseq_feature_size},
                        {"concurrency_id_source", e.concurrency_id_source},
                        {"cpu_id_backend", e.cpu_id_backend},
                        {"fallback_backend", e.fallback_backend},
                        {"rseq_sections", e.rseq_sections}};
  json methods = json::array();
  for (const measurement& row : run.rows) methods.push_back(json_row(run, row));
  doc["methods"] = std::move(methods);
  json bar = json::array();
  for (const bar_check& check : bar_checks(run)) {
    bar.push_back(
        {{"check", check.text},
         {"ratio", json_number(check.ratio)},
         {"seed_ratio", check.seed_ratio > 0 ? json_number(check.seed_ratio) : json(nullptr)}});
  }
  doc["bar"] = std::move(bar);
  doc["structures"] = json_structures(run);
  json sbar = json::array();
  for (const structure_bar& b : structure_bars(run)) {
    sbar.push_back({{"check", b.text},
                    {"ratios", json_numbers(b.ratios)},
                    {"measured", b.measured},
                    {"met", b.met}});
  }
  doc["structures_bar"] = std::move(sbar);
  json memory = json::array();
  for (const memory_row& m : run.memory) {
    auto figure = [](double bytes) { return bytes < 0 ? json(nullptr) : json_number(bytes); };
    memory.push_back({{"structure", m.name},
                      {"label", m.label},
                      {"instances", m.instances},
                      {"bytes_with_rseq", figure(m.with_rseq)},
                      {"bytes_without_rseq", figure(m.without_rseq)},
                      {"alternative", m.alternative_label},
                      {"alternative_bytes", figure(m.alternative)}});
  }
  doc["memory"] = std::move(memory);
  json listings = json::array();
  for (const disassembly& d : run.listings) {
    listings.push_back({{"symbol", d.symbol},
                        {"title", d.title},
                        {"file", d.file},
                        {"how", d.how},
                        {"lines", d.lines}});
  }
  doc["disassembly"] = std::move(listings);
  doc["on_cpu_share"] = json_number(run.on_cpu_share);
  doc["wall_seconds"] = json_number(run.wall_seconds);

  return write_file(path, dump(doc), error);
}

namespace {

// One Google Benchmark run name and its repetitions, in ns per iteration.
struct gbench_series {
  std::string name;
  int threads = 1;
  std::uint64_t iterations = 0;
  std::vector<double> ns;  // per repetition
};

// The seed rows by their --only names; the structures as
// KIND/percpu|alternative/rseq|no_rseq/threads:N, so that compare.py's
// "filters" mode can set percpu against the alternative within one run.
std::vector<gbench_series> gbench_runs(const run_result& run) {
  std::vector<gbench_series> out;
  for (const measurement& row : run.rows) {
    if (!row.available || row.calls == 0) continue;
    gbench_series g;
    g.name = row.method->name;
    if (!row.cpus.empty()) {
      g.threads = static_cast<int>(row.cpus.size());
      g.name += "/threads:" + std::to_string(g.threads);
    }
    g.iterations = row.calls;
    for (const double e : row.elapsed_ns) g.ns.push_back(e / static_cast<double>(row.calls));
    out.push_back(g);
  }
  for (const structure_row& row : run.structures) {
    for (const bool rseq : {true, false}) {
      const structure_mode& m = rseq ? row.with_rseq : row.without_rseq;
      for (const bool percpu_side : {true, false}) {
        const structure_side& side = percpu_side ? m.percpu : m.alternative;
        if (!m.available || !side.available) continue;
        gbench_series g;
        g.name = std::string(row.kind->name) + (percpu_side ? "/percpu" : "/alternative") +
                 (rseq ? "/rseq" : "/no_rseq") + "/threads:" + std::to_string(row.threads);
        g.threads = row.threads;
        g.iterations = side.calls;
        g.ns = side.ns_per_op;
        out.push_back(g);
      }
    }
  }
  return out;
}

// As Google Benchmark computes its aggregates: the mean, the median and the
// sample standard deviation (0 for a single repetition).
double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (const double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}
double stddev_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean_of(v);
  double sq = 0;
  for (const double x : v) sq += (x - m) * (x - m);
  return std::sqrt(sq / static_cast<double>(v.size() - 1));
}

}  // namespace

bool write_gbench_json(const run_result& run, const std::string& path, std::string* error) {
  const environment& e = run.env;
  json context = {
      {"date", e.date},
      {"executable", run.opts.argv.empty() ? std::string("percpu-bench") : run.opts.argv[0]},
      {"num_cpus", e.cpus_online},
      {"library_build_type", e.optimized ? "release" : "debug"},
      {"json_schema_version", 1},
      {"percpu_bench_clock",
       run.opts.clock == "wall" ? "wall (CLOCK_MONOTONIC)" : "the measuring thread's CPU time"},
      {"percpu_bench_note",
       "percpu-bench times each figure on one clock: real_time and cpu_time both hold it"},
      {"cpu_model", e.cpu_model},
      {"kernel", e.kernel + " " + e.machine},
      {"glibc", e.glibc},
      {"compiler", e.compiler},
      {"rseq_owner", e.rseq_owner},
      {"cpu_id_backend", e.cpu_id_backend}};
  json unavailable = json::array();
  for (const measurement& row : run.rows) {
    if (!row.available) unavailable.push_back({{"name", row.method->name}, {"reason", row.reason}});
  }
  for (const structure_row& row : run.structures) {
    for (const bool rseq : {true, false}) {
      const structure_mode& m = rseq ? row.with_rseq : row.without_rseq;
      if (m.available) continue;
      unavailable.push_back({{"name", std::string(row.kind->name) +
                                          (rseq ? "/*/rseq/threads:" : "/*/no_rseq/threads:") +
                                          std::to_string(row.threads)},
                             {"reason", m.reason}});
    }
  }
  context["percpu_bench_unavailable"] = std::move(unavailable);

  json benchmarks = json::array();
  int family = 0;
  for (const gbench_series& g : gbench_runs(run)) {
    const int repetitions = static_cast<int>(g.ns.size());
    auto entry = [&](const std::string& name, const char* aggregate, int index,
                     std::uint64_t iterations, double ns) {
      json b = {{"name", name},
                {"family_index", family},
                {"per_family_instance_index", 0},
                {"run_name", g.name},
                {"run_type", aggregate == nullptr ? "iteration" : "aggregate"},
                {"repetitions", repetitions}};
      if (aggregate == nullptr) b["repetition_index"] = index;
      b["threads"] = g.threads;
      if (aggregate != nullptr) {
        b["aggregate_name"] = aggregate;
        b["aggregate_unit"] = "time";
      }
      b["iterations"] = iterations;
      b["real_time"] = json_number(ns);
      b["cpu_time"] = json_number(ns);
      b["time_unit"] = "ns";
      benchmarks.push_back(std::move(b));
    };
    for (int i = 0; i < repetitions; ++i) {
      entry(g.name, nullptr, i, g.iterations, g.ns[static_cast<std::size_t>(i)]);
    }
    // Google Benchmark adds the aggregates only after more than one
    // repetition; their "iterations" is the number of repetitions.
    if (repetitions > 1) {
      const auto reps = static_cast<std::uint64_t>(repetitions);
      entry(g.name + "_mean", "mean", 0, reps, mean_of(g.ns));
      entry(g.name + "_median", "median", 0, reps, median(g.ns));
      entry(g.name + "_stddev", "stddev", 0, reps, stddev_of(g.ns));
    }
    ++family;
  }
  json doc;
  doc["context"] = std::move(context);
  doc["benchmarks"] = std::move(benchmarks);
  return write_file(path, dump(doc), error);
}

namespace {

// printf into a string of whatever length the result needs: the chart's
// lines carry the CPU model, kernel and compiler, of any length.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(&out[0], out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

// One line of the chart: a heading, or a bar with its whiskers.
struct svg_bar {
  std::string label;
  bool heading = false;
  bool available = false;
  std::string reason;
  double value = 0, lo = 0, hi = 0;
  std::string colour;
  std::string note;  // after the figure
};

// A colour of the chart and what it stands for.
struct legend_entry {
  const char* colour;
  const char* text;
};

constexpr const char* kPercpuColour = "#1b7f5f";
constexpr const char* kGlibcColour = "#6b6b6b";
constexpr const char* kLimitColour = "#2c5aa0";
constexpr const char* kEmptyCallColour = "#b0b0b0";
constexpr const char* kOtherColour = "#d08c2a";

const std::vector<legend_entry>& seed_legend() {
  static const std::vector<legend_entry> legend = {
      {kPercpuColour, "percpu: cpu_id(), get_cpu_id() After"},
      {kGlibcColour, "glibc sched_getcpu(), get_cpu_id() Before"},
      {kOtherColour, "other ways of asking"},
      {kLimitColour, "thread_local read (the limit)"},
      {kEmptyCallColour, "empty noinline call"}};
  return legend;
}

const std::vector<legend_entry>& structure_legend() {
  static const std::vector<legend_entry> legend = {{kPercpuColour, "percpu's structure"},
                                                   {kGlibcColour, "the alternative it replaces"}};
  return legend;
}

const char* svg_colour(const measurement& row) {
  const std::string name = row.method->name;
  if (name == "cpu_id" || name == "get_cpu_id_after") return kPercpuColour;
  if (row.method->is_baseline || name == "get_cpu_id_before") return kGlibcColour;
  if (row.method->is_limit) return kLimitColour;
  if (name == "empty_call") return kEmptyCallColour;
  return kOtherColour;
}

std::vector<svg_bar> seed_bars(const run_result& run) {
  std::vector<svg_bar> bars;
  bool arm64_heading = false;
  if (!run.rows.empty() && run.rows.front().method->where == table::glibc) {
    svg_bar h;
    h.heading = true;
    h.label = "glibc seed: each way of asking, per call";
    bars.push_back(h);
  }
  for (const measurement& row : run.rows) {
    if (row.method->where == table::arm64 && !arm64_heading) {
      arm64_heading = true;
      svg_bar h;
      h.heading = true;
      h.label = "arm64 seed: " + std::to_string(run.opts.calls) +
                " calls of a noinline get_cpu_id(), per call";
      bars.push_back(h);
    }
    svg_bar b;
    b.label = svg_label(row);
    b.available = row.available;
    b.reason = row.reason;
    if (row.available) {
      b.value = row.ns_per_call();
      b.lo = row.min_ns_per_call();
      b.hi = row.max_ns_per_call();
    }
    b.colour = svg_colour(row);
    if (row.method->is_baseline) b.note = " (baseline)";
    if (row.method->is_limit) b.note = " (the limit)";
    bars.push_back(b);
  }
  return bars;
}

std::vector<svg_bar> structure_svg_bars(const run_result& run) {
  std::vector<svg_bar> bars;
  for (const bool rseq : {true, false}) {
    svg_bar h;
    h.heading = true;
    h.label = rseq ? "with rseq (this process)"
                   : "without rseq (a child process whose rseq fails with ENOSYS)";
    bars.push_back(h);
    for (const structure_row& row : run.structures) {
      const structure_mode& m = rseq ? row.with_rseq : row.without_rseq;
      for (const bool percpu_side : {true, false}) {
        const structure_side& side = percpu_side ? m.percpu : m.alternative;
        svg_bar b;
        b.label = std::string(percpu_side ? row.kind->label : row.kind->alternative_label) + ", " +
                  std::to_string(row.threads) + (row.threads == 1 ? " thread" : " threads");
        b.available = m.available && side.available;
        b.reason = m.available ? side.reason : m.reason;
        if (b.available) {
          b.value = side.median();
          b.lo = side.min();
          b.hi = side.max();
        }
        b.colour = percpu_side ? kPercpuColour : kGlibcColour;
        const goal_check c = check_goal(row, rseq);
        if (percpu_side && c.measured()) {
          b.note = format(" (ratio %.2fx, goal %.2fx: %s)", c.ratio, c.goal, c.verdict());
        }
        bars.push_back(b);
      }
    }
  }
  return bars;
}

// The chart's linear axis: from 0 to `end`, with ticks every `step`. Bars
// far longer than the typical one (a system call beside a load) would
// squeeze every other bar to a few pixels, so they run past a marked break
// instead, their figure printed as for every bar.
struct linear_axis {
  double end = 1;
  double step = 0.2;
};

linear_axis choose_axis(const std::vector<svg_bar>& bars) {
  std::vector<double> values;
  for (const svg_bar& b : bars) {
    if (!b.heading && b.available && b.value > 0) values.push_back(b.value);
  }
  linear_axis axis;
  if (values.empty()) return axis;
  // The axis ends a little past the longest bar that is not far longer
  // than the typical one; a whisker beyond the end is cut and its figure
  // printed.
  const double within = 4 * median(values);
  double top = 0;
  for (const double v : values) {
    if (v <= within) top = std::max(top, v);
  }
  top *= 1.05;
  // A step of 1, 2 or 5 times a power of ten, for at most 5 steps to the end.
  const double raw = top / 5;
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  axis.step = decade * (raw <= decade ? 1 : raw <= 2 * decade ? 2 : raw <= 5 * decade ? 5 : 10);
  axis.end = std::ceil(top / axis.step - 1e-9) * axis.step;
  return axis;
}

std::string tick_label(double v) { return format("%g ns", v); }

constexpr int kLegendY = 100, kLegendLine = 20;

// How many lines write_svg's legend takes at this width (the same layout).
int legend_lines(const std::vector<legend_entry>& legend, int width) {
  int lx = 20, lines = 1;
  for (const legend_entry& l : legend) {
    const int w = 19 + 7 * static_cast<int>(std::strlen(l.text)) + 24;
    if (lx > 20 && lx + w > width - 20) lx = 20, ++lines;
    lx += w;
  }
  return lx + 100 > width - 20 ? lines + 1 : lines;
}

}  // namespace

bool write_svg(const run_result& run, const std::string& path, std::string* error) {
  const std::vector<svg_bar> bars = run.opts.structures ? structure_svg_bars(run) : seed_bars(run);
  const std::vector<legend_entry>& legend =
      run.opts.structures ? structure_legend() : seed_legend();
  const linear_axis axis = choose_axis(bars);
  bool any_broken = false;
  for (const svg_bar& b : bars) any_broken = any_broken || (b.available && b.value > axis.end);
  const int label_w = run.opts.structures ? 470 : 330;
  const int plot_x = label_w + 10, plot_w = 560, break_w = any_broken ? 46 : 0;
  const int value_w = run.opts.structures ? 420 : 220, row_h = 26;
  const int width = plot_x + plot_w + break_w + value_w;
  const int top = kLegendY + legend_lines(legend, width) * kLegendLine + 30;
  const int plot_h = row_h * static_cast<int>(bars.size());
  // --structures: the memory table under the chart, a line per structure.
  const int memory_line = 20;
  const int memory_h =
      run.memory.empty() ? 0 : memory_line * (2 + static_cast<int>(run.memory.size()));
  const int height = top + plot_h + 70 + memory_h;
  auto x_of = [&](double v) { return plot_x + std::min(v, axis.end) / axis.end * plot_w; };
  std::string s = format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  s += run.opts.structures
           ? "<text x=\"20\" y=\"30\" font-size=\"19\" font-weight=\"bold\">percpu-bench "
             "--structures: nanoseconds per operation (shorter is faster)</text>\n"
           : "<text x=\"20\" y=\"30\" font-size=\"19\" font-weight=\"bold\">percpu-bench: "
             "which CPU am I on? Nanoseconds per call (shorter is faster)</text>\n";
  s += "<text x=\"20\" y=\"52\" font-size=\"12\" fill=\"#444\">" +
       xml_escape(run.env.cpu_model + ", " + run.env.kernel + " " + run.env.machine + ", glibc " +
                  run.env.glibc + ", " + run.env.date) +
       format("; median of %d repetitions, whiskers min-max, %s clock%s</text>\n",
              run.opts.repetitions, run.opts.clock == "wall" ? "wall" : "thread CPU",
              run.opts.threads ? "; every CPU at once" : "");
  s += "<text x=\"20\" y=\"70\" font-size=\"12\" fill=\"#444\">" +
       xml_escape("rseq owner: " + run.env.rseq_owner + ", cpu_id() backend: " +
                  run.env.cpu_id_backend + ", compiler: " + run.env.compiler) +
       "</text>\n";
  s += format(
      "<text x=\"20\" y=\"88\" font-size=\"12\" fill=\"#444\">Linear axis from 0 ns%s.%s</text>\n",
      any_broken ? "; a bar that runs past the break (//) is longer than drawn: its figure says "
                   "how long"
                 : "",
      run.opts.structures ? (std::string(" ") + kRatioMeaning + ".").c_str() : "");
  // The legend: every colour a bar has, and what the whiskers are, in as
  // many lines as the chart's width needs (about 7 px a character).
  s += "<g class=\"legend\" font-size=\"12\">\n";
  int lx = 20, ly = kLegendY;
  for (const legend_entry& l : legend) {
    const int w = 19 + 7 * static_cast<int>(std::strlen(l.text)) + 24;
    if (lx > 20 && lx + w > width - 20) lx = 20, ly += kLegendLine;
    s += format("<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/>", lx, ly,
                l.colour) +
         format("<text x=\"%d\" y=\"%d\">", lx + 19, ly + 12) + xml_escape(l.text) + "</text>\n";
    lx += w;
  }
  if (lx + 100 > width - 20) lx = 20, ly += kLegendLine;
  s += format(
      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
      "<text x=\"%d\" y=\"%d\">min-max</text>\n</g>\n",
      lx, ly + 7, lx + 24, ly + 7, lx, ly + 3, lx, ly + 11, lx + 24, ly + 3, lx + 24, ly + 11,
      lx + 30, ly + 12);
  // Ticks and grid lines from 0 to the axis end.
  for (int i = 0; i * axis.step <= axis.end * (1 + 1e-9); ++i) {
    const double v = i * axis.step;
    const double x = x_of(v);
    s += format(
        "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\"/>\n"
        "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n",
        x, top - 8, x, top + plot_h, i == 0 ? "#444" : "#ccc", x, top + plot_h + 18,
        tick_label(v).c_str());
  }
  if (any_broken) {
    const int bx = plot_x + plot_w + break_w / 2;
    s += format(
        "<text x=\"%d\" y=\"%d\" font-size=\"14\" text-anchor=\"middle\">//</text>\n"
        "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\" fill=\"#444\">"
        "break</text>\n",
        bx, top + plot_h + 18, bx, top + plot_h + 32);
  }
  s += format(
      "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\" fill=\"#444\">"
      "ns per %s, linear scale</text>\n",
      plot_x + plot_w / 2, top + plot_h + 38, run.opts.structures ? "operation" : "call");
  int y = top;
  for (const svg_bar& b : bars) {
    const int mid = y + row_h / 2;
    if (b.heading) {
      s += format("<text x=\"20\" y=\"%d\" font-size=\"13\" font-style=\"italic\">", mid + 5) +
           xml_escape(b.label) + "</text>\n";
      y += row_h;
      continue;
    }
    s += format("<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"end\">", label_w, mid + 5) +
         xml_escape(b.label) + "</text>\n";
    if (!b.available) {
      s += format("<text x=\"%d\" y=\"%d\" font-size=\"12\" fill=\"#a00\">n/a: ", plot_x + 6,
                  mid + 5) +
           xml_escape(b.reason) + "</text>\n";
      y += row_h;
      continue;
    }
    const bool broken = b.value > axis.end;
    double x_end = broken ? plot_x + plot_w + break_w : x_of(b.value);
    s += format(
        "<rect class=\"bar%s\" x=\"%d\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/>\n",
        broken ? " broken" : "", plot_x, y + 4, x_end - plot_x, row_h - 8, b.colour.c_str());
    if (broken) {
      // The cut: a white slash through the bar where the axis breaks.
      const int cx = plot_x + plot_w + break_w / 2;
      s += format("<polygon points=\"%d,%d %d,%d %d,%d %d,%d\" fill=\"white\"/>\n", cx - 6,
                  y + row_h - 2, cx, y + row_h - 2, cx + 6, y + 2, cx, y + 2);
    } else {
      // Whiskers: min to max, cut at the axis end when the max lies beyond.
      const bool clipped = b.hi > axis.end;
      s += format(
          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n"
          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n",
          x_of(b.lo), mid, x_of(b.hi), mid, x_of(b.lo), mid - 4, x_of(b.lo), mid + 4);
      if (!clipped) {
        s += format("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n",
                    x_of(b.hi), mid - 4, x_of(b.hi), mid + 4);
      }
      x_end = std::max(x_end, x_of(b.hi));
    }
    // A cut bar's length is its figure; a whisker cut at the axis end says
    // where it ends.
    const bool whisker_cut = !broken && b.hi > axis.end;
    s += format("<text x=\"%.1f\" y=\"%d\" font-size=\"12\">", x_end + 6, mid + 4) +
         xml_escape(format_ns(b.value) + " ns" + b.note +
                    (whisker_cut ? " (max " + format_ns(b.hi) + " ns)" : "")) +
         "</text>\n";
    y += row_h;
  }
  if (!run.memory.empty()) {
    int my = top + plot_h + 70;
    s += format("<text x=\"20\" y=\"%d\" font-size=\"14\" font-weight=\"bold\">", my) +
         xml_escape("Memory per instance: bytes of resident memory each, instances made and "
                    "each used once (" + run.env.cpu_model + ")") +
         "</text>\n";
    for (const memory_row& m : run.memory) {
      my += memory_line;
      s += format("<text x=\"20\" y=\"%d\" font-size=\"12\">", my) +
           xml_escape(std::string(m.label) + ": " + bytes_cell(m.with_rseq) + " with rseq, " +
                      bytes_cell(m.without_rseq) + " without; " + m.alternative_label + ": " +
                      bytes_cell(m.alternative) + " (" + std::to_string(m.instances) +
                      " instances)") +
           "</text>\n";
    }
  }
  s += "</svg>\n";
  return write_file(path, s, error);
}

}  // namespace bench
}  // namespace percpu
