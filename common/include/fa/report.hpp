// One result row, shared by the console table and the results CSV of DESIGN.md.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "fa/problem.hpp"

namespace fa {

struct ResultRow {
  std::string stage;
  std::string gpu;
  Problem problem;
  std::string dtype;
  std::string pass = "fwd";  // fwd | bwd | fwd+bwd
  double ms_median = 0.0;
  double ms_min = 0.0;
  double tflops = 0.0;
  double gbps = 0.0;
  int64_t peak_bytes = 0;
  double max_abs_err = 0.0;
  double rel_l2_err = 0.0;
  std::string status = "ok";  // ok | oom | unsupported | error
  std::string source_hash;
  std::string note;
  double speedup = 0.0;  // over the previous row in a progression table; 0 if none
};

// The columns of DESIGN.md's results CSV (python/fa_course/bench/schema.py holds the same list).
const std::vector<std::string>& csv_header();
std::string csv_line(const ResultRow& row);
// Appends rows to `path`, writing the header first when the file is new or empty.
void append_csv(const std::string& path, const std::vector<ResultRow>& rows);

void print_table(std::ostream& out, const std::vector<ResultRow>& rows, bool with_speedup);

std::string format_bytes(int64_t bytes);

}  // namespace fa
