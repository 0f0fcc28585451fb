// percpu-bench's JSON and SVG writers, fed a run made up here rather than
// measured: the text that lands in them (the CPU model, the kernel, the
// command line) is whatever the machine and the user supply, of any length
// and any bytes, and must come out whole and well-formed.

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
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

}  // namespace
}  // namespace bench
}  // namespace percpu
