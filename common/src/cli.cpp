#include "fa/cli.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>

namespace fa {

ParseResult parse_command_line(const std::string& program, int64_t max_dim, const std::vector<std::string>& args,
                               const CommandLine& defaults) {
  ParseResult result;
  result.command_line = defaults;
  CommandLine& line = result.command_line;
  RunOptions& run = line.run;

  CLI::App app{
      "Runs one stage of the FlashAttention course on random inputs: checks it against the CPU reference "
      "and times it.",
      program};
  Problem& problem = run.problem;
  // Hkv and Nk follow Hq and N unless given (0 here means "not given").
  int64_t kv_heads = defaults.run.problem.kv_heads == defaults.run.problem.q_heads ? 0 : problem.kv_heads;
  int64_t kv_seq = defaults.run.problem.kv_seq == defaults.run.problem.q_seq ? 0 : problem.kv_seq;
  app.add_option("--batch,-b", problem.batch, "batch size B")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, kMaxBatchHeads));
  app.add_option("--heads,-H", problem.q_heads, "query heads Hq (also the key/value heads unless --kv-heads)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, kMaxBatchHeads));
  app.add_option("--kv-heads", kv_heads,
                 "key/value heads Hkv, a divisor of Hq (grouped-query attention; 1: multi-query)")
      ->check(CLI::Range(int64_t{1}, kMaxBatchHeads));
  app.add_option("--seq,-n", problem.q_seq, "sequence length N (of the queries, and of the keys unless --seq-k)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, kMaxSeq));
  app.add_option("--seq-k", kv_seq, "key/value sequence length Nk when it differs from the queries' N")
      ->check(CLI::Range(int64_t{1}, kMaxSeq));
  app.add_option("--dim,-d", problem.dim, "head dim D")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, max_dim));
  app.add_flag("--causal", problem.causal,
               "causal masking: query i attends to keys 0..i (with --seq-k: 0..i + Nk - N, aligned bottom-right)");
  app.add_flag("--lse", run.lse, "also write the per-row log-sum-exp, and check it");
  app.add_option("--seed", run.seed, "seed of the random inputs")->capture_default_str();
  app.add_option("--warmup", run.warmup, "untimed runs before timing")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--reps", run.reps, "timed runs (the median and min are reported)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_flag("--check,!--no-check", run.check, "compare with the double CPU reference")->capture_default_str();
  app.add_option("--check-rows", run.check_rows, "query rows compared (all when there are fewer)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_flag("--walkthrough", line.walkthrough,
               "run the N=4 walkthrough fixture and print it beside the exact values");
  app.add_option("--csv", line.csv_path, "append the result row to this CSV file (design.md schema)");

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

}  // namespace fa
