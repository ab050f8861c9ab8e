// `--walkthrough`: the N=4 fixture through a stage, printed beside the exact values.
#include <cmath>
#include <iomanip>
#include <ostream>

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

// Per-tile m, l and O of the stage beside the exact ones; true when they agree.
bool print_trace(std::ostream& out, const TileTrace& want, const TileTrace& actual, int64_t seq, double tolerance) {
  const TileTrace& exact = want;
  bool agree = actual.tiles == exact.tiles && actual.rows == exact.rows && actual.dim == exact.dim;
  if (!agree) out << "\nthe stage's trace has the wrong size\n";
  for (int64_t t = 0; agree && t < exact.tiles; ++t) {
    out << "\nafter K/V tile " << t << " (keys " << t * exact.tile << ".." << std::min((t + 1) * exact.tile, seq) - 1
        << "):\n";
    for (int64_t r = 0; r < exact.rows; ++r) {
      const bool row_ok = close(actual.m_at(t, r), want.m_at(t, r), tolerance * std::fabs(want.m_at(t, r)) + 1e-6) &&
                          close(actual.l_at(t, r), want.l_at(t, r), tolerance * want.l_at(t, r) + 1e-6);
      bool o_ok = true;
      for (int64_t d = 0; d < exact.dim; ++d) o_ok = o_ok && close(actual.o_at(t, r, d), want.o_at(t, r, d), tolerance);
      agree = agree && row_ok && o_ok;
      out << "  row " << r << "  m " << std::setw(11) << actual.m_at(t, r) << " (exact " << std::setw(11)
          << want.m_at(t, r) << ")  l " << std::setw(11) << actual.l_at(t, r) << " (exact " << std::setw(11)
          << want.l_at(t, r) << ")\n         O ";
      print_vector(out, &actual.o_at(t, r, 0), exact.dim);
      out << "  exact ";
      print_vector(out, &want.o_at(t, r, 0), exact.dim);
      out << ((row_ok && o_ok) ? "" : "  <-- differs") << "\n";
    }
  }
  return agree;
}

}  // namespace

int run_walkthrough(const StageDescriptor& stage, std::ostream& out) {
  Inputs inputs = walkthrough_inputs();
  round_to_precision(inputs, stage.precision);
  const Problem& problem = inputs.problem;  // square: N = 4 queries and keys
  out << std::setprecision(8);
  out << stage.id << ": the N=4, D=2 walkthrough (tile " << kWalkthroughTile << "), exact values in double\n";
  if (stage.precision != Precision::fp32) {
    out << "(inputs rounded to " << precision_name(stage.precision) << " first, as the stage sees them)\n";
  }

  out << "\nS = Q K^T / sqrt(" << problem.dim << "), exact:\n";
  const std::vector<double> scores = reference_scores(inputs, 0);
  for (int64_t i = 0; i < problem.q_seq; ++i) {
    out << "  ";
    print_vector(out, &scores[static_cast<std::size_t>(i * problem.q_seq)], problem.q_seq);
    out << "\n";
  }

  const TileTrace exact = reference_trace(inputs, kWalkthroughTile);
  bool agree = true;
  if (stage.trace != nullptr) {
    TileTrace actual;
    const Status status =
        stage.trace(problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), kWalkthroughTile, actual);
    if (!status.ok()) {
      out << "the stage's trace failed: " << status.reason() << "\n";
      return kExitError;
    }
    out << "\nOnline softmax state, the stage beside the exact values (O divided by l):";
    agree = print_trace(out, exact, actual, problem.q_seq, stage.precision == Precision::fp32 ? 1e-5 : 1e-2);
  } else {
    out << "\nExact online-softmax state after each K/V tile (this stage does not report its own):\n";
    const TileTrace& want = exact;
    for (int64_t t = 0; t < exact.tiles; ++t) {
      for (int64_t r = 0; r < exact.rows; ++r) {
        out << "  tile " << t << " row " << r << "  m " << std::setw(11) << want.m_at(t, r) << "  l " << std::setw(11)
            << want.l_at(t, r) << "  O ";
        print_vector(out, &want.o_at(t, r, 0), exact.dim);
        out << "\n";
      }
    }
  }

  RunOptions options;
  options.problem = problem;
  options.time = false;
  RunOutcome outcome = run_stage_on(stage, inputs, options, true);
  if (outcome.row.status != "ok" && !outcome.checked) {
    out << "\nthe stage did not run: " << outcome.row.note << "\n";
    return outcome.exit_code;
  }
  out << "\nFinal O, the stage beside the exact values:\n";
  const TileTrace& last = exact;
  for (int64_t r = 0; r < problem.q_rows(); ++r) {
    std::vector<double> stage_row(outcome.output.begin() + r * problem.dim, outcome.output.begin() + (r + 1) * problem.dim);
    out << "  row " << r << "  ";
    print_vector(out, stage_row.data(), problem.dim);
    out << "  exact ";
    print_vector(out, &last.o[static_cast<std::size_t>(((last.tiles - 1) * last.rows + r) * last.dim)], problem.dim);
    out << "\n";
  }
  agree = agree && outcome.errors.passed();
  out << "\n"
      << (agree ? "the stage agrees with the exact values" : "the stage DISAGREES with the exact values") << " ("
      << outcome.errors.summary() << ")\n";
  return agree ? kExitOk : kExitWrong;
}

}  // namespace fa
