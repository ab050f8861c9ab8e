// `--walkthrough`: the N=4 fixture through a stage, printed beside the exact values.
//
// The verdict comes from the run that can show a mistake: where the stage reports its per-tile
// state (stage.trace), from its run with K/V tiles of 2 keys, where N = 4 makes two tiles and the
// update between them runs; the stage's own forward pass, whose tiles hold all 4 keys at once, is
// checked too and reported as such. A stage that cannot report its state is judged on its final O,
// and the output says what that can and cannot catch. Without a GPU a GPU stage still prints every
// exact value, then one line saying the stage itself needs a GPU.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "fa/cli.hpp"
#include "fa/device.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/runner.hpp"

namespace fa {
namespace {

void print_vector(std::ostream& out, const double* values, int64_t count) {
  out << "[";
  for (int64_t i = 0; i < count; ++i) out << (i == 0 ? "" : ", ") << std::setw(11) << values[i];
  out << "]";
}

bool close(double actual, double exact, double tolerance) { return std::fabs(actual - exact) <= tolerance; }

std::string number(double value) {
  std::ostringstream text;
  text << std::setprecision(3) << value;
  return text.str();
}

// The fixture as a stage of `precision` sees it, and its exact values.
struct Exact {
  Inputs inputs;
  std::vector<double> scores;  // N × N
  TileTrace trace;             // after each K/V tile of kWalkthroughTile keys
  std::vector<double> final_o;

