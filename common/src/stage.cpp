#include "fa/stage.hpp"

#include <string>

namespace fa {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return "fp32";
    case Precision::fp16:
      return "fp16";
    case Precision::bf16:
      return "bf16";
  }
  return "unknown";
}

int precision_bytes(Precision precision) { return precision == Precision::fp32 ? 4 : 2; }

int64_t workspace_bytes(const StageDescriptor& stage, const Problem& problem, Pass pass) {
  return stage.workspace_bytes != nullptr ? stage.workspace_bytes(problem, pass) : 0;
}

std::string architecture_name(const StageDescriptor& stage) {
  if (stage.backend == Backend::cpu) return "cpu";
  const std::string sm = "sm_" + std::to_string(stage.architecture.compute_capability);
  return stage.architecture.exact ? sm + "a" : sm + "+";
}

std::string unsupported_reason(const StageDescriptor& stage, const Problem& problem, bool wants_lse, Pass pass) {
  const std::string prefix = std::string("stage ") + stage.id + " ";
  if (const std::string why = validate_problem(problem, stage.max_dim); !why.empty()) return prefix + "refuses: " + why;
  const Features& features = stage.features;
  if (pass == Pass::backward && !features.backward) return prefix + "has no backward pass";
  if (problem.causal && !features.causal) return prefix + "has no causal masking";
  if (problem.grouped() && !features.grouped) {
    return prefix + "takes only Hkv = Hq (got Hq = " + std::to_string(problem.q_heads) +
           ", Hkv = " + std::to_string(problem.kv_heads) + "); grouped-query attention starts at stage 08";
  }
  if (problem.rectangular() && !features.rectangular) {
    return prefix + "takes only Nq = Nk (got Nq = " + std::to_string(problem.q_seq) +
           ", Nk = " + std::to_string(problem.kv_seq) + "); Nq != Nk starts at stage 08";
  }
  if (wants_lse && !features.lse) return prefix + "does not write the log-sum-exp";
  return "";
}

}  // namespace fa
