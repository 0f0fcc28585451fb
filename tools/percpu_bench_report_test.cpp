// percpu-bench's JSON and SVG writers, fed a run made up here rather than
// measured: the text that lands in them (the CPU model, the kernel, the
// command line) is whatever the machine and the user supply, of any length
// and any bytes, and must come out whole and well-formed.

#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/percpu_bench.hpp"
#include "tests/support/files.hpp"

namespace percpu {
namespace bench {
namespace {

using json = nlohmann::json;

using percpu::test::read_file;
using percpu::test::temp_path;

// What `writer` writes for `run` into a scratch file, parsed: discarded when
// it could not write (a test failure) or wrote no JSON.
template <typename Writer>
json written_json(Writer writer, const run_result& run, const char* name) {
  const std::string path = temp_path(name);
  std::string error;
  const bool wrote = writer(run, path, &error);
  EXPECT_TRUE(wrote) << error;
  json doc = wrote ? json::parse(read_file(path), nullptr, false) : json(json::value_t::discarded);
  unlink(path.c_str());
  return doc;
}

// Far longer than any line buffer a writer might format into.
std::string long_text(const std::string& unit) {
  std::string s;
  while (s.size() < 20000) s += unit;
  return s + "<end of the name>";
}

run_result made_up_run() {
  run_result run;
  run.opts.repetitions = 3;
  run.opts.calls = 1000;
  run.opts.argv = {"percpu-bench", "--json", "caf\xc3\xa9\t\x01.json"};
  run.env.date = "2026-01-01T00:00:00Z";
  run.env.cpu_model = long_text("Very Long CPU Model & <Co> \"Edition\" caf\xc3\xa9 ");
  run.env.kernel = "6.12.0";
  run.env.machine = "x86_64";
  run.env.glibc = "2.36";
  run.env.compiler = long_text("g++ ");
  run.env.rseq_owner = "glibc";
  run.env.cpu_id_backend = "rseq";
  run.env.fallback_backend = "vdso";
  run.env.cpus_online = 2;
  run.env.cpus_allowed = 2;
  for (const method_info& m : methods()) {
    measurement row;
    row.method = &m;
    row.available = std::string(m.name) != "rdpid";
    if (row.available) {
      row.calls = 1000;
      row.elapsed_ns = {1000, 2000, 3000};
    } else {
      row.reason = long_text("the CPU lacks it ");
    }
    run.rows.push_back(row);
  }
  return run;
}

std::string xml_escaped(const std::string& s) {
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

TEST(PercpuBenchReport, SvgKeepsLongTextWhole) {
  const run_result run = made_up_run();
  const std::string path = temp_path("percpu_bench_report_svg");
  std::string error;
  ASSERT_TRUE(write_svg(run, path, &error)) << error;
  const std::string svg = read_file(path);
  unlink(path.c_str());
  EXPECT_NE(svg.find(xml_escaped(run.env.cpu_model)), std::string::npos)
      << "the CPU model is cut or unescaped";
  EXPECT_NE(svg.find(xml_escaped(run.env.compiler)), std::string::npos);
  for (const measurement& row : run.rows) {
    if (!row.available) {
      EXPECT_NE(svg.find(xml_escaped(row.reason)), std::string::npos) << row.method->name;
    }
  }
  const std::string end = "</svg>\n";
  ASSERT_GE(svg.size(), end.size());
  EXPECT_EQ(svg.compare(svg.size() - end.size(), end.size(), end), 0) << "the chart is cut short";
}

TEST(PercpuBenchReport, JsonRoundTripsAnyText) {
  run_result run = made_up_run();
  // A byte that is not UTF-8, as a broken /proc/cpuinfo could hold: the
  // record is still written, with the replacement character in its place.
  run.env.kernel = "6.12.0-\xff";
  const std::string path = temp_path("percpu_bench_report_json");
  std::string error;
  ASSERT_TRUE(write_json(run, path, &error)) << error;
  const std::string text = read_file(path);
  unlink(path.c_str());
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << text.substr(0, 2000);
  EXPECT_EQ(doc.at("environment").at("cpu_model").get<std::string>(), run.env.cpu_model);
  EXPECT_EQ(doc.at("environment").at("compiler").get<std::string>(), run.env.compiler);
  EXPECT_EQ(doc.at("environment").at("kernel").get<std::string>(), "6.12.0-\xef\xbf\xbd");
  EXPECT_EQ(doc.at("command").get<std::vector<std::string>>(), run.opts.argv)
      << "control characters and non-ASCII in the command must survive the \\u escapes";
  ASSERT_EQ(doc.at("methods").size(), run.rows.size());
  for (std::size_t i = 0; i < run.rows.size(); ++i) {
    const json& m = doc.at("methods")[i];
    EXPECT_EQ(m.at("name").get<std::string>(), run.rows[i].method->name);
    if (run.rows[i].available) {
      EXPECT_DOUBLE_EQ(m.at("ns_per_call").get<double>(), 2.0);
      EXPECT_EQ(m.at("elapsed_ns").size(), 3u);
    } else {
      EXPECT_EQ(m.at("reason").get<std::string>(), run.rows[i].reason);
      EXPECT_FALSE(m.contains("ns_per_call"));
    }
  }
}

TEST(PercpuBenchReport, JsonCarriesItsSchemaVersion) {
  const run_result run = made_up_run();
  const std::string path = temp_path("percpu_bench_report_schema");
  std::string error;
  ASSERT_TRUE(write_json(run, path, &error)) << error;
  // Parsed keeping the order of the keys as written.
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(read_file(path), nullptr, false);
  unlink(path.c_str());
  ASSERT_FALSE(doc.is_discarded());
  ASSERT_TRUE(doc.contains("schema_version"));
  EXPECT_EQ(doc.at("schema_version").get<int>(), kJsonSchemaVersion);
  EXPECT_EQ(doc.begin().key(), "schema_version") << "a reader finds the version first";
}

// --- --structures, made up: a known ratio for every row ----------------------

// percpu takes `percpu_ns` per operation and the alternative `alternative_ns`,
// with rseq; the child without rseq failed.
run_result made_up_structures(const std::map<std::string, std::pair<double, double>>& ns) {
  run_result run = made_up_run();
  run.rows.clear();
  run.opts.structures = true;
  run.env.cpu_model = "Made-up CPU";
  run.env.compiler = "g++ 12";
  for (const structure_kind& kind : structure_kinds()) {
    for (const int threads : structure_thread_counts()) {
      structure_row row;
      row.kind = &kind;
      row.threads = threads;
      const std::pair<double, double> figures = ns.at(kind.name);
      row.with_rseq.available = true;
      row.with_rseq.backend = "rseq";
      for (structure_side* side : {&row.with_rseq.percpu, &row.with_rseq.alternative}) {
        const double v = side == &row.with_rseq.percpu ? figures.first : figures.second;
        side->available = true;
        side->calls = 1000;
        side->ns_per_op = {v, v, v * 1.5};
        side->all_ns_per_op = {v * 0.9, v, v * 2};
      }
      row.without_rseq.reason = "the child process without rseq failed (status 1)";
      run.structures.push_back(row);
    }
  }
  return run;
}

// Counter 5x faster than its alternative, the free list at half the
// alternative's speed, the shared_mutex writer at 0.75x (its goal is 0.5x),
// the killed ref at 0.9x (its goal is 0.8x), the rest 2x.
const std::map<std::string, std::pair<double, double>> kStructureFigures = {
    {"counter_add", {1.0, 5.0}},
    {"free_list_push_pop", {4.0, 2.0}},
    {"object_pool_allocate_deallocate", {3.0, 6.0}},
    {"shared_mutex_read", {1.5, 3.0}},
    {"shared_mutex_write", {20.0, 15.0}},
    {"ref_get_put", {2.5, 5.0}},
    {"ref_get_put_killed", {10.0, 9.0}},
    {"object_pool_vs_tcmalloc", {4.0, 5.0}},
    {"object_pool_vs_jemalloc", {4.0, 4.4}},
    {"object_pool_vs_mimalloc", {4.0, 6.0}},
    {"object_pool_burst_vs_tcmalloc", {10.0, 9.0}},
    {"object_pool_burst_vs_jemalloc", {10.0, 12.0}},
    {"object_pool_burst_vs_mimalloc", {10.0, 10.0}},
    {"object_pool_handoff_vs_tcmalloc", {10.0, 8.0}},
    {"object_pool_handoff_vs_jemalloc", {10.0, 12.0}},
    {"object_pool_handoff_vs_mimalloc", {10.0, 10.0}}};

std::string print_to_string(const run_result& run) {
  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  print_text(run, f);
  std::fclose(f);
  std::string text(buf, size);
  std::free(buf);
  return text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// The line that starts with `start`, or "".
std::string line_of(const std::vector<std::string>& lines, const std::string& start) {
  for (const std::string& line : lines) {
    if (line.compare(0, start.size(), start) == 0) return line;
  }
  return "";
}

std::string two_places(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

TEST(PercpuBenchReport, StructureRatiosRunOneWayWithTheirGoals) {
  const run_result run = made_up_structures(kStructureFigures);
  const std::string text = print_to_string(run);
  EXPECT_NE(text.find("ratio = the alternative's median time / percpu's: above 1x, percpu is "
                      "faster; goal: the least ratio the project accepts"),
            std::string::npos)
      << text;
  // Every row's pair of lines is followed by its ratio line: the
  // alternative's time over percpu's, the goal, met or not.
  const std::vector<std::string> lines = lines_of(text);
  std::size_t checked = 0;
  for (std::size_t i = 0; i + 2 < lines.size(); ++i) {
    for (const structure_kind& kind : structure_kinds()) {
      if (lines[i].compare(0, std::strlen(kind.label), kind.label) != 0) continue;
      SCOPED_TRACE(lines[i]);
      const auto& f = kStructureFigures.at(kind.name);
      const double ratio = f.second / f.first;
      const std::string verdict = ratio >= kind.goal_with_rseq ? " met" : " NOT met";
      EXPECT_EQ(lines[i + 1].find("  " + std::string(kind.alternative_label)), 0u);
      const std::string& r = lines[i + 2];
      EXPECT_EQ(r.find("  ratio, goal"), 0u) << r;
      EXPECT_NE(r.find(two_places(ratio) + "x (goal " + two_places(kind.goal_with_rseq) + "x)" +
                       verdict + " "),
                std::string::npos)
          << r;
      EXPECT_NE(r.find("n/a (goal " + two_places(kind.goal_without_rseq) + "x)"), std::string::npos)
          << "without rseq the child failed: " << r;
      ++checked;
    }
  }
  EXPECT_EQ(checked, run.structures.size()) << text;
  EXPECT_NE(text.find("mutex stack / free_list push+pop, with rseq (goal: at least 1.00x)"),
            std::string::npos);
  const std::string summary =
      line_of(lines, "   per-CPU-slot fetch_add / counter::add, with rseq (goal: at least 2.33x)");
  EXPECT_NE(summary.find(" 5.00x / 5.00x  met"), std::string::npos) << summary;

  // The JSON says the same, in the same direction for every row.
  const json doc = written_json(write_json, run, "percpu_bench_report_structures");
  ASSERT_FALSE(doc.is_discarded());
  ASSERT_EQ(doc.at("structures").size(), run.structures.size());
  for (const json& row : doc.at("structures")) {
    SCOPED_TRACE(row.at("name").get<std::string>());
    const auto& f = kStructureFigures.at(row.at("name").get<std::string>());
    EXPECT_EQ(row.at("ratio_is").get<std::string>(), "alternative/percpu");
    const json& with = row.at("with_rseq");
    EXPECT_DOUBLE_EQ(with.at("ratio").get<double>(), f.second / f.first);
    EXPECT_EQ(with.at("goal_met").get<bool>(), f.second / f.first >= with.at("goal").get<double>());
    const json& without = row.at("without_rseq");
    EXPECT_TRUE(without.at("ratio").is_null());
    EXPECT_TRUE(without.at("goal_met").is_null());
    EXPECT_GT(without.at("goal").get<double>(), 0);
  }
  for (const json& b : doc.at("structures_bar")) {
    if (b.at("check").get<std::string>().find("free_list") != std::string::npos &&
        b.at("check").get<std::string>().find("with rseq") != std::string::npos) {
      EXPECT_FALSE(b.at("met").get<bool>()) << "0.5x is short of 1x";
    }
  }

  // And so does the chart, on each percpu bar.
  const std::string path = temp_path("percpu_bench_report_structures");
  std::string error;
  ASSERT_TRUE(write_svg(run, path, &error)) << error;
  const std::string svg = read_file(path);
  unlink(path.c_str());
  EXPECT_NE(svg.find("ratio = the alternative's median time / percpu's: above 1x"),
            std::string::npos);
  EXPECT_NE(svg.find("(ratio 5.00x, goal 2.33x: met)"), std::string::npos);
  EXPECT_NE(svg.find("(ratio 0.50x, goal 1.00x: NOT met)"), std::string::npos);
  EXPECT_NE(svg.find("(ratio 2.00x, goal 1.00x: met)"), std::string::npos);
}

// --- the chart's axis and legend ----------------------------------------------

struct svg_rect {
  std::string cls;
  double x, width;
  std::string fill;
};

std::vector<svg_rect> bar_rects(const std::string& svg) {
  std::vector<svg_rect> out;
  const std::regex re(
      "<rect class=\"(bar[^\"]*)\" x=\"([0-9.]+)\" y=\"[0-9.]+\" width=\"([0-9.]+)\" "
      "height=\"[0-9.]+\" fill=\"(#[0-9a-f]+)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), re), end; it != end; ++it) {
    out.push_back({(*it)[1], std::stod((*it)[2]), std::stod((*it)[3]), (*it)[4]});
  }
  return out;
}

TEST(PercpuBenchReport, SvgBarsStartAtZeroOnALinearAxisWithALegend) {
  run_result run = made_up_run();
  // Figures from 0.3 to 130 ns per call, as on a real machine: the system
  // call's bar is far longer than the rest.
  double ns = 0.3;
  std::map<std::string, double> value;
  for (measurement& row : run.rows) {
    if (!row.available) continue;
    const double v = std::string(row.method->name) == "syscall_getcpu" ? 130 : ns;
    ns += 0.4;
    row.elapsed_ns = {v * 1000, v * 1000, v * 1000};
    value[row.method->label] = v;
  }
  const std::string path = temp_path("percpu_bench_report_axis");
  std::string error;
  ASSERT_TRUE(write_svg(run, path, &error)) << error;
  const std::string svg = read_file(path);
  unlink(path.c_str());
  EXPECT_EQ(svg.find("log"), std::string::npos) << "no log axis";
  EXPECT_NE(svg.find("linear scale"), std::string::npos);
  // The zero tick: every bar starts there.
  const std::regex zero(
      "<text x=\"([0-9.]+)\" y=\"[0-9]+\" font-size=\"12\" "
      "text-anchor=\"middle\">0 ns</text>");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, zero)) << "no 0 ns tick";
  const double x0 = std::stod(m[1]);
  const std::vector<svg_rect> rects = bar_rects(svg);
  ASSERT_EQ(rects.size(), value.size());
  std::size_t broken = 0;
  std::vector<double> px_per_ns;
  std::size_t i = 0;
  for (const measurement& row : run.rows) {
    if (!row.available) continue;
    const svg_rect& r = rects[i++];
    SCOPED_TRACE(row.method->name);
    EXPECT_NEAR(r.x, x0, 0.5) << "a bar starts at the 0 ns tick";
    if (r.cls == "bar broken") {
      ++broken;
      EXPECT_EQ(std::string(row.method->name), "syscall_getcpu");
      continue;
    }
    px_per_ns.push_back(r.width / row.ns_per_call());
  }
  EXPECT_EQ(broken, 1u) << "only the system call's bar is cut";
  for (const double k : px_per_ns) {
    EXPECT_NEAR(k, px_per_ns.front(), px_per_ns.front() * 0.01) << "bar lengths are proportional";
  }
  EXPECT_NE(svg.find(">130.00 ns</text>"), std::string::npos) << "a cut bar shows its figure";
  // The legend names every colour a bar has.
  const std::size_t legend_at = svg.find("<g class=\"legend\"");
  ASSERT_NE(legend_at, std::string::npos);
  const std::string legend = svg.substr(legend_at, svg.find("</g>", legend_at) - legend_at);
  std::set<std::string> colours;
  for (const svg_rect& r : rects) colours.insert(r.fill);
  for (const std::string& c : colours) {
    EXPECT_NE(legend.find("fill=\"" + c + "\""), std::string::npos) << c << " not in the legend";
  }
  EXPECT_NE(legend.find("min-max"), std::string::npos) << "the whiskers are explained";
}

// --- Google Benchmark's JSON format ------------------------------------------

TEST(PercpuBenchReport, GbenchJsonHasWhatCompareReads) {
  const run_result run = made_up_run();
  const json doc = written_json(write_gbench_json, run, "percpu_bench_report_gbench");
  ASSERT_FALSE(doc.is_discarded());
  // compare.py refuses any other schema version.
  EXPECT_EQ(doc.at("context").at("json_schema_version").get<int>(), 1);
  const json& benchmarks = doc.at("benchmarks");
  std::size_t at = 0;
  int family = 0;
  for (const measurement& row : run.rows) {
    SCOPED_TRACE(row.method->name);
    if (!row.available) {
      for (const json& b : benchmarks) EXPECT_NE(b.at("run_name"), row.method->name);
      bool listed = false;
      for (const json& u : doc.at("context").at("percpu_bench_unavailable")) {
        listed = listed || (u.at("name") == row.method->name && u.at("reason") == row.reason);
      }
      EXPECT_TRUE(listed) << "an unmeasured row says why in the context";
      continue;
    }
    // One entry per repetition, in order, then the three aggregates.
    for (std::size_t r = 0; r < row.elapsed_ns.size(); ++r) {
      ASSERT_LT(at, benchmarks.size());
      const json& b = benchmarks[at++];
      EXPECT_EQ(b.at("name").get<std::string>(), row.method->name);
      EXPECT_EQ(b.at("run_name").get<std::string>(), row.method->name);
      EXPECT_EQ(b.at("run_type").get<std::string>(), "iteration");
      EXPECT_EQ(b.at("family_index").get<int>(), family);
      EXPECT_EQ(b.at("per_family_instance_index").get<int>(), 0);
      EXPECT_EQ(b.at("repetitions").get<std::size_t>(), row.elapsed_ns.size());
      EXPECT_EQ(b.at("repetition_index").get<std::size_t>(), r);
      EXPECT_EQ(b.at("threads").get<int>(), 1);
      EXPECT_EQ(b.at("iterations").get<std::uint64_t>(), row.calls);
      EXPECT_EQ(b.at("time_unit").get<std::string>(), "ns");
      EXPECT_DOUBLE_EQ(b.at("real_time").get<double>(), row.elapsed_ns[r] / row.calls);
      EXPECT_DOUBLE_EQ(b.at("cpu_time").get<double>(), row.elapsed_ns[r] / row.calls);
    }
    // 1, 2 and 3 ns: mean 2, median 2, sample standard deviation 1.
    for (const auto& agg : std::vector<std::pair<std::string, double>>{
             {"mean", 2.0}, {"median", 2.0}, {"stddev", 1.0}}) {
      ASSERT_LT(at, benchmarks.size());
      const json& b = benchmarks[at++];
      EXPECT_EQ(b.at("name").get<std::string>(), std::string(row.method->name) + "_" + agg.first);
      EXPECT_EQ(b.at("run_name").get<std::string>(), row.method->name);
      EXPECT_EQ(b.at("run_type").get<std::string>(), "aggregate");
      EXPECT_EQ(b.at("aggregate_name").get<std::string>(), agg.first);
      EXPECT_FALSE(b.contains("repetition_index"));
      EXPECT_DOUBLE_EQ(b.at("real_time").get<double>(), agg.second);
      EXPECT_DOUBLE_EQ(b.at("cpu_time").get<double>(), agg.second);
      EXPECT_EQ(b.at("time_unit").get<std::string>(), "ns");
    }
    ++family;
  }
  EXPECT_EQ(at, benchmarks.size()) << "nothing more than the rows";
}

TEST(PercpuBenchReport, GbenchJsonNamesStructureSidesForCompareFilters) {
  const run_result run = made_up_structures(kStructureFigures);
  const json doc = written_json(write_gbench_json, run, "percpu_bench_report_gbench_structures");
  ASSERT_FALSE(doc.is_discarded());
  std::map<std::string, double> median_of;
  for (const json& b : doc.at("benchmarks")) {
    if (b.value("aggregate_name", "") == "median") {
      median_of[b.at("run_name").get<std::string>()] = b.at("cpu_time").get<double>();
    }
  }
  // Both sides of every row with rseq; without rseq nothing was measured.
  EXPECT_EQ(median_of.size(), run.structures.size() * 2);
  for (const structure_row& row : run.structures) {
    const std::string tail = "/rseq/threads:" + std::to_string(row.threads);
    const std::string name = row.kind->name;
    ASSERT_TRUE(median_of.count(name + "/percpu" + tail)) << name + "/percpu" + tail;
    ASSERT_TRUE(median_of.count(name + "/alternative" + tail));
    EXPECT_DOUBLE_EQ(median_of[name + "/alternative" + tail] / median_of[name + "/percpu" + tail],
                     row.with_rseq.ratio());
  }
}

}  // namespace
}  // namespace bench
}  // namespace percpu