  explicit Exact(Precision precision) : inputs(walkthrough_inputs()) {
    round_to_precision(inputs, precision);
    scores = reference_scores(inputs, 0);
    trace = reference_trace(inputs, kWalkthroughTile);
    final_o = reference_attention(inputs);
  }
  int64_t seq() const { return inputs.problem.q_seq; }
  int64_t dim() const { return inputs.problem.dim; }
  int64_t rows() const { return inputs.problem.q_rows(); }
};

void print_scores(std::ostream& out, const Exact& exact) {
  out << "\nS = Q K^T / sqrt(" << exact.dim() << "), exact:\n";
  for (int64_t i = 0; i < exact.seq(); ++i) {
    out << "  ";
    print_vector(out, &exact.scores[static_cast<std::size_t>(i * exact.seq())], exact.seq());
    out << "\n";
  }
}

void print_exact_trace(std::ostream& out, const Exact& exact) {
  const TileTrace& want = exact.trace;
  for (int64_t t = 0; t < want.tiles; ++t) {
    for (int64_t r = 0; r < want.rows; ++r) {
      out << "  tile " << t << " row " << r << "  m " << std::setw(11) << want.m_at(t, r) << "  l " << std::setw(11)
          << want.l_at(t, r) << "  O ";
      print_vector(out, &want.o_at(t, r, 0), want.dim);
      out << "\n";
    }
  }
}

void print_exact_final(std::ostream& out, const Exact& exact) {
  for (int64_t r = 0; r < exact.rows(); ++r) {
    out << "  row " << r << "  ";
    print_vector(out, &exact.final_o[static_cast<std::size_t>(r * exact.dim())], exact.dim());
    out << "\n";
  }
}

void print_final_beside(std::ostream& out, const Exact& exact, const std::vector<float>& actual) {
  for (int64_t r = 0; r < exact.rows(); ++r) {
    std::vector<double> row(actual.begin() + r * exact.dim(), actual.begin() + (r + 1) * exact.dim());
    out << "  row " << r << "  ";
    print_vector(out, row.data(), exact.dim());
    out << "  exact ";
    print_vector(out, &exact.final_o[static_cast<std::size_t>(r * exact.dim())], exact.dim());
    out << "\n";
  }
}

// The stage's per-tile state beside the exact one; returns where they first part ("" when they
// agree everywhere).
std::string print_trace(std::ostream& out, const Exact& exact, const TileTrace& actual, double tolerance) {
  const TileTrace& want = exact.trace;
  if (actual.tiles != want.tiles || actual.rows != want.rows || actual.dim != want.dim) {
    out << "\nthe stage's trace has the wrong size (" << actual.tiles << " tiles of " << actual.rows << " rows, "
        << "wanted " << want.tiles << " of " << want.rows << ")\n";
    return "its trace has the wrong size";
  }
  std::string first;
  for (int64_t t = 0; t < want.tiles; ++t) {
    out << "\nafter K/V tile " << t << " (keys " << t * want.tile << ".."
        << std::min((t + 1) * want.tile, exact.seq()) - 1 << "):\n";
    for (int64_t r = 0; r < want.rows; ++r) {
      const bool m_ok = close(actual.m_at(t, r), want.m_at(t, r), tolerance * std::fabs(want.m_at(t, r)) + 1e-6);
      const bool l_ok = close(actual.l_at(t, r), want.l_at(t, r), tolerance * want.l_at(t, r) + 1e-6);
      bool o_ok = true;
      for (int64_t d = 0; d < want.dim; ++d) o_ok = o_ok && close(actual.o_at(t, r, d), want.o_at(t, r, d), tolerance);
      if (first.empty() && !(m_ok && l_ok && o_ok)) {
        std::ostringstream where;
        where << "first at K/V tile " << t << ", row " << r << " (";
        if (!m_ok) {
          where << "m " << number(actual.m_at(t, r)) << ", exact " << number(want.m_at(t, r));
        } else if (!l_ok) {
          where << "l " << number(actual.l_at(t, r)) << ", exact " << number(want.l_at(t, r));
        } else {
          where << "O";
        }
        where << ")";
        first = where.str();
      }
      out << "  row " << r << "  m " << std::setw(11) << actual.m_at(t, r) << " (exact " << std::setw(11)
          << want.m_at(t, r) << ")  l " << std::setw(11) << actual.l_at(t, r) << " (exact " << std::setw(11)
          << want.l_at(t, r) << ")\n         O ";
      print_vector(out, &actual.o_at(t, r, 0), want.dim);
      out << "  exact ";
      print_vector(out, &want.o_at(t, r, 0), want.dim);
      out << ((m_ok && l_ok && o_ok) ? "" : "  <-- differs") << "\n";
    }
  }
  return first;
}

struct Verdict {
  int exit_code = kExitOk;
  std::string line;  // one line, the last the detailed walkthrough prints
};

// Runs the walkthrough through `stage`, printing the detail to `out` (a null stream for the
// one-line summary of run_walkthrough_all).
Verdict walk(const StageDescriptor& stage, const Exact& exact, std::ostream& out) {
  Verdict verdict;
  const Problem& problem = exact.inputs.problem;
  double max_abs_v = 0.0;
  for (float value : exact.inputs.v) max_abs_v = std::max(max_abs_v, std::fabs(static_cast<double>(value)));
  // The final O is held to the runner's tolerance; the per-tile state to a tighter one.
  const double o_tolerance =
      tolerance(stage.precision, max_abs_v, logit_bound(exact.inputs.q, exact.inputs.k, problem.dim));
  const double trace_tolerance = stage.precision == Precision::fp32 ? 1e-5 : 1e-2;

  // A GPU stage that cannot run here: every exact value, then one line that says so.
  const DeviceInfo device = stage.backend == Backend::cuda ? query_device() : DeviceInfo{};
  if (const std::string why = stage_unavailable_reason(stage, device); !why.empty()) {
    out << "\nExact online-softmax state after each K/V tile of " << kWalkthroughTile << " keys (O divided by l):\n";
    print_exact_trace(out, exact);
    out << "\nExact final O:\n";
    print_exact_final(out, exact);
    verdict.exit_code = kExitNoDevice;
    verdict.line = device.present ? why : "needs a CUDA GPU, and there is none here";
    out << "\n"
        << stage.id << " itself runs on a CUDA GPU, so only the exact values are shown ("
        << (device.present ? why : describe_missing_gpu(device))
        << "); they are what the stage must reproduce: run --walkthrough on a GPU to see its own beside them\n";
    return verdict;
  }

  // With tiles of 2 keys where the stage can report its state: N = 4 is then two K/V tiles.
  bool traced = false;
  std::string trace_first;  // where the trace first parts from the exact values
  ErrorReport trace_final;
  if (stage.trace != nullptr) {
    TileTrace actual;
    const Problem traced_problem = problem;
    const Status status = stage.trace(traced_problem, exact.inputs.q.data(), exact.inputs.k.data(),
                                      exact.inputs.v.data(), kWalkthroughTile, actual);
    if (status.code() == Status::Code::cuda_error) {
      verdict.exit_code = kExitError;
      verdict.line = "its run with tiles of 2 keys failed: " + status.reason();
      out << "\nthe stage's run with tiles of " << kWalkthroughTile << " keys failed: " << status.reason() << "\n";
      return verdict;
    }
    if (status.ok()) {
      traced = true;
      out << "\nOnline softmax state after each K/V tile: the stage, run with tiles of " << kWalkthroughTile
          << " keys, beside the exact values (O divided by l):";
      trace_first = print_trace(out, exact, actual, trace_tolerance);
      if (actual.tiles == exact.trace.tiles && actual.rows == exact.trace.rows && actual.dim == exact.trace.dim) {
        const std::size_t last = static_cast<std::size_t>((actual.tiles - 1) * actual.rows * actual.dim);
        const std::vector<float> final_o(actual.o.begin() + static_cast<std::ptrdiff_t>(last), actual.o.end());
        trace_final = compare(final_o, exact.final_o, o_tolerance);
        out << "\nFinal O, the stage with tiles of " << kWalkthroughTile << " keys beside the exact values:\n";
        print_final_beside(out, exact, final_o);
      } else {
        trace_final.non_finite = 1;  // a trace of the wrong size is no answer
      }
    } else {
      out << "\n(the stage's per-tile state is not available: " << status.reason() << ")\n";
    }
  }
  if (!traced) {
    out << "\nExact online-softmax state after each K/V tile of " << kWalkthroughTile
        << " keys (this stage does not report its own; O divided by l):\n";
    print_exact_trace(out, exact);
  }

  // The stage's own forward pass, with its usual tiles.
  RunOptions options;
  options.problem = problem;
  options.time = false;
  options.reps = 0;
  RunOutcome outcome = run_stage_on(stage, exact.inputs, options, true);
  if (!outcome.checked) {
    verdict.exit_code = outcome.exit_code == kExitOk ? kExitError : outcome.exit_code;
    verdict.line = "did not run: " + outcome.row.note;
    out << "\nthe stage did not run: " << outcome.row.note << "\n";
    return verdict;
  }
  const ErrorReport& forward = outcome.errors;

  std::ostringstream line;
  if (traced) {
    out << "\nThe stage's own forward pass (its usual K/V tiles, which hold all N = " << exact.seq()
        << " keys at once): " << forward.summary() << (forward.passed() ? "" : "  <-- differs") << "\n";
    const bool agree = trace_first.empty() && trace_final.passed() && forward.passed();
    if (agree) {
      line << "the stage agrees with the exact values at every K/V tile of " << kWalkthroughTile
           << " keys and in the final O (max abs error " << number(trace_final.max_abs_err) << ", tolerance "
           << number(trace_final.tolerance) << ")";
    } else if (!trace_first.empty() || !trace_final.passed()) {
      if (forward.passed()) {
        out << "Its own forward pass matches only because N = " << exact.seq()
            << " fits in one of its K/V tiles, so the update from one tile to the next never runs there; "
               "the run with tiles of "
            << kWalkthroughTile << " keys above is the one that exercises it.\n";
      }
      line << "the stage DISAGREES with the exact values: "
           << (trace_first.empty() ? std::string("in the final O") : trace_first) << "; with tiles of "
           << kWalkthroughTile << " keys its final O is off by up to "
           << (trace_final.non_finite > 0 ? std::string("inf (non-finite values)") : number(trace_final.max_abs_err))
           << " (tolerance " << number(o_tolerance) << ")";
    } else {
      line << "the stage DISAGREES with the exact values: its per-tile state with tiles of " << kWalkthroughTile
           << " keys is right, but its own forward pass is not (" << forward.summary() << ")";
    }
    verdict.exit_code = agree ? kExitOk : kExitWrong;
  } else {
    out << "\nFinal O, the stage beside the exact values:\n";
    print_final_beside(out, exact, outcome.output);
    out << "\nThis stage cannot report its per-tile state, so only its final O is checked. That catches wrong "
           "scores, scale, max, sums, normalization and unwritten outputs. It cannot catch a mistake that shows "
           "only across K/V tiles: all N = "
        << exact.seq()
        << " keys fit in one of its tiles, and this fixture's attention is nearly one-hot (weights down to 1e-9), "
           "so even a dropped tile barely moves O. Its tests catch those (ctest -R stage"
        << std::string(stage.id).substr(0, 2)
        << " --output-on-failure: the well-conditioned fixture, shapes of several tiles).\n";
    if (forward.passed()) {
      line << "the stage agrees with the exact values in the final O (max abs error " << number(forward.max_abs_err)
           << ", tolerance " << number(forward.tolerance) << "; per-tile state not reported)";
    } else {
      line << "the stage DISAGREES with the exact values in the final O (" << forward.summary() << ")";
    }
    verdict.exit_code = forward.passed() ? kExitOk : kExitWrong;
  }
  verdict.line = line.str();
  out << "\n" << verdict.line << "\n";
  return verdict;
}

void print_header(std::ostream& out, const std::string& who, const Exact& exact, Precision precision) {
  out << who << ": the N=" << exact.seq() << ", D=" << exact.dim() << " walkthrough, K/V tiles of " << kWalkthroughTile
      << " keys; exact values computed in double\n";
  if (precision != Precision::fp32) {
    out << "(inputs rounded to " << precision_name(precision) << " first, as the stage sees them)\n";
  }
}

// The path of another program of this build folder (bin/<name> beside the running one), relative to
// the current folder where it lies below it: what the student types on this machine (build/ or build-ci/).
std::string sibling_program(const char* name) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return std::string("bin/") + name + " in the build folder";
  const std::filesystem::path program = self.parent_path() / name;
  if (!std::filesystem::exists(program, error)) return std::string("bin/") + name + " in the build folder";
  const std::filesystem::path relative = std::filesystem::relative(program, std::filesystem::current_path(error));
  if (error || relative.empty() || *relative.begin() == "..") return program.string();
  return relative.string();
}

}  // namespace

