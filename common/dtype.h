// DType: the element types bitpush moves — fp32, fp16 (IEEE binary16) and bf16.
// The numeric values are part of the wire format (docs/wire-format.md): never renumber.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace bitpush {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
};

inline constexpr int kNumDTypes = 3;

constexpr size_t DTypeSize(DType t) {
  return t == DType::kFloat32 ? 4 : 2;
}

constexpr bool IsValidDType(uint8_t raw) {
  return raw < kNumDTypes;
}

// "float32", "float16", "bfloat16".
std::string_view DTypeName(DType t);

// Accepts the names above and the short forms fp32/f32, fp16/f16/half, bf16.
StatusOr<DType> ParseDType(std::string_view name);

}  // namespace bitpush
