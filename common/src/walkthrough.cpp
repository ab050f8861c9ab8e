// `--walkthrough`: the N=4 fixture through a stage, printed beside the exact values.
//
// The verdict comes from the run that can show a mistake: where the stage reports its per-tile
// state (stage.trace), from its run with K/V tiles of 2 keys, where N = 4 makes two tiles and the
// update between them runs; the stage's own forward pass, whose tiles hold all 4 keys at once, is
// checked too and reported as such. A stage that cannot report its state is judged on its final O,
// and the output says what that can and cannot catch. A stage with a backward pass then runs it on
// the fixture for a fixed dO (walkthrough.hpp) and is judged on its dQ, dK and dV too. Without a GPU
// a GPU stage still prints every exact value, forward and backward, then says that the stage itself
// needs a GPU; fa_course --walkthrough shows the C++ backward of stage 11, which runs anywhere but
// which no stage executable runs (11_backward runs the GPU kernel).
#include "fa/walkthrough.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <utility>

#include "fa/cli.hpp"
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/runner.hpp"

namespace fa {

std::vector<float> walkthrough_output_gradient() {
  // Small integers, read at a glance: [1, 0] and [0, 1] make D_i one entry of O_i. The rows differ,
  // so dV's rows are not all multiples of one row. And no row sums to 0: V's rows step by
  // [0.2, 0.2] from one key to the next, so dP_ij − D_i = 0.2 (dO_i0 + dO_i1)(j − Σ_k P_ik k), and
  // a row of dO whose entries cancel would make that row of dS, and with it its dQ, exactly 0.
  return {1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f, -1.0f, 2.0f};
}

WalkthroughBackward walkthrough_backward(Precision precision) {
  WalkthroughBackward exact;
  exact.inputs = walkthrough_inputs();
  round_to_precision(exact.inputs, precision);
  exact.grad_o = walkthrough_output_gradient();
  round_to_precision(exact.grad_o, precision);
  const Inputs& inputs = exact.inputs;
  const int64_t seq = inputs.problem.q_seq;
  const int64_t dim = inputs.problem.dim;
  exact.o = reference_attention(inputs, &exact.lse);
  const std::vector<double> scores = reference_scores(inputs, 0);
  const auto at = [](int64_t row, int64_t column, int64_t columns) {
    return static_cast<std::size_t>(row * columns + column);
  };
  exact.delta.assign(static_cast<std::size_t>(seq), 0.0);
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t d = 0; d < dim; ++d) {
      exact.delta[static_cast<std::size_t>(i)] +=
          static_cast<double>(exact.grad_o[at(i, d, dim)]) * exact.o[at(i, d, dim)];
    }
  }
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t j = 0; j < seq; ++j) {
      double grad_p = 0.0;
      for (int64_t d = 0; d < dim; ++d) {
        grad_p += static_cast<double>(exact.grad_o[at(i, d, dim)]) * static_cast<double>(inputs.v[at(j, d, dim)]);
      }
      const double p = std::exp(scores[at(i, j, seq)] - exact.lse[static_cast<std::size_t>(i)]);
      exact.p.push_back(p);
      exact.grad_p.push_back(grad_p);
      exact.grad_s.push_back(p * (grad_p - exact.delta[static_cast<std::size_t>(i)]));
    }
  }
  exact.gradients = reference_backward(inputs, exact.grad_o, {0});  // the fixture's one K/V head
  return exact;
}

