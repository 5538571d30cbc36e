#include "compressors/compressor.h"

#include <string>
#include <vector>

#include "common/logging.h"
#include "common/vector_ops.h"

namespace bitpush::compressors {
namespace {

Status CheckCapacity(size_t need, MutableByteSpan out) {
  if (out.size() < need) {
    return InvalidArgumentError("output buffer of " + std::to_string(out.size()) +
                                " bytes is smaller than the " + std::to_string(need) +
                                " bytes the payload may need (MaxCompressedBytes)");
  }
  return Status::Ok();
}

}  // namespace

size_t CompressorBase::FinishPayload(DType dtype, size_t n, size_t body_bytes, uint8_t* out) const {
  PayloadHeader h;
  h.compressor_id = id_;
  h.dtype = dtype;
  h.body_bytes = static_cast<uint32_t>(body_bytes);
  h.element_count = n;
  WritePayloadHeader(h, out);
  return kPayloadHeaderBytes + body_bytes;
}

Status CompressorBase::CheckElementCount(size_t n) const {
  if (n <= MaxElements()) return Status::Ok();
  return InvalidArgumentError(std::string(v1::CompressorId_Name(id_)) + ": a tensor of " +
                              std::to_string(n) + " elements exceeds the format's limit of " +
                              std::to_string(MaxElements()) +
                              " per payload; partition it (partition_bytes)");
}

StatusOr<DType> CompressorBase::PayloadDType(DType input, const CompressContext& ctx) {
  if (!ctx.store_as || *ctx.store_as == input) return input;
  if (input != DType::kFloat32) {
    return InvalidArgumentError(
        "a " + std::string(DTypeName(input)) + " tensor cannot be stored as " +
        std::string(DTypeName(*ctx.store_as)) + " (store_as narrows fp32 input only)");
  }
  return *ctx.store_as;
}

bool CompressorBase::RawBodyHeader(ConstTensorView input, const CompressContext& ctx,
                                   uint8_t* header) const {
  const size_t n = input.count();
  if (!CheckElementCount(n).ok()) return false;
  StatusOr<DType> dtype = PayloadDType(input.dtype(), ctx);
  if (!dtype.ok() || *dtype != input.dtype() || !BodyIsInputBytes(*dtype)) return false;
  FinishPayload(*dtype, n, n * DTypeSize(*dtype), header);
  return true;
}

StatusOr<size_t> CompressorBase::Compress(ConstTensorView input, const CompressContext& ctx,
                                          MutableByteSpan out) {
  const size_t n = input.count();
  BP_RETURN_IF_ERROR(CheckElementCount(n));
  BP_ASSIGN_OR_RETURN(const DType dtype, PayloadDType(input.dtype(), ctx));
  BP_RETURN_IF_ERROR(CheckCapacity(MaxCompressedBytes(n, dtype), out));
  const float* x = input.f32();
  if (input.dtype() != DType::kFloat32) {
    float* tmp = Scratch(n);
    ConvertToFloat(input, tmp, isa_);
    x = tmp;
  }
  const size_t body = EncodeBody(x, n, dtype, ctx, out.data() + kPayloadHeaderBytes);
  return FinishPayload(dtype, n, body, out.data());
}

void CompressorBase::TakeTelemetry(CompressorTelemetry* into) {
  into->input_checked |= input_checked_;
  into->input_non_finite |= input_non_finite_;
  input_checked_ = input_non_finite_ = false;
}

StatusOr<size_t> CompressorBase::CompressWithFeedback(ConstTensorView input, Span<float> residual,
                                                      const CompressContext& ctx,
                                                      MutableByteSpan out) {
  const size_t n = input.count();
  BP_RETURN_IF_ERROR(CheckElementCount(n));
  if (residual.size() != n) {
    return InvalidArgumentError("residual has " + std::to_string(residual.size()) +
                                " elements but the tensor has " + std::to_string(n));
  }
  BP_ASSIGN_OR_RETURN(const DType dtype, PayloadDType(input.dtype(), ctx));
  BP_RETURN_IF_ERROR(CheckCapacity(MaxCompressedBytes(n, dtype), out));
  if (!(ctx.residual_decay >= 0.0f && ctx.residual_decay <= 1.0f)) {
    return InvalidArgumentError("residual decay " + std::to_string(ctx.residual_decay) +
                                " is not in [0, 1]");
  }
  uint8_t* body_out = out.data() + kPayloadHeaderBytes;
  size_t body;
  const bool fused_decay = dtype == DType::kFloat32 && FusesResidualDecay();
  if (ctx.residual_decay != 1.0f && !fused_decay) {
    ScaleFloatArray(residual.data(), n, ctx.residual_decay, isa_);  // e *= γ, then as before
  }
  if (dtype == DType::kFloat32) {
    body = EncodeBodyWithFeedbackF32(input.f32(), residual.data(), n, ctx, body_out);
  } else {
    AddToFloat(input, residual.data(), isa_);  // e = x + e, then C(e) rounded to dtype
    body = EncodeBodyWithFeedback(residual.data(), n, dtype, ctx, body_out);
  }
  return FinishPayload(dtype, n, body, out.data());
}

size_t CompressorBase::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                 const CompressContext& ctx, uint8_t* body) {
  AddFloatArray(g, e, n, isa_);
  return EncodeBodyWithFeedback(e, n, DType::kFloat32, ctx, body);
}

