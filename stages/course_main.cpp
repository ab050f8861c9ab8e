// The course progression: every stage on the same inputs, one table (the README's main job).
#include <algorithm>
#include <iostream>

#include "fa/cli.hpp"
#include "fa/device.hpp"
#include "fa/stages.hpp"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  fa::CommandLine defaults;
  defaults.run.problem = fa::Problem::square(1, 8, 1024, 64);  // a second or two for the CPU stage
  fa::ParseResult parsed = fa::parse_command_line("fa_course", 256, args, defaults);
  if (!parsed.ok) {
    (parsed.exit_code == fa::kExitOk ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  const fa::CommandLine& line = parsed.command_line;
  try {
    const fa::DeviceInfo device = fa::query_device();
    std::cout << "FlashAttention from scratch: every stage on the same inputs (" << fa::describe(line.run.problem)
              << ", seed " << line.run.seed << ")\n";
    std::cout << (device.present
                      ? "GPU: " + device.name
                      : "No CUDA GPU here (" + device.reason + "): the CPU stage runs; the GPU stages need a CUDA GPU.")
              << "\n\n";

    std::vector<fa::ResultRow> rows;
    int exit_code = fa::kExitOk;
    for (const fa::StageDescriptor& stage : fa::stages::all()) {
      fa::RunOptions options = line.run;
      if (stage.backend == fa::Backend::cpu) {  // the CPU stage is slow: time it briefly
        options.warmup = std::min(options.warmup, 1);
        options.reps = std::min(options.reps, 3);
      }
      fa::RunOutcome outcome = fa::run_stage(stage, options);
      if (outcome.row.status == "unsupported" && outcome.exit_code == fa::kExitNoDevice) {
        outcome.row.note = "needs a CUDA GPU";
      } else if (outcome.exit_code != fa::kExitOk) {
        exit_code = outcome.exit_code;
      }
      rows.push_back(outcome.row);
    }
    // The speed-up column compares each stage with the last stage before it that ran.
    const fa::ResultRow* previous = nullptr;
    for (fa::ResultRow& row : rows) {
      if (row.status != "ok") continue;
      row.speedup = previous != nullptr && row.ms_median > 0.0 ? previous->ms_median / row.ms_median : 0.0;
      previous = &row;
    }
    fa::print_table(std::cout, rows, true);
    if (!line.csv_path.empty()) fa::append_csv(line.csv_path, rows);
    return exit_code;
  } catch (const std::exception& error) {
    std::cerr << "fa_course: " << error.what() << "\n";
    return fa::kExitError;
  }
}
