#include "fa/cli.hpp"

#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace fa {
namespace {

// A whole number from `low` to `high`, with a message that says which of the two is wrong: CLI11's
// own Range answers "Value abc not in range 1 to 16777216" to a word, which reads as if abc were
// merely too large.
CLI::Validator whole_number(int64_t low, int64_t high, const std::string& what) {
  const std::string range = what + " goes from " + std::to_string(low) + " to " + std::to_string(high);
  return CLI::Validator(
      [low, high, range](std::string& text) -> std::string {
        std::size_t used = 0;
        int64_t value = 0;
        try {
          value = std::stoll(text, &used);
        } catch (const std::out_of_range&) {
          return text + " is out of range: " + range;
        } catch (const std::invalid_argument&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "'" + text + "' is not a whole number (" + range + ")";
        if (value < low || value > high) return text + " is out of range: " + range;
        return std::string();
      },
      "[" + std::to_string(low) + ", " + std::to_string(high) + "]");
}

const char* kStageDescription =
    "Runs one stage of the FlashAttention course on random inputs: checks it against the double CPU reference "
    "and times it.";
const char* kStageFooter =
    "Exit codes: 0 ok, 1 wrong output, 2 bad command line or a problem the stage does not take, 3 out of memory, "
    "4 no CUDA GPU here (or one too old for the stage), 5 CUDA error.";

std::string cuda_version(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

}  // namespace

ParseResult parse_command_line(const std::string& program, int64_t max_dim, const std::vector<std::string>& args,
                               const CommandLine& defaults, const std::string& description, const std::string& footer) {
  ParseResult result;
  result.command_line = defaults;
  CommandLine& line = result.command_line;
  RunOptions& run = line.run;

  CLI::App app{description.empty() ? std::string(kStageDescription) : description, program};
  app.footer(footer.empty() ? std::string(kStageFooter) : footer);
  Problem& problem = run.problem;
  // Hkv and Nk follow Hq and N unless given (0 here means "not given").
  int64_t kv_heads = defaults.run.problem.kv_heads == defaults.run.problem.q_heads ? 0 : problem.kv_heads;
  int64_t kv_seq = defaults.run.problem.kv_seq == defaults.run.problem.q_seq ? 0 : problem.kv_seq;
  app.add_option("--batch,-b", problem.batch, "batch size B")
      ->capture_default_str()
      ->check(whole_number(1, kMaxBatchHeads, "B"));
  app.add_option("--heads,-H", problem.q_heads, "query heads Hq (also the key/value heads unless --kv-heads)")
      ->capture_default_str()
      ->check(whole_number(1, kMaxBatchHeads, "H"));
  app.add_option("--kv-heads", kv_heads,
                 "key/value heads Hkv, a divisor of Hq (grouped-query attention; 1: multi-query)")
      ->check(whole_number(1, kMaxBatchHeads, "Hkv"));
  app.add_option("--seq,-n", problem.q_seq, "sequence length N (of the queries, and of the keys unless --seq-k)")
      ->capture_default_str()
      ->check(whole_number(1, kMaxSeq, "N"));
  app.add_option("--seq-k", kv_seq, "key/value sequence length Nk when it differs from the queries' N")
      ->check(whole_number(1, kMaxSeq, "Nk"));
  app.add_option("--dim,-d", problem.dim, "head dim D")->capture_default_str()->check(whole_number(1, max_dim, "D"));
  app.add_flag("--causal", problem.causal,
               "causal masking: query i attends to keys 0..i (with --seq-k: 0..i + Nk - N, aligned bottom-right)");
  app.add_flag("--lse", run.lse, "also write the per-row log-sum-exp, and check it");
  std::string pass = pass_name(defaults.run.pass);
  app.add_option("--pass", pass,
                 "bwd: the backward pass (the stage's forward writes O and the LSE, then dQ, dK, dV from a random dO "
                 "are checked and the backward alone is timed)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fwd", "bwd"}));
  app.add_option("--check-kv-heads", run.check_kv_heads,
                 "backward: whole (batch, key/value head) groups compared with the double reference")
      ->capture_default_str()
      ->check(whole_number(1, kMaxBatchHeads, "--check-kv-heads"));
  app.add_option("--seed", run.seed, "seed of the random inputs")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<int64_t>::max(), "the seed"));
  app.add_option("--warmup", run.warmup, "untimed runs before timing")
      ->capture_default_str()
      ->check(whole_number(0, 1000, "--warmup"));
  app.add_option("--reps", run.reps, "timed runs, of which the median and min are reported (0: check only, no timing)")
      ->capture_default_str()
      ->check(whole_number(0, 100000, "--reps"));
  app.add_flag("--check,!--no-check", run.check, "compare with the double CPU reference")->capture_default_str();
  app.add_option("--check-rows", run.check_rows, "query rows compared (all when there are fewer)")
      ->capture_default_str()
      ->check(whole_number(1, int64_t{1} << 30, "--check-rows"));
  app.add_flag("--walkthrough", line.walkthrough,
               "run the N=4 walkthrough fixture (tiles of 2 keys) and print it beside the exact values");
  app.add_option("--csv", line.csv_path, "append the result row to this CSV file (DESIGN.md schema)");

  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    result.exit_code = kExitOk;
    result.message = app.help();
    return result;
  } catch (const CLI::ParseError& error) {
    result.exit_code = kExitBadInput;
    result.message = program + ": " + error.what() + " (see --help)";
    return result;
  }
  for (const char* option : {"--batch", "--heads", "--kv-heads", "--seq", "--seq-k", "--dim"}) {
    if (app.count(option) > 0) line.shape_given = true;
  }
  run.pass = pass == "bwd" ? Pass::backward : Pass::forward;
  problem.kv_heads = kv_heads > 0 ? kv_heads : problem.q_heads;
  problem.kv_seq = kv_seq > 0 ? kv_seq : problem.q_seq;
  if (problem.q_heads % problem.kv_heads != 0) {
    result.exit_code = kExitBadInput;
    result.message = program + ": --kv-heads " + std::to_string(problem.kv_heads) + " does not divide --heads " +
                     std::to_string(problem.q_heads) + " (see --help)";
    return result;
  }
  run.time = run.reps > 0;
  result.ok = true;
  return result;
}

std::string describe_missing_gpu(const DeviceInfo& device) {
  if (device.present) return "";
  int driver = 0;
  int runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  cudaGetLastError();  // leave no error behind for later calls
  if (driver == 0) return "no NVIDIA driver is installed on this machine, so there is no CUDA GPU to run on";
  if (runtime > 0 && driver < runtime) {
    return "the NVIDIA driver here supports CUDA up to " + cuda_version(driver) + ", older than the CUDA " +
           cuda_version(runtime) + " this course was built with: update the driver, or build with CUDA " +
           cuda_version(driver);
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return "the NVIDIA driver (CUDA " + cuda_version(driver) + ") sees no CUDA GPU" +
         (visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + " may hide it)" : std::string());
}

}  // namespace fa
