// Cast compressors: `none` (the tensor's own dtype, bytes as they are), `fp16` (IEEE binary16)
// and `bf16` (bfloat16). Body: n values of the target type, little-endian, no padding.
// Rounding is round-to-nearest-even; values beyond the fp16 range become ±inf and NaN stays
// NaN (so AMP's overflow check still sees them). With error feedback the residual keeps the
// rounding error, q - float(cast(q)); where that is not finite (a NaN/inf input, or an overflow
// to inf) the residual element is 0.
//
// Thread-safety: see compressors/compressor.h (one thread per instance).
#pragma once

#include "compressors/compressor.h"

namespace bitpush::compressors {

class CastCompressor final : public CompressorBase {
 public:
  // keep_input_dtype: `none` stores the input's own dtype; otherwise values become `target`.
  CastCompressor(v1::CompressorId id, bool keep_input_dtype, DType target, IsaLevel isa)
      : CompressorBase(id, isa), keep_input_dtype_(keep_input_dtype), target_(target) {}

 protected:
  size_t MaxBodyBytes(size_t n, DType dtype) const override;
  // `none`: the body is the input's bytes (fp16 / bf16 values round-trip through fp32 in
  // Compress unchanged, NaN payload bits aside).
  bool BodyIsInputBytes(DType dtype) const override { return Stored(dtype) == dtype; }
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  size_t EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n, const CompressContext& ctx,
                                   uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;
  // Every value of the right size decodes: the body's length is the only check.
  Status ValidateBody(ByteSpan body, size_t n, DType dtype) override {
    return CheckBodySize(body, n, Stored(dtype));
  }
  // Values stored in the output's own dtype (none of fp16 / bf16, fp16 into fp16, bf16 into
  // bf16): one copy, no fp32 round trip.
  bool DecodeBodyInDType(ByteSpan body, size_t n, DType dtype, void* out, Status* status) override;

 private:
  DType Stored(DType dtype) const { return keep_input_dtype_ ? dtype : target_; }
  Status CheckBodySize(ByteSpan body, size_t n, DType stored) const;

  bool keep_input_dtype_;
  DType target_;
};

}  // namespace bitpush::compressors