StatusOr<PayloadHeader> CompressorBase::CheckPayload(ByteSpan payload,
                                                     size_t expected_count) const {
  BP_ASSIGN_OR_RETURN(PayloadHeader h, ParsePayloadHeader(payload));
  if (h.compressor_id != id_) {
    return DataLossError("payload was written by compressor " +
                         v1::CompressorId_Name(h.compressor_id) + " but this decoder is " +
                         v1::CompressorId_Name(id_));
  }
  if (h.element_count != expected_count) {
    return DataLossError("payload holds " + std::to_string(h.element_count) + " elements but " +
                         std::to_string(expected_count) + " were expected");
  }
  return h;
}

Status CompressorBase::Decompress(ByteSpan payload, TensorView out) {
  BP_ASSIGN_OR_RETURN(PayloadHeader h, CheckPayload(payload, out.count()));
  if (h.dtype != out.dtype()) {
    return InvalidArgumentError("payload dtype is " + std::string(DTypeName(h.dtype)) +
                                " but the output tensor is " + std::string(DTypeName(out.dtype())));
  }
  const ByteSpan body = payload.subspan(kPayloadHeaderBytes, h.body_bytes);
  const size_t n = out.count();
  if (out.dtype() == DType::kFloat32) return DecodeBodyToTensor(body, n, h.dtype, out.f32());
  if (Status s; DecodeBodyInDType(body, n, h.dtype, out.data(), &s)) return s;
  float* tmp = Scratch(n);
  BP_RETURN_IF_ERROR(DecodeBody(body, n, h.dtype, tmp, false));
  ConvertFromFloat(tmp, out, isa_);
  return Status::Ok();
}

Status CompressorBase::DecompressAdd(ByteSpan payload, Span<float> accumulator) {
  BP_ASSIGN_OR_RETURN(PayloadHeader h, CheckPayload(payload, accumulator.size()));
  const ByteSpan body = payload.subspan(kPayloadHeaderBytes, h.body_bytes);
  return DecodeBody(body, accumulator.size(), h.dtype, accumulator.data(), true);
}

Status CompressorBase::DecompressToFloat(ByteSpan payload, Span<float> out) {
  BP_ASSIGN_OR_RETURN(PayloadHeader h, CheckPayload(payload, out.size()));
  const ByteSpan body = payload.subspan(kPayloadHeaderBytes, h.body_bytes);
  return DecodeBody(body, out.size(), h.dtype, out.data(), false);
}

Status CompressorBase::ValidateBody(ByteSpan, size_t, DType) {
  return UnimplementedError(std::string(v1::CompressorId_Name(id_)) + ": no validate-only decoder");
}

size_t CompressorBase::AggregateBody(const ByteSpan*, size_t, size_t, DType, float, float*,
                                     const CompressContext&, uint8_t*) {
  BP_CHECK(false, "{}: AggregateBody called but FusesServerRound is false",
           v1::CompressorId_Name(id_));
  return 0;
}

Status CompressorBase::ValidatePayload(ByteSpan payload, size_t n) {
  BP_ASSIGN_OR_RETURN(PayloadHeader h, CheckPayload(payload, n));
  return ValidateBody(payload.subspan(kPayloadHeaderBytes, h.body_bytes), n, h.dtype);
}

StatusOr<size_t> CompressorBase::AggregateCompress(Span<const ByteSpan> pushes, size_t n,
                                                   float scale, float* residual,
                                                   const CompressContext& ctx,
                                                   MutableByteSpan out) {
  const bool with_residual = residual != nullptr;
  if (!FusesServerRound(with_residual)) {
    return FailedPreconditionError(std::string(v1::CompressorId_Name(id_)) +
                                   " does not fuse the server round" +
                                   (with_residual ? " with a residual" : ""));
  }
  if (pushes.empty()) return InvalidArgumentError("AggregateCompress needs at least one push");
  BP_RETURN_IF_ERROR(CheckElementCount(n));
  BP_ASSIGN_OR_RETURN(const DType out_dtype, PayloadDType(DType::kFloat32, ctx));
  BP_RETURN_IF_ERROR(CheckCapacity(MaxCompressedBytes(n, out_dtype), out));
  // Cheap re-check of the headers (the bodies were validated by ValidatePayload).
  std::vector<ByteSpan> bodies;
  bodies.reserve(pushes.size());
  DType dtype = DType::kFloat32;
  for (size_t w = 0; w < pushes.size(); ++w) {
    BP_ASSIGN_OR_RETURN(PayloadHeader h, CheckPayload(pushes[w], n));
    if (w == 0) dtype = h.dtype;
    if (h.dtype != dtype) {
      return InvalidArgumentError("push " + std::to_string(w) + " is " +
                                  std::string(DTypeName(h.dtype)) + " but push 0 is " +
                                  std::string(DTypeName(dtype)));
    }
    bodies.push_back(pushes[w].subspan(kPayloadHeaderBytes, h.body_bytes));
  }
  BP_RETURN_IF_ERROR(ValidateAggregate(bodies.data(), bodies.size(), n));
  const size_t body = AggregateBody(bodies.data(), bodies.size(), n, dtype, scale, residual, ctx,
                                    out.data() + kPayloadHeaderBytes);
  return FinishPayload(out_dtype, n, body, out.data());
}

}  // namespace bitpush::compressors
