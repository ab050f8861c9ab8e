#include "fa/report.hpp"

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace fa {
namespace {

std::string number(double value, int precision) {
  std::ostringstream text;
  text << std::setprecision(precision) << value;
  return text.str();
}

std::string fixed(double value, int decimals) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(decimals) << value;
  return text.str();
}

// A CSV field: quoted when it holds a separator, a quote or a line break.
std::string field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

const std::vector<std::string>& csv_header() {
  static const std::vector<std::string> header = {
      "stage", "gpu",        "B",           "Hq",         "Hkv",       "Nq",          "Nk",
      "D",     "dtype",      "causal",      "pass",       "ms_median", "ms_min",      "tflops",
      "gbps",  "peak_bytes", "max_abs_err", "rel_l2_err", "status",    "source_hash", "note"};
  return header;
}

std::string csv_line(const ResultRow& row) {
  const std::vector<std::string> fields = {field(row.stage),
                                           field(row.gpu),
                                           std::to_string(row.problem.batch),
                                           std::to_string(row.problem.q_heads),
                                           std::to_string(row.problem.kv_heads),
                                           std::to_string(row.problem.q_seq),
                                           std::to_string(row.problem.kv_seq),
                                           std::to_string(row.problem.dim),
                                           row.dtype,
                                           row.problem.causal ? "1" : "0",
                                           row.pass,
                                           number(row.ms_median, 6),
                                           number(row.ms_min, 6),
                                           number(row.tflops, 6),
                                           number(row.gbps, 6),
                                           std::to_string(row.peak_bytes),
                                           number(row.max_abs_err, 6),
                                           number(row.rel_l2_err, 6),
                                           row.status,
                                           row.source_hash,
                                           field(row.note)};
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) line += (i == 0 ? "" : ",") + fields[i];
  return line;
}

void append_csv(const std::string& path, const std::vector<ResultRow>& rows) {
  bool needs_header = true;
  {
    std::ifstream existing(path);
    needs_header = !existing.good() || existing.peek() == std::ifstream::traits_type::eof();
  }
  std::ofstream out(path, std::ios::app);
  if (!out) throw std::runtime_error("cannot write the CSV file " + path);
  if (needs_header) {
    const auto& header = csv_header();
    for (std::size_t i = 0; i < header.size(); ++i) out << (i == 0 ? "" : ",") << header[i];
    out << "\n";
  }
  for (const ResultRow& row : rows) out << csv_line(row) << "\n";
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return fixed(value, unit == 0 ? 0 : 1) + " " + units[unit];
}

namespace {

// Compute throughput with its unit in every cell: TFLOP/s from 1 TFLOP/s up, GFLOP/s below (the
// CPU stage), so no row reads "0.00".
std::string flops_cell(double tflops) {
  if (tflops >= 1.0) return fixed(tflops, 1) + " T";
  return number(tflops * 1e3, 3) + " G";
}

std::string gbps_cell(double gbps) { return gbps >= 1.0 ? fixed(gbps, 1) : number(gbps, 2); }

}  // namespace

void print_table(std::ostream& out, const std::vector<ResultRow>& rows, bool with_speedup) {
  out << std::left << std::setw(20) << "stage" << std::right << std::setw(6) << "dtype" << std::setw(12) << "ms"
      << std::setw(11) << "FLOP/s" << std::setw(10) << "GB/s";
  if (with_speedup) out << std::setw(10) << "speed-up";
  out << std::setw(12) << "peak mem" << std::setw(12) << "max err"
      << "  status\n";
  for (const ResultRow& row : rows) {
    const bool ran = row.status == "ok";
    const bool timed = ran && row.ms_median > 0.0;  // --reps 0 checks without timing
    // A backward row says so after the stage's name ("11_backward bwd"); forward rows are the default.
    out << std::left << std::setw(20) << (row.pass == "fwd" ? row.stage : row.stage + " " + row.pass) << std::right
        << std::setw(6) << row.dtype << std::setw(12) << (timed ? fixed(row.ms_median, 3) : "-") << std::setw(11)
        << (timed ? flops_cell(row.tflops) : "-") << std::setw(10) << (timed ? gbps_cell(row.gbps) : "-");
    if (with_speedup) out << std::setw(10) << (timed && row.speedup > 0.0 ? fixed(row.speedup, 2) + "x" : "-");
    out << std::setw(12) << format_bytes(row.peak_bytes) << std::setw(12) << (ran ? number(row.max_abs_err, 2) : "-")
        << "  " << row.status;
    std::string note = row.note;
    if (ran && !timed) note = "not timed: --reps 0" + std::string(note.empty() ? "" : "; ") + note;
    if (!note.empty()) out << " (" << note << ")";
    out << "\n";
  }
}

}  // namespace fa
