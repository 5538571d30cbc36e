#include "compressors/cast/cast.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/vector_ops.h"
#include "compressors/factories.h"

namespace bitpush::compressors {

size_t CastCompressor::MaxBodyBytes(size_t n, DType dtype) const {
  return n * DTypeSize(Stored(dtype));
}

size_t CastCompressor::EncodeBody(const float* x, size_t n, DType dtype, const CompressContext&,
                                  uint8_t* body) {
  const DType stored = Stored(dtype);
  ConvertFromFloat(x, TensorView(body, n, stored), isa());
  return n * DTypeSize(stored);
}

size_t CastCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType dtype,
                                              const CompressContext& ctx, uint8_t* body) {
  const size_t bytes = EncodeBody(q, n, dtype, ctx, body);
  const DType stored = Stored(dtype);
  if (stored == DType::kFloat32) {  // exact: nothing left over
    if (n) std::memset(q, 0, n * sizeof(float));
    return bytes;
  }
  // e = q - C(q): decode what was stored and subtract it.
  float* decoded = Scratch(n);
  ConvertToFloat(ConstTensorView(body, n, stored), decoded, isa());
  for (size_t i = 0; i < n; ++i) {
    const float r = q[i] - decoded[i];
    q[i] = std::isfinite(r) ? r : 0.0f;  // NaN/inf (or overflow to inf) leaves no residual
  }
  return bytes;
}

size_t CastCompressor::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                 const CompressContext& ctx, uint8_t* body) {
  AddFloatArray(g, e, n, isa());
  return EncodeBodyWithFeedback(e, n, DType::kFloat32, ctx, body);
}

Status CastCompressor::DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) {
  const DType stored = Stored(dtype);
  const uint64_t want = static_cast<uint64_t>(n) * DTypeSize(stored);
  if (body.size() != want) {
    return DataLossError(std::string(CompressorName(id())) + " body is " +
                         std::to_string(body.size()) + " bytes; " + std::to_string(n) +
                         " elements of " + std::string(DTypeName(stored)) + " need " +
                         std::to_string(want));
  }
  const ConstTensorView values(body.data(), n, stored);
  if (add) {
    AddToFloat(values, out, isa());
  } else {
    ConvertToFloat(values, out, isa());
  }
  return Status::Ok();
}

std::unique_ptr<Compressor> NewNoneCompressor(IsaLevel isa) {
  return std::make_unique<CastCompressor>(v1::COMPRESSOR_ID_NONE, true, DType::kFloat32, isa);
}
std::unique_ptr<Compressor> NewFp16Compressor(IsaLevel isa) {
  return std::make_unique<CastCompressor>(v1::COMPRESSOR_ID_FP16, false, DType::kFloat16, isa);
}
std::unique_ptr<Compressor> NewBf16Compressor(IsaLevel isa) {
  return std::make_unique<CastCompressor>(v1::COMPRESSOR_ID_BF16, false, DType::kBFloat16, isa);
}

}  // namespace bitpush::compressors