namespace {

// `width` 14 holds any double of precision 8, such as -1.2345678e-10; 11 holds the forward's values.
void print_vector(std::ostream& out, const double* values, int64_t count, int width = 11) {
  out << "[";
  for (int64_t i = 0; i < count; ++i) out << (i == 0 ? "" : ", ") << std::setw(width) << values[i];
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
  WalkthroughBackward backward;

  explicit Exact(Precision precision) : inputs(walkthrough_inputs()), backward(walkthrough_backward(precision)) {
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

// The command that runs another program of this build folder (bin/<name> beside the running one)
// with `arguments`, its path relative to the current folder where it lies below it: what the student
// types on this machine (build/ or build-ci/). Where this folder has no such program (a student's
// build-exercise/ builds one stage), the course's own build folders, which scripts/course.sh makes.
std::string sibling_command(const char* name, const char* arguments) {
  const std::string in_course_build = std::string("build/bin/") + name + " " + arguments +
                                      " (build-ci/bin/ on a machine without a GPU; scripts/course.sh builds it)";
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return in_course_build;
  const std::filesystem::path program = self.parent_path() / name;
  if (!std::filesystem::exists(program, error)) return in_course_build;
  const std::filesystem::path relative = std::filesystem::relative(program, std::filesystem::current_path(error));
  if (error || relative.empty() || *relative.begin() == "..") return program.string() + " " + arguments;
  return relative.string() + " " + arguments;
}

// The backward's values span 30 orders of magnitude (P down to 1e-28): printed in the wider field.
constexpr int kBackwardWidth = 14;

// A matrix of the backward pass, `columns` to a row, a row to a line.
void print_rows(std::ostream& out, const std::vector<double>& values, int64_t columns) {
  for (int64_t r = 0; r * columns < static_cast<int64_t>(values.size()); ++r) {
    out << "  row " << r << "  ";
    print_vector(out, &values[static_cast<std::size_t>(r * columns)], columns, kBackwardWidth);
    out << "\n";
  }
}

void print_exact_backward(std::ostream& out, const WalkthroughBackward& exact) {
  const int64_t seq = exact.inputs.problem.q_seq;
  const int64_t dim = exact.inputs.problem.dim;
  out << "\nThe backward pass for the output gradient dO, exact values: a row per query, and in P, dP and dS a "
         "column per key\n(* multiplies element by element)\ndO:\n";
  print_rows(out, std::vector<double>(exact.grad_o.begin(), exact.grad_o.end()), dim);
  out << "D_i = rowsum(dO * O), one per query row:\n  ";
  print_vector(out, exact.delta.data(), seq, kBackwardWidth);
  out << "\nP = exp(S - LSE_i), the softmax rebuilt from the forward's log-sum-exp:\n";
  print_rows(out, exact.p, seq);
  out << "dP = dO V^T:\n";
  print_rows(out, exact.grad_p, seq);
  out << "dS = P * (dP - D_i); then dQ = dS K / sqrt(" << dim << "), dK = dS^T Q / sqrt(" << dim << "), dV = P^T dO:\n";
  print_rows(out, exact.grad_s, seq);
}

struct Gradient {
  const char* name;
  const std::vector<double>& exact;
  const std::vector<double>& bound;  // reference.hpp: what the tolerance of each element is a multiple of
};

std::vector<Gradient> gradients_of(const WalkthroughBackward& exact) {
  const GradientReference& reference = exact.gradients;
  return {{"dQ", reference.dq, reference.dq_bound},
          {"dK", reference.dk, reference.dk_bound},
          {"dV", reference.dv, reference.dv_bound}};
}

void print_exact_gradients(std::ostream& out, const WalkthroughBackward& exact) {
  for (const Gradient& gradient : gradients_of(exact)) {
    out << gradient.name << ":\n";
    print_rows(out, gradient.exact, exact.inputs.problem.dim);
  }
}

// One tensor of the stage's passes on the fixture, as bytes of its precision: in device memory for
// a CUDA stage, in host memory for the CPU one.
class StageTensor {
 public:
  StageTensor(bool cuda, std::vector<unsigned char> bytes) : cuda_(cuda), host_(std::move(bytes)) {
    if (cuda_) device_ = DeviceBuffer::from(host_);
  }
  void* get() { return cuda_ ? device_.get() : static_cast<void*>(host_.data()); }
  const std::vector<unsigned char>& download() {
    if (cuda_) device_.download(host_.data(), host_.size());
    return host_;
  }

 private:
  bool cuda_;
  std::vector<unsigned char> host_;
  DeviceBuffer device_;
};

// dQ, dK and dV, decoded to FP32, of the stage's own forward pass (which writes O and the LSE) then
// its backward pass, on the fixture and its dO. O, the LSE and the gradients start as NaN, so an
// element the stage never writes shows.
Status stage_gradients(const StageDescriptor& stage, const WalkthroughBackward& exact,
                       std::vector<std::vector<float>>& gradients) {
  const Problem& problem = exact.inputs.problem;
  const bool cuda = stage.backend == Backend::cuda;
  const Precision precision = stage.precision;
  const auto poison = [](int64_t elements, Precision type) {
    return encode(std::vector<float>(static_cast<std::size_t>(elements), std::nanf("")), type);
  };
  // The backward pass runs after the forward, in the same workspace, as the runner's does.
  const int64_t workspace = std::max(workspace_bytes(stage, problem), workspace_bytes(stage, problem, Pass::backward));
  try {
    StageTensor q(cuda, encode(exact.inputs.q, precision));
    StageTensor k(cuda, encode(exact.inputs.k, precision));
    StageTensor v(cuda, encode(exact.inputs.v, precision));
    StageTensor o(cuda, poison(problem.q_elements(), precision));
    StageTensor lse(cuda, poison(problem.q_rows(), Precision::fp32));
    StageTensor grad_o(cuda, encode(exact.grad_o, precision));
    StageTensor grad_q(cuda, poison(problem.q_elements(), precision));
    StageTensor grad_k(cuda, poison(problem.kv_elements(), precision));
    StageTensor grad_v(cuda, poison(problem.kv_elements(), precision));
    StageTensor work(cuda, std::vector<unsigned char>(static_cast<std::size_t>(workspace)));

    ForwardArgs forward;
    forward.problem = problem;
    forward.q = q.get();
    forward.k = k.get();
    forward.v = v.get();
    forward.o = o.get();
    forward.lse = static_cast<float*>(lse.get());
    forward.workspace = work.get();
    if (const Status status = stage.forward(forward); !status.ok()) return status;

    BackwardArgs backward;
    backward.problem = problem;
    backward.q = q.get();
    backward.k = k.get();
    backward.v = v.get();
    backward.o = o.get();
    backward.grad_o = grad_o.get();
    backward.lse = static_cast<const float*>(lse.get());
    backward.grad_q = grad_q.get();
    backward.grad_k = grad_k.get();
    backward.grad_v = grad_v.get();
    backward.workspace = work.get();
    if (const Status status = stage.backward(backward); !status.ok()) return status;
    if (cuda) FA_CUDA_TRY(cudaDeviceSynchronize());
    gradients = {decode(grad_q.download(), precision), decode(grad_k.download(), precision),
                 decode(grad_v.download(), precision)};
  } catch (const CudaError& error) {  // an allocation or a copy
    return Status::cuda(error.code());
  }
  return Status();
}

// Each row of a gradient of the stage beside the exact one, with the largest tolerance of its
// elements by compare_gradient's rule (metrics.hpp): unit times the element's bound plus 2^-24 of
// the largest bound; marked where an element is past its own. Returns the comparison of the whole
// gradient, which is what the verdict reads.
ErrorReport print_gradient_beside(std::ostream& out, const Gradient& gradient, const std::vector<float>& actual,
                                  double unit, int64_t dim) {
  const ErrorReport report = compare_gradient(actual, gradient.exact, gradient.bound, unit);
  const double floor = std::ldexp(1.0, -24) * *std::max_element(gradient.bound.begin(), gradient.bound.end());
  out << gradient.name << ":\n";
  for (int64_t r = 0; r * dim < static_cast<int64_t>(actual.size()); ++r) {
    bool differs = false;
    double row_tolerance = 0.0;
    for (int64_t d = 0; d < dim; ++d) {
      const std::size_t i = static_cast<std::size_t>(r * dim + d);
      const double element_tolerance = unit * gradient.bound[i] + floor;
      row_tolerance = std::max(row_tolerance, element_tolerance);
      differs = differs || !std::isfinite(actual[i]) ||
                std::fabs(static_cast<double>(actual[i]) - gradient.exact[i]) > element_tolerance;
    }
    const std::vector<double> row(actual.begin() + r * dim, actual.begin() + (r + 1) * dim);
    out << "  row " << r << "  ";
    print_vector(out, row.data(), dim, kBackwardWidth);
    out << "  exact ";
    print_vector(out, &gradient.exact[static_cast<std::size_t>(r * dim)], dim, kBackwardWidth);
    out << "  tolerance " << number(row_tolerance) << (differs ? "  <-- differs" : "") << "\n";
  }
  return report;
}

struct Verdict {
  int exit_code = kExitOk;
  std::string line;  // one line, the last the detailed walkthrough prints
};

// The stage's backward pass on the fixture: the exact values, then its dQ, dK and dV beside the
// exact ones. The verdict's line names each gradient that differs, where it differs most (exit code
// kExitWrong), or reads "dQ, dK and dV (max abs error ...)" when all three agree.
Verdict walk_backward(const StageDescriptor& stage, const WalkthroughBackward& exact, std::ostream& out) {
  print_exact_backward(out, exact);
  Verdict verdict;
  std::vector<std::vector<float>> actual;
  if (const Status status = stage_gradients(stage, exact, actual); !status.ok()) {
    verdict.exit_code = kExitError;
    verdict.line = "its backward pass did not run on the fixture: " + status.reason();
    out << "\nThe stage's backward pass did not run on the fixture: " << status.reason() << "\n";
    return verdict;
  }
  const Problem& problem = exact.inputs.problem;
  // The runner's unit less its allowance for the FP32 rounding of large scores, 2 · 8·u32·logit_bound:
  // with this fixture's bound of 85 that allowance is 8e-5, which would let an FP32 stage's dQ be 0
  // (a tolerance of 0.0054 for a value of 0.0042). The rounding it stands for moves P here by about
  // 1e-5 relatively, within what is left (4e-5 for FP32, 2^-9 for FP16); a right C++ backward is
  // off by 1e-7 of an element's bound at most.
  const double unit = gradient_tolerance_unit(stage.precision);
  out << "\nGradients, the stage's beside the exact values. Each element's tolerance grows with the terms it sums "
         "(reference.hpp),\nnot with its value: where a row of P is nearly one-hot, dP_ij - D_i is a difference of "
         "nearly equal numbers,\nof which FP32 keeps few digits, so a tiny dQ may come out with the wrong sign and "
         "still be within it.\n";
  std::ostringstream wrong;  // every gradient that differs, where it differs most
  double max_abs_err = 0.0;
  const std::vector<Gradient> gradients = gradients_of(exact);
  for (std::size_t g = 0; g < gradients.size(); ++g) {
    const ErrorReport report = print_gradient_beside(out, gradients[g], actual[g], unit, problem.dim);
    max_abs_err = std::max(max_abs_err, report.max_abs_err);
    if (report.passed()) continue;
    const int64_t element = report.non_finite > 0 ? report.first_non_finite : report.max_abs_index;
    const std::size_t i = static_cast<std::size_t>(element);
    wrong << (wrong.tellp() > 0 ? "; " : "") << gradients[g].name << " row " << element / problem.dim << ", column "
          << element % problem.dim << " is " << number(actual[g][i]) << ", exact " << number(gradients[g].exact[i]);
  }
  if (wrong.tellp() > 0) {
    verdict.exit_code = kExitWrong;
    verdict.line = wrong.str();
  } else {
    std::ostringstream line;
    line << "dQ, dK and dV (max abs error " << number(max_abs_err) << ")";
    verdict.line = line.str();
  }
  return verdict;
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

  // A GPU stage that cannot run here: every exact value, then that the stage needs a GPU.
  const DeviceInfo device = stage.backend == Backend::cuda ? query_device() : DeviceInfo{};
  if (const std::string why = stage_unavailable_reason(stage, device); !why.empty()) {
    out << "\nExact online-softmax state after each K/V tile of " << kWalkthroughTile << " keys (O divided by l):\n";
    print_exact_trace(out, exact);
    out << "\nExact final O:\n";
    print_exact_final(out, exact);
    if (stage.features.backward) {
      print_exact_backward(out, exact.backward);
      out << "\nExact gradients:\n";
      print_exact_gradients(out, exact.backward);
    }
    verdict.exit_code = kExitNoDevice;
    verdict.line = device.present ? why : "needs a CUDA GPU, and there is none here";
    out << "\n"
        << stage.id << " itself runs on a CUDA GPU, so only the exact values are shown ("
        << (device.present ? why : describe_missing_gpu(device))
        << "); they are what the stage must reproduce: run --walkthrough on a GPU to see its own beside them\n";
    if (stage.features.backward) {
      out << "Stage 11's C++ backward runs without a GPU: " << sibling_command("fa_course", "--walkthrough")
          << " shows its dQ, dK and dV beside the exact values\n";
    }
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

  // Then the backward pass, on the O and LSE of the stage's own forward pass.
  if (stage.features.backward) {
    const Verdict backward = walk_backward(stage, exact.backward, out);
    if (backward.exit_code == kExitOk) {
      if (verdict.exit_code == kExitOk) line << "; and in " << backward.line;
    } else if (verdict.exit_code != kExitOk) {
      line << "; " << (backward.exit_code == kExitWrong ? "its gradients differ too" : backward.line);
    } else {
      verdict.exit_code = backward.exit_code;
      line.str("");
      line << (backward.exit_code == kExitWrong
                   ? "the stage DISAGREES with the exact gradients: " + backward.line + " (its forward pass agrees)"
                   : backward.line);
    }
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
  // A stage with several descriptors (11: fp16, bf16 and the C++ fp32) shows each one's precision.
  const auto label = [&](const StageDescriptor& stage) {
    const bool shared_id = std::count_if(stages.begin(), stages.end(), [&](const StageDescriptor& other) {
                             return std::string(other.id) == stage.id;
                           }) > 1;
    return shared_id ? std::string(stage.id) + "/" + precision_name(stage.precision) : std::string(stage.id);
  };
  for (const StageDescriptor& stage : stages) {
    const Exact own(stage.precision);
    const Verdict verdict = walk(stage, own, null_stream);
    if (verdict.exit_code != kExitOk && verdict.exit_code != kExitNoDevice) exit_code = kExitWrong;
    missing_gpu = missing_gpu || verdict.exit_code == kExitNoDevice;
    out << "  " << std::left << std::setw(24) << label(stage) << std::right << verdict.line << "\n";
  }
  if (missing_gpu) {
    const DeviceInfo device = query_device();
    if (!device.present) out << "\nNo CUDA GPU here: " << describe_missing_gpu(device) << ".\n";
  }
  // The C++ backward in detail: it runs on any machine, yet no stage executable runs it (11_backward
  // runs the GPU kernel), and it is what stage 11's exercise is about.
  for (const StageDescriptor& stage : stages) {
    if (stage.backend != Backend::cpu || !stage.features.backward) continue;
    out << "\n" << label(stage) << ", the backward pass in C++ (no GPU needed), in detail:";
    const Verdict verdict = walk_backward(stage, walkthrough_backward(stage.precision), out);
    out << "\n"
        << label(stage)
        << (verdict.exit_code == kExitOk      ? " agrees with the exact values in "
            : verdict.exit_code == kExitWrong ? " DISAGREES with the exact gradients: "
                                              : ": ")
        << verdict.line << "\n";
  }
  out << "\nOne stage in detail, tile by tile: " << sibling_command("04_online_softmax", "--walkthrough") << "\n";
  return exit_code;
}

}  // namespace fa