int run_walkthrough(const StageDescriptor& stage, std::ostream& out) {
  const Exact exact(stage.precision);
  out << std::setprecision(8);
  print_header(out, stage.id, exact, stage.precision);
  print_scores(out, exact);
  return walk(stage, exact, out).exit_code;
}

int run_walkthrough_all(const std::vector<StageDescriptor>& stages, std::ostream& out) {
  const Exact exact(Precision::fp32);
  out << std::setprecision(8);
  print_header(out, "every stage", exact, Precision::fp32);
  print_scores(out, exact);
  out << "\nExact online-softmax state after each K/V tile of " << kWalkthroughTile << " keys (O divided by l):\n";
  print_exact_trace(out, exact);
  out << "\nExact final O:\n";
  print_exact_final(out, exact);
  out << "\nEach stage beside these values (16-bit stages against the exact values of their rounded inputs):\n";
  int exit_code = kExitOk;
  bool missing_gpu = false;
  std::ostream null_stream(nullptr);
  for (const StageDescriptor& stage : stages) {
    const Exact own(stage.precision);
    const Verdict verdict = walk(stage, own, null_stream);
    if (verdict.exit_code != kExitOk && verdict.exit_code != kExitNoDevice) exit_code = kExitWrong;
    missing_gpu = missing_gpu || verdict.exit_code == kExitNoDevice;
    // A stage with several descriptors (11: fp16, bf16 and the C++ fp32) shows each one's precision.
    const bool shared_id = std::count_if(stages.begin(), stages.end(), [&](const StageDescriptor& other) {
                             return std::string(other.id) == stage.id;
                           }) > 1;
    const std::string label = shared_id ? std::string(stage.id) + "/" + precision_name(stage.precision) : stage.id;
    out << "  " << std::left << std::setw(24) << label << std::right << verdict.line << "\n";
  }
  if (missing_gpu) {
    const DeviceInfo device = query_device();
    if (!device.present) out << "\nNo CUDA GPU here: " << describe_missing_gpu(device) << ".\n";
  }
  out << "\nOne stage in detail, tile by tile: " << sibling_program("04_online_softmax") << " --walkthrough\n";
  return exit_code;
}

}  // namespace fa
