// The shared command line: good values parse, bad ones give one line and a non-zero code.
#include "fa/cli.hpp"

#include <string>
#include <vector>

#include "catch_compat.hpp"

namespace {

fa::ParseResult parse(const std::vector<std::string>& args) { return fa::parse_command_line("stage", 128, args); }

void check_rejected(const std::vector<std::string>& args) {
  const fa::ParseResult result = parse(args);
  INFO("arguments: " << args.front() << " " << (args.size() > 1 ? args[1] : ""));
  CHECK_FALSE(result.ok);
  CHECK(result.exit_code != 0);
  CHECK_FALSE(result.message.empty());
  CHECK(result.message.find('\n') == std::string::npos);  // one line
}

}  // namespace

TEST_CASE("common: command line parses every option") {
  const fa::ParseResult result = parse({"--batch", "2", "--heads", "3", "--seq", "100", "--dim", "80", "--seed", "9",
                                        "--warmup", "1", "--reps", "4", "--no-check", "--csv", "out.csv"});
  REQUIRE(result.ok);
  const fa::CommandLine& line = result.command_line;
  CHECK(line.run.problem.batch == 2);
  CHECK(line.run.problem.q_heads == 3);
  CHECK(line.run.problem.q_seq == 100);
  CHECK(line.run.problem.dim == 80);
  CHECK(line.run.seed == 9);
  CHECK(line.run.warmup == 1);
  CHECK(line.run.reps == 4);
  CHECK_FALSE(line.run.check);
  CHECK(line.csv_path == "out.csv");
  CHECK_FALSE(line.walkthrough);
  CHECK(parse({"--walkthrough"}).command_line.walkthrough);
}

TEST_CASE("common: command line rejects bad sizes and unknown flags") {
  check_rejected({"--seq", "0"});
  check_rejected({"--dim", "0"});
  check_rejected({"--dim", "129"});
  check_rejected({"--batch", "-1"});
  check_rejected({"--heads", "-7"});
  check_rejected({"--seq", "99999999999999"});
  check_rejected({"--seq", "many"});
  check_rejected({"--frobnicate"});
  check_rejected({"--reps", "-2"});
}

TEST_CASE("common: --help prints the options and exits 0") {
  const fa::ParseResult result = parse({"--help"});
  CHECK_FALSE(result.ok);
  CHECK(result.exit_code == 0);
  CHECK(result.message.find("--seq") != std::string::npos);
  CHECK(result.message.find("--walkthrough") != std::string::npos);
}

TEST_CASE("common: command line takes key/value heads and a key length of their own") {
  const fa::ParseResult square = parse({"--heads", "8", "--seq", "100"});
  REQUIRE(square.ok);
  CHECK(square.command_line.run.problem.kv_heads == 8);  // Hkv and Nk follow Hq and N
  CHECK(square.command_line.run.problem.kv_seq == 100);
  CHECK_FALSE(square.command_line.run.lse);
  const fa::ParseResult general = parse({"--heads", "8", "--kv-heads", "2", "--seq", "4", "--seq-k", "1000", "--lse"});
  REQUIRE(general.ok);
  const fa::Problem& problem = general.command_line.run.problem;
  CHECK(problem.q_heads == 8);
  CHECK(problem.kv_heads == 2);
  CHECK(problem.q_seq == 4);
  CHECK(problem.kv_seq == 1000);
  CHECK(general.command_line.run.lse);
  check_rejected({"--heads", "8", "--kv-heads", "3"});  // not a divisor
  check_rejected({"--kv-heads", "0"});
  check_rejected({"--seq-k", "0"});
}
