// The command line every stage executable (and the course progression) shares.
#pragma once

#include <string>
#include <vector>

#include "fa/runner.hpp"

namespace fa {

struct CommandLine {
  RunOptions run;
  bool walkthrough = false;
  std::string csv_path;  // empty: no CSV
};

struct ParseResult {
  bool ok = false;
  int exit_code = kExitOk;  // when !ok: 0 after --help, non-zero for a bad command line
  std::string message;      // one line for a bad command line; the help text after --help
  CommandLine command_line;
};

// `max_dim` is the stage's largest head dim (checked here, so --dim 999 fails with a message);
// `defaults` holds the values of options not given.
ParseResult parse_command_line(const std::string& program, int64_t max_dim, const std::vector<std::string>& args,
                               const CommandLine& defaults = CommandLine{});

}  // namespace fa
