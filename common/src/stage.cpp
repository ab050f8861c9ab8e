#include "fa/stage.hpp"

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

int64_t workspace_bytes(const StageDescriptor& stage, const Shape& shape) {
  return stage.workspace_bytes != nullptr ? stage.workspace_bytes(shape) : 0;
}

}  // namespace fa
