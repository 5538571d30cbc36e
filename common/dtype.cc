#include "common/dtype.h"

#include <string>

namespace bitpush {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "invalid";
}

StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "float32" || name == "fp32" || name == "f32") return DType::kFloat32;
  if (name == "float16" || name == "fp16" || name == "f16" || name == "half") {
    return DType::kFloat16;
  }
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  return InvalidArgumentError("unknown dtype '" + std::string(name) +
                              "'; valid: float32 (fp32), float16 (fp16), bfloat16 (bf16)");
}

}  // namespace bitpush
