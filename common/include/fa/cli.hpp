// The command line every stage executable (and the course progression) shares.
#pragma once

#include <string>
#include <vector>

#include "fa/device.hpp"
#include "fa/runner.hpp"

namespace fa {

struct CommandLine {
  RunOptions run;
  bool walkthrough = false;
  std::string csv_path;      // empty: no CSV
  bool shape_given = false;  // any of --batch --heads --kv-heads --seq --seq-k --dim was given
};

struct ParseResult {
  bool ok = false;
  int exit_code = kExitOk;  // when !ok: 0 after --help, non-zero for a bad command line
  std::string message;      // one line for a bad command line; the help text after --help
  CommandLine command_line;
};

// `max_dim` is the stage's largest head dim (checked here, so --dim 999 fails with a message);
// `defaults` holds the values of options not given; `description` heads the --help text (empty:
// the text of a stage executable) and `footer` ends it.
ParseResult parse_command_line(const std::string& program, int64_t max_dim, const std::vector<std::string>& args,
                               const CommandLine& defaults = CommandLine{}, const std::string& description = "",
                               const std::string& footer = "");

// Why no CUDA GPU can be used here, in words a newcomer reads right: "no NVIDIA driver is
// installed on this machine" rather than the runtime's "CUDA driver version is insufficient for
// CUDA runtime version" (which is what a machine without any driver reports). `device` is what
// query_device() returned.
std::string describe_missing_gpu(const DeviceInfo& device);

}  // namespace fa
