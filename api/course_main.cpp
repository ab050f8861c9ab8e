// The course progression: every stage on the same inputs, one table (the README's main job).
//
// By default the GPU stages run at (B, H, N, D) = (4, 16, 2048, 128): 1024 query tiles of 128 rows,
// enough to fill any GPU of the course (T4 to H200), so what each stage buys shows in the table,
// while the naive stage's N×N scores (1 GiB) still fit and take a fraction of a second. The CPU
// stage, a thousand times slower, runs a smaller problem with the same N and D, and the table says
// so; its FLOP/s still compare with the GPU stages'.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "fa/cli.hpp"
#include "fa/device.hpp"
#include "fa/stages.hpp"

namespace {

const fa::Problem kGpuDefault = fa::Problem::square(4, 16, 2048, 128);
const fa::Problem kCpuDefault = fa::Problem::square(1, 1, 2048, 128);
constexpr double kCpuBudgetSeconds = 5.0;  // the CPU row of the table, all of its runs
// Decoding (stage 12) runs where it exists: a few new query rows of grouped heads against a long
// cache, beside stage 08 on the same step.
const char* const kDecodingStage = "12_split_kv";
const char* const kDecodingBaseline = "08_mma_registers";
const fa::Problem kDecodingShape{1, 32, 8, 4, 65536, 128, false};

const char* kDescription =
    "The FlashAttention course: runs every stage on the same random inputs, checks each against the double "
    "CPU reference, times it, and prints one table (ms, FLOP/s, speed-up over the stage before, peak memory, "
    "error).";

std::string footer() {
  std::ostringstream text;
  text << "Default shape: on a GPU, " << fa::describe(kGpuDefault)
       << " for the GPU stages (enough blocks to fill the GPU, so each stage's gain shows) and "
       << fa::describe(kCpuDefault)
       << " for the CPU stage, which the table marks as smaller. Without a GPU only the CPU stage runs, at "
       << fa::describe(kCpuDefault)
       << ". With --batch, --heads, --seq or --dim every stage runs that shape, except that the CPU stage is "
          "scaled down (and marked) where it would take more than a few seconds. The speed-up column divides FLOP/s, "
          "so it compares stages that ran different sizes. --walkthrough runs the N=4 fixture through every stage. "
          "Exit codes: 0 ok, 1 a stage gave a wrong output, 2 bad command line, 3 out of memory, 5 CUDA error.";
  return text.str();
}

fa::RunOptions cpu_options(fa::RunOptions options) {
  options.warmup = std::min(options.warmup, 1);  // the CPU stage is slow: time it briefly
  options.reps = std::min(options.reps, 3);
  return options;
}

// The user's problem, made smaller until the CPU stage's runs fit the budget: first one batch,
// then one key/value head (with its query heads), then shorter sequences.
fa::Problem cpu_sized(const fa::RunOptions& options) {
  fa::RunOptions sized = cpu_options(options);
  fa::Problem& problem = sized.problem;
  double speed = 0.0;  // measured only when the estimate says it matters
  for (const fa::StageDescriptor& stage : fa::stages::all()) {
    if (stage.backend == fa::Backend::cpu && fa::estimated_cpu_run_seconds(sized) > kCpuBudgetSeconds / 4) {
      speed = fa::measure_cpu_speed(stage, problem.dim);
    }
  }
  while (fa::estimated_cpu_run_seconds(sized, speed) > kCpuBudgetSeconds) {
    if (problem.batch > 1) {
      problem.batch = 1;
    } else if (problem.kv_heads > 1) {
      problem.q_heads = problem.group_size();
      problem.kv_heads = 1;
    } else if (problem.q_heads > 1) {
      problem.q_heads = 1;  // multi-query: one key/value head for them all
    } else if (problem.q_seq > 1 || problem.kv_seq > 1) {
      problem.q_seq = std::max<int64_t>(1, problem.q_seq / 2);
      problem.kv_seq = std::max<int64_t>(1, problem.kv_seq / 2);
    } else {
      break;
    }
  }
  return problem;
}

bool same_shape(const fa::Problem& a, const fa::Problem& b) {
  return a.batch == b.batch && a.q_heads == b.q_heads && a.kv_heads == b.kv_heads && a.q_seq == b.q_seq &&
         a.kv_seq == b.kv_seq && a.dim == b.dim && a.causal == b.causal;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  fa::CommandLine defaults;
  defaults.run.problem = kGpuDefault;
  fa::ParseResult parsed = fa::parse_command_line("fa_course", 256, args, defaults, kDescription, footer());
  if (!parsed.ok) {
    (parsed.exit_code == fa::kExitOk ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  const fa::CommandLine& line = parsed.command_line;
  try {
    if (line.walkthrough) return fa::run_walkthrough_all(fa::stages::all(), std::cout);

    const fa::DeviceInfo device = fa::query_device();
    const fa::Problem gpu_problem = line.run.problem;
    fa::Problem cpu_problem = kCpuDefault;
    cpu_problem.causal = gpu_problem.causal;
    if (line.shape_given) cpu_problem = cpu_sized(line.run);

    std::cout << "FlashAttention from scratch: every stage on the same inputs ("
              << fa::describe(device.present ? gpu_problem : cpu_problem) << ", seed " << line.run.seed << ")\n";
    if (device.present) {
      std::cout << "GPU: " << device.name << " (" << device.multiprocessors << " SMs, sm_" << device.compute_capability
                << ")\n";
      if (!same_shape(cpu_problem, gpu_problem)) {
        std::cout << "The CPU stage runs a smaller problem, " << fa::describe(cpu_problem) << " ("
                  << fa::attention_flops(gpu_problem) / fa::attention_flops(cpu_problem)
                  << " times less work): compare its FLOP/s, not its time.\n";
      }
    } else {
      std::cout << "No CUDA GPU here (" << fa::describe_missing_gpu(device)
                << "): the CPU stage runs; the GPU stages are listed but need a CUDA GPU.\n";
      if (line.shape_given && !same_shape(cpu_problem, gpu_problem)) {
        std::cout << "The CPU stage runs " << fa::describe(cpu_problem) << " instead of " << fa::describe(gpu_problem)
                  << ", which would take it too long.\n";
      }
    }
    std::cout << "\n";

    // Part one, the forward progression: each stage is the next step of the one before. Part two, each
    // at the shape it exists for: the backward passes (11, and 13 on Hopper) at the same shape, and
    // decoding (12) at a decoding shape beside stage 08 on the same step, which is what it improves on.
    std::vector<fa::ResultRow> progression, beyond;
    int exit_code = fa::kExitOk;
    auto run = [&](const fa::StageDescriptor& stage, fa::RunOptions options, const char* note) {
      fa::RunOutcome outcome = fa::run_stage(stage, options);
      if (outcome.exit_code == fa::kExitNoDevice) {
        // Not a failure of the course: this machine cannot run the stage.
        outcome.row.note = device.present ? outcome.row.note : "needs a CUDA GPU";
      } else if (outcome.exit_code != fa::kExitOk) {
        exit_code = outcome.exit_code;
      }
      if (outcome.row.status == "ok" && note != nullptr) {
        outcome.row.note = note;
      } else if (outcome.row.status == "ok" && !same_shape(options.problem, gpu_problem) && device.present) {
        outcome.row.note = "at " + fa::describe(options.problem);
      }
      return outcome.row;
    };
    for (const fa::StageDescriptor& stage : fa::stages::all()) {
      const bool cpu = stage.backend == fa::Backend::cpu;
      fa::RunOptions options = cpu ? cpu_options(line.run) : line.run;
      if (cpu) options.problem = cpu_problem;
      if (std::string(stage.id) == kDecodingStage) {
        options.problem = kDecodingShape;
        const fa::ResultRow* baseline_row = nullptr;
        for (const fa::StageDescriptor& baseline : fa::stages::all()) {
          if (std::string(baseline.id) == kDecodingBaseline && baseline.precision == stage.precision) {
            beyond.push_back(run(baseline, options, "the same decoding step on stage 08"));
            baseline_row = &beyond.back();
          }
        }
        fa::ResultRow row = run(stage, options, "decoding: Nq = 4 new rows against Nk = 65536 cached keys");
        if (row.status == "ok" && baseline_row != nullptr && baseline_row->status == "ok" && row.tflops > 0.0 &&
            baseline_row->tflops > 0.0) {
          row.speedup = row.tflops / baseline_row->tflops;
        }
        beyond.push_back(row);
      } else if (stage.features.backward) {
        // A stage whose idea is the backward pass shows its backward; its forward is an earlier stage's.
        options.pass = fa::Pass::backward;
        beyond.push_back(run(stage, options, nullptr));
      } else {
        progression.push_back(run(stage, options, nullptr));
      }
    }
    // The speed-up column compares each stage with the stage just before it, in the same precision
    // where that one has it (08's bf16 row with 07's bf16 row), by FLOP/s: the same as by time where
    // both ran the same problem, and still a fair ratio for the smaller CPU problem.
    for (std::size_t i = 0; i < progression.size(); ++i) {
      fa::ResultRow& row = progression[i];
      if (row.status != "ok" || row.tflops <= 0.0) continue;
      const fa::ResultRow* previous = nullptr;
      for (std::size_t j = i; j-- > 0;) {
        const fa::ResultRow& earlier = progression[j];
        if (earlier.status != "ok" || earlier.tflops <= 0.0 || earlier.stage == row.stage) continue;
        if (previous != nullptr && previous->stage != earlier.stage) break;  // only the stage just before
        if (previous == nullptr || earlier.dtype == row.dtype) previous = &earlier;
      }
      row.speedup = previous != nullptr ? row.tflops / previous->tflops : 0.0;
    }
    std::cout << "The forward progression (speed-up: over the stage before):\n";
    fa::print_table(std::cout, progression, true);
    std::cout << "\nBeyond the progression, each at the shape it exists for: the backward pass, and decoding "
              << fa::describe(kDecodingShape) << " (speed-up: over stage 08 on the same step):\n";
    fa::print_table(std::cout, beyond, true);
    std::vector<fa::ResultRow> rows = progression;
    rows.insert(rows.end(), beyond.begin(), beyond.end());
    if (!line.csv_path.empty()) fa::append_csv(line.csv_path, rows);
    return exit_code;
  } catch (const std::exception& error) {
    std::cerr << "fa_course: " << error.what() << "\n";
    return fa::kExitError;
  }
}
