// Array kernels shared by compressors and reducers: dtype conversion and fp32 accumulation,
// each dispatched on an explicit IsaLevel (see common/cpu_features.h).
//
// All conversions are bit-exact across ISA levels (round-to-nearest-even, NaN quieted).
// Accumulation of fp16/bf16 into fp32 converts exactly, then adds in fp32, so it is
// bit-exact across levels too.
//
// Thread-safety: pure functions over caller-owned memory; ranges must not overlap unless noted.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"
#include "common/tensor_view.h"

namespace bitpush {

void HalfToFloatArray(const uint16_t* src, float* dst, size_t n, IsaLevel isa);
void Bf16ToFloatArray(const uint16_t* src, float* dst, size_t n, IsaLevel isa);
// The narrowing casts return whether every value stored is finite: false when an input is NaN
// or inf, or rounds to inf beyond the narrow type's range (fp16 from |x| >= 65520). The check
// rides in the cast's pass (one compare per vector); callers that need it not ignore it.
bool FloatToHalfArray(const float* src, uint16_t* dst, size_t n, IsaLevel isa);
bool FloatToBf16Array(const float* src, uint16_t* dst, size_t n, IsaLevel isa);

// dst[i] = float(src[i]) for any source dtype (a copy for fp32).
void ConvertToFloat(ConstTensorView src, float* dst, IsaLevel isa);
// dst[i] = dtype(src[i]) for any destination dtype (a copy for fp32).
void ConvertFromFloat(const float* src, TensorView dst, IsaLevel isa);
// dst[i] += float(src[i]); src may be any dtype. dst may equal src only for fp32.
void AddToFloat(ConstTensorView src, float* dst, IsaLevel isa);
// dst[i] += src[i] (fp32).
void AddFloatArray(const float* src, float* dst, size_t n, IsaLevel isa);
// dst[i] = (dst[i] + src[i]) * scale (fp32): the add and then the multiply, each rounded, as
// AddFloatArray followed by a scaling pass gives (no fused multiply-add), in one pass.
void AddScaleFloatArray(const float* src, float* dst, size_t n, float scale, IsaLevel isa);
// dst[i] *= scale (fp32), in place.
void ScaleFloatArray(float* dst, size_t n, float scale, IsaLevel isa);

// The fused cast with error feedback: q = g + e (q = e when g is null); out = cast(q) in the
// dtype of `out`; e = q - float(cast(q)), and 0 wherever that is not finite (NaN/inf input,
// or an fp16 overflow). out.count() elements; out must not overlap g or e. Returns whether
// every stored value was finite (no such reset happened).
bool CastWithResidual(const float* g, float* e, TensorView out, IsaLevel isa);

// The index of the first element that is NaN or ±inf (any dtype), or v.count() when every
// element is finite. One read pass that stops at the first hit.
size_t FirstNonFinite(ConstTensorView v, IsaLevel isa);

}  // namespace bitpush
