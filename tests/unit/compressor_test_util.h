// Helpers shared by the compressor unit tests: compress into a right-sized vector, parse the
// sparse body (topk / randomk) back into indices and raw value bits, make a compressor at an ISA
// level or an error-feedback state, and compare fp32 values bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_features.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "compressors/sparse/sparse_format.h"
#include "compressors/spec_registry.h"

namespace bitpush::testing {

inline std::vector<uint8_t> Compress(compressors::Compressor& c, ConstTensorView x,
                                     compressors::CompressContext ctx = {}) {
  std::vector<uint8_t> out(c.MaxCompressedBytes(x.count(), x.dtype()));
  StatusOr<size_t> n = c.Compress(x, ctx, MutableByteSpan(out.data(), out.size()));
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  out.resize(n.ok() ? *n : 0);
  return out;
}

inline std::vector<uint8_t> CompressEf(compressors::Compressor& c, ConstTensorView g,
                                       std::vector<float>& e,
                                       compressors::CompressContext ctx = {}) {
  std::vector<uint8_t> out(c.MaxCompressedBytes(g.count(), g.dtype()));
  StatusOr<size_t> n = c.CompressWithFeedback(g, Span<float>(e.data(), e.size()), ctx,
                                              MutableByteSpan(out.data(), out.size()));
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  out.resize(n.ok() ? *n : 0);
  return out;
}

struct Sparse {
  std::vector<uint32_t> idx;
  std::vector<uint32_t> value_bits;  // raw bits of each stored value (fp32 or 16-bit)
};

// Parses a topk / randomk payload (which must have the exact size its k implies).
inline Sparse Parse(const std::vector<uint8_t>& payload, DType dtype) {
  Sparse s;
  const uint8_t* body = payload.data() + compressors::kPayloadHeaderBytes;
  uint32_t k;
  std::memcpy(&k, body, 4);
  EXPECT_EQ(payload.size(),
            compressors::kPayloadHeaderBytes + compressors::SparseBodyBytes(k, dtype));
  s.idx.resize(k);
  if (k) std::memcpy(s.idx.data(), body + 4, 4 * k);
  const uint8_t* values = body + 4 + 4 * size_t{k};
  for (uint32_t j = 0; j < k; ++j) {
    uint32_t bits = 0;
    std::memcpy(&bits, values + j * DTypeSize(dtype), DTypeSize(dtype));
    s.value_bits.push_back(bits);
  }
  return s;
}

// The compressor of `spec` at ISA level `isa` (the spec must be valid).
inline std::unique_ptr<compressors::Compressor> MakeCompressor(const std::string& spec,
                                                               IsaLevel isa) {
  compressors::CompressorOptions o;
  o.isa = isa;
  return std::move(compressors::CreateCompressor(spec, o)).value();
}

// The error-feedback state `spec` keeps on `side` for a partition of n elements.
inline std::unique_ptr<compressors::ErrorFeedback> MakeState(const std::string& spec,
                                                             compressors::ErrorFeedbackSide side,
                                                             size_t n) {
  auto config = compressors::ParseCompressorSpec(spec);
  EXPECT_TRUE(config.ok());
  return std::move(compressors::CreateErrorFeedback(*config, side, n)).value();
}

// Whether `a` holds exactly the bits of `b`.
inline bool SameBits(Span<const float> a, const std::vector<float>& b) {
  return a.size() == b.size() && (b.empty() || std::memcmp(a.data(), b.data(), b.size() * 4) == 0);
}

// The compressor's input check since the last take (CompressorTelemetry::input_checked /
// input_non_finite): it read every value and saw a NaN / inf exactly when `non_finite`; a second
// take reports nothing.
inline void ExpectInputCheck(compressors::Compressor& c, bool non_finite) {
  compressors::CompressorTelemetry t;
  c.TakeTelemetry(&t);
  EXPECT_TRUE(t.input_checked);
  EXPECT_EQ(t.input_non_finite, non_finite);
  compressors::CompressorTelemetry again;
  c.TakeTelemetry(&again);
  EXPECT_FALSE(again.input_checked || again.input_non_finite);
}

}  // namespace bitpush::testing
