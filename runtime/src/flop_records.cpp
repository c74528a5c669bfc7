#include "torchpilot/runtime/flop_records.h"

namespace torchpilot {

const char* to_string(MathPrecision precision) {
  switch (precision) {
    case MathPrecision::kFp32:
      return "fp32";
    case MathPrecision::kTf32:
      return "tf32";
    case MathPrecision::kBf16:
      return "bf16";
    case MathPrecision::kFp16:
      return "fp16";
    case MathPrecision::kFp8:
      return "fp8";
    case MathPrecision::kFp64:
      return "fp64";
    case MathPrecision::kOther:
      break;
  }
  return "other";
}

}  // namespace torchpilot
