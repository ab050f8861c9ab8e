// bin/14_fp8_accuracy: stage 14's accuracy study on the CPU. For Gaussian inputs and for
// FlashAttention-3's outlier inputs it computes O with the FP16 model (stage 10's numerics) and the
// FP8 model under each quantization scheme (fp8_numerics.hpp), and prints as a markdown table the
// RMSE and the largest error of O against the double reference on the unquantized inputs; with
// --csv FILE it also writes the table as CSV (plots/data/model/fp8_accuracy.csv, which
// notebooks/fp8.ipynb draws, is this file at the defaults).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "fa/reference.hpp"
#include "fp8_numerics.hpp"

namespace {

using namespace fa;
using namespace fa::fp8;

struct Row {
  std::string name;
  bool fp16 = false;
  Fp8Options options;
};

const char* qk_name(QkScaling s) { return s == QkScaling::per_tensor ? "tensor" : "block 128 / 64"; }
const char* v_name(VScaling s) {
  return s == VScaling::per_tensor ? "tensor" : (s == VScaling::per_head ? "head" : "channel");
}

// The rows: the FP16 model; the three schemes of the issue (V per channel, P shifted by 2^8, l from
// the FP32 P: the choices of fp8_numerics.hpp); then, on block scales with the rotation, the other
// granularities of V and the other options for P.
std::vector<Row> rows() {
  using Q = QkScaling;
  std::vector<Row> out;
  out.push_back({"FP16 (stage 10's numerics)", true, {}});
  out.push_back({"FP8 per-tensor scales", false, {Q::per_tensor, false, VScaling::per_tensor, 8, false}});
  out.push_back({"FP8 block scales", false, {Q::per_block, false, VScaling::per_channel, 8, false}});
  out.push_back({"FP8 block scales + rotation", false, {Q::per_block, true, VScaling::per_channel, 8, false}});
  for (const VScaling v : {VScaling::per_tensor, VScaling::per_head}) {
    out.push_back({std::string("... V per ") + v_name(v), false, {Q::per_block, true, v, 8, false}});
  }
  for (const auto& [shift, quantized_l] : {std::pair{0, false}, std::pair{0, true}, std::pair{8, true}}) {
    out.push_back({"... P·2^" + std::to_string(shift) + ", l from " + (quantized_l ? "e4m3 P" : "FP32 P"),
                   false,
                   {Q::per_block, true, VScaling::per_channel, shift, quantized_l}});
  }
  return out;
}

// A CSV field: quoted, with any quote doubled (the model names hold commas).
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string scientific(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6e", value);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Stage 14: FP8 attention accuracy (CPU models against the FP64 reference)"};
  Problem problem = Problem::square(1, 4, 2048, 128);
  uint64_t seed = 14;
  app.add_option("--batch", problem.batch, "B")->check(CLI::Range(1, 64));
  app.add_option("--heads", problem.q_heads, "H")->check(CLI::Range(1, 64));
  app.add_option("--seq", problem.q_seq, "N")->check(CLI::Range(1, 1 << 16));
  app.add_option("--dim", problem.dim, "D (1..256)")->check(CLI::Range(1, 256));
  app.add_flag("--causal", problem.causal, "bottom-right causal mask");
  app.add_option("--seed", seed, "input seed");
  std::string csv_path;
  app.add_option("--csv", csv_path,
                 "also write the table to this CSV file (one row per model, the problem in "
                 "every row; errors with 7 significant digits)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "14_fp8_accuracy: %s (see --help)\n", error.what());  // one line, exit code 2
    return 2;
  }
  problem.kv_heads = problem.q_heads;
  problem.kv_seq = problem.q_seq;

  const auto start = std::chrono::steady_clock::now();
  struct Column {
    Inputs inputs;
    std::vector<double> reference;
  };
  std::vector<Column> columns;
  for (bool outliers : {false, true}) {
    Column c{gaussian_inputs(problem, seed, outliers), {}};
    c.reference = reference_attention(c.inputs);
    columns.push_back(std::move(c));
  }

  std::printf("%s%s, seed %llu; O against the FP64 reference on the unquantized inputs\n\n", describe(problem).c_str(),
              problem.causal ? " causal" : "", static_cast<unsigned long long>(seed));
  std::printf(
      "| model | Q, K scales | rotation | V scales | P | l from | Gaussian RMSE | Gaussian max | "
      "outliers RMSE | outliers max |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::ofstream csv;
  if (!csv_path.empty()) {
    csv.open(csv_path);
    if (!csv) {
      std::fprintf(stderr, "14_fp8_accuracy: cannot write %s\n", csv_path.c_str());
      return 2;
    }
    csv << "B,H,N,D,causal,seed,model,qk_scales,rotation,v_scales,p,l_from,gaussian_rmse,gaussian_max,"
           "outliers_rmse,outliers_max\n";
  }
  for (const Row& row : rows()) {
    std::vector<std::string> fields;  // the columns from the model's name to l from, as printed
    if (row.fp16) {
      fields = {row.name, "-", "-", "-", "FP16", "FP32 P"};
    } else {
      const Fp8Options& o = row.options;
      fields = {row.name,
                qk_name(o.qk),
                o.rotate ? "yes" : "no",
                v_name(o.v),
                "e4m3·2^" + std::to_string(o.p_shift),
                o.l_from_quantized_p ? "e4m3 P" : "FP32 P"};
    }
    std::printf("|");
    for (const std::string& field : fields) std::printf(" %s |", field.c_str());
    if (csv.is_open()) {
      csv << problem.batch << ',' << problem.q_heads << ',' << problem.q_seq << ',' << problem.dim << ','
          << (problem.causal ? 1 : 0) << ',' << seed;
      for (const std::string& field : fields) csv << ',' << quoted(field);
    }
    for (const Column& c : columns) {
      const Error e =
          error_against(row.fp16 ? fp16_attention(c.inputs) : fp8_attention(c.inputs, row.options), c.reference);
      std::printf(" %.2e | %.2e |", e.rmse, e.max_abs);
      if (csv.is_open()) csv << ',' << scientific(e.rmse) << ',' << scientific(e.max_abs);
    }
    std::printf("\n");
    if (csv.is_open()) csv << '\n';
    std::fflush(stdout);
  }
  if (csv.is_open()) {
    csv.close();
    if (!csv) {
      std::fprintf(stderr, "14_fp8_accuracy: writing %s failed\n", csv_path.c_str());
      return 2;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "%.1f s\n", seconds);
  return 0;
}
