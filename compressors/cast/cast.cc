#include "compressors/cast/cast.h"

#include <cstring>
#include <string>

#include "common/vector_ops.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"
#include "compressors/spec_registry.h"

namespace bitpush::compressors {

size_t CastCompressor::MaxBodyBytes(size_t n, DType dtype) const {
  return n * DTypeSize(Stored(dtype));
}

size_t CastCompressor::EncodeBody(const float* x, size_t n, DType dtype, const CompressContext&,
                                  uint8_t* body) {
  const DType stored = Stored(dtype);
  // A narrowing cast checks its values in its pass (NoteInputCheck: a NaN / inf input, or a
  // finite value that rounds to inf beyond fp16's range). `none` copies fp32 as it is: no pass
  // that reads values, so no check here (the engine's raw path makes its own).
  switch (stored) {
    case DType::kFloat32: ConvertFromFloat(x, TensorView(body, n, stored), isa()); break;
    case DType::kFloat16:
      NoteInputCheck(!FloatToHalfArray(x, reinterpret_cast<uint16_t*>(body), n, isa()));
      break;
    case DType::kBFloat16:
      NoteInputCheck(!FloatToBf16Array(x, reinterpret_cast<uint16_t*>(body), n, isa()));
      break;
  }
  return n * DTypeSize(stored);
}

size_t CastCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType dtype,
                                              const CompressContext&, uint8_t* body) {
  const DType stored = Stored(dtype);
  // CastWithResidual sees every q - cast(q): NaN / inf exactly where q or its cast is not finite.
  NoteInputCheck(!CastWithResidual(nullptr, q, TensorView(body, n, stored), isa()));
  return n * DTypeSize(stored);
}

size_t CastCompressor::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                 const CompressContext&, uint8_t* body) {
  // One fused pass: q = g + e, store cast(q), e = q - float(cast(q)), and the check.
  const DType stored = Stored(DType::kFloat32);
  NoteInputCheck(!CastWithResidual(g, e, TensorView(body, n, stored), isa()));
  return n * DTypeSize(stored);
}

Status CastCompressor::CheckBodySize(ByteSpan body, size_t n, DType stored) const {
  const uint64_t want = static_cast<uint64_t>(n) * DTypeSize(stored);
  if (body.size() == want) return Status::Ok();
  return DataLossError(std::string(CompressorName(id())) + " body is " +
                       std::to_string(body.size()) + " bytes; " + std::to_string(n) +
                       " elements of " + std::string(DTypeName(stored)) + " need " +
                       std::to_string(want));
}

bool CastCompressor::DecodeBodyInDType(ByteSpan body, size_t n, DType dtype, void* out,
                                       Status* status) {
  const DType stored = Stored(dtype);
  if (stored != dtype) return false;
  *status = CheckBodySize(body, n, stored);
  if (status->ok() && n > 0) std::memcpy(out, body.data(), n * DTypeSize(stored));
  return true;
}

Status CastCompressor::DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) {
  const DType stored = Stored(dtype);
  BP_RETURN_IF_ERROR(CheckBodySize(body, n, stored));
  const ConstTensorView values(body.data(), n, stored);
  if (add) {
    AddToFloat(values, out, isa());
  } else {
    ConvertToFloat(values, out, isa());
  }
  return Status::Ok();
}

namespace {

std::unique_ptr<Compressor> NewNone(const v1::CompressorConfig&, IsaLevel isa) {
  return std::make_unique<CastCompressor>(v1::COMPRESSOR_ID_NONE, true, DType::kFloat32, isa);
}
std::unique_ptr<Compressor> NewFp16(const v1::CompressorConfig&, IsaLevel isa) {
  return std::make_unique<CastCompressor>(v1::COMPRESSOR_ID_FP16, false, DType::kFloat16, isa);
}
std::unique_ptr<Compressor> NewBf16(const v1::CompressorConfig&, IsaLevel isa) {
  return std::make_unique<CastCompressor>(v1::COMPRESSOR_ID_BF16, false, DType::kBFloat16, isa);
}

}  // namespace

// The kernel halves of the cast methods (compressors/method.h; spec halves in cast_spec.cc).
const MethodKernels kNoneMethodKernels = {&kNoneMethodSpec, &NewNone, &NewResidualState};
const MethodKernels kFp16MethodKernels = {&kFp16MethodSpec, &NewFp16, &NewResidualState};
const MethodKernels kBf16MethodKernels = {&kBf16MethodSpec, &NewBf16, &NewResidualState};

}  // namespace bitpush::compressors
