// The sparse body format shared by `topk` and `randomk`, its size rule, and its validating
// decoder.
//
// Body (after the 16-byte payload header), all little-endian, no padding:
//
//   u32 k | k x int32 indices (strictly increasing, each in [0, n)) | k x values
//
// Values are in the payload's dtype: fp32 (4 bytes), fp16 or bf16 (2 bytes, raw bits).
// Body bytes = 4 + k * (4 + DTypeSize(dtype)). The body directly follows the 16-byte header,
// so it is 4-byte aligned in the payload but callers may hand it at any address: every access
// goes through memcpy.
//
// Decoding C(x): zeros everywhere except out[index_j] = value_j. Values may be NaN or inf
// (that is data, not a format error). Indices are int32 on the wire, so a sparse tensor
// holds at most kMaxSparseElements (2^31 - 1) elements.
//
// Keep count: ratio=R gives k = max(1, floor(R * n)); k=K gives min(K, n); n == 0 gives 0.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/span.h"
#include "common/status.h"

namespace bitpush::compressors {

inline constexpr size_t kSparseCountBytes = 4;
inline constexpr size_t kSparseIndexBytes = 4;
inline constexpr uint64_t kMaxSparseElements = 0x7FFFFFFFull;

// The size parameter of topk / randomk (the `size` oneof of their params).
struct SparseSize {
  bool by_ratio = true;
  double ratio = 1.0;  // when by_ratio
  uint64_t k = 1;      // otherwise

  // Reads the `size` oneof of v1::TopkParams or v1::RandomkParams (canonical: one is set).
  template <typename Params>
  static SparseSize FromParams(const Params& p) {
    SparseSize s;
    s.by_ratio = p.size_case() == Params::kRatio;
    s.ratio = p.ratio();
    s.k = p.k();
    return s;
  }

  // The number of kept elements for an n-element tensor.
  uint64_t KeepCount(uint64_t n) const;
};

inline size_t SparseBodyBytes(uint64_t k, DType dtype) {
  return kSparseCountBytes + k * (kSparseIndexBytes + DTypeSize(dtype));
}

// Writes the count and the (already strictly increasing) indices; returns the start of the
// values region, where the k values go (StoreSparseValue).
uint8_t* WriteSparseHead(const uint32_t* indices, size_t k, uint8_t* body);

// Stores v as value j of the values region in `dtype` and returns the float the decoder will
// produce for it (the rounded value for fp16 / bf16; v itself for fp32).
inline float StoreSparseValue(float v, DType dtype, size_t j, uint8_t* values) {
  switch (dtype) {
    case DType::kFloat32: std::memcpy(values + 4 * j, &v, 4); return v;
    case DType::kFloat16: {
      const uint16_t h = FloatToHalf(v);
      std::memcpy(values + 2 * j, &h, 2);
      return HalfToFloat(h);
    }
    case DType::kBFloat16: {
      const uint16_t b = FloatToBf16(v);
      std::memcpy(values + 2 * j, &b, 2);
      return Bf16ToFloat(b);
    }
  }
  return v;
}

// Value j of the values region, decoded to float (exact for every dtype).
inline float LoadSparseValue(const uint8_t* values, size_t j, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, values + 4 * j, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, values + 2 * j, 2);
      return HalfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, values + 2 * j, 2);
      return Bf16ToFloat(b);
    }
  }
  return 0.0f;
}

// The checks of DecodeSparseBody alone (same statuses), writing nothing.
Status ValidateSparseBody(std::string_view name, ByteSpan body, size_t n, DType dtype);

// Validates `body` as a sparse body for n elements of dtype — length, k <= n, every index in
// range and strictly increasing — and only then writes out[0..n) = C(x) (add == false) or
// adds C(x) into out (add == true). On a bad body returns DataLoss with a message starting
// with `name` (the compressor's name) and leaves `out` untouched.
Status DecodeSparseBody(std::string_view name, ByteSpan body, size_t n, DType dtype, float* out,
                        bool add);

// DecodeSparseBody(add = false) into a caller's tensor that nobody reads right away (the
// worker's pull): from kStreamZeroMin elements on, on AVX-512, the zeros go out with
// non-temporal stores. Same values and statuses.
inline constexpr size_t kStreamZeroMin = size_t{1} << 16;
Status DecodeSparseBodyToTensor(std::string_view name, ByteSpan body, size_t n, DType dtype,
                                float* out, IsaLevel isa);

}  // namespace bitpush::compressors
