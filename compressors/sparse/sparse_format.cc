#include "compressors/sparse/sparse_format.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace bitpush::compressors {
namespace {

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Zeroes out[0..n) with non-temporal stores from the first 64-byte boundary on (no
// read-for-ownership of lines overwritten whole); fenced, so plain stores may follow.
BP_TARGET_AVX512 void StreamZeroAvx512(float* out, size_t n) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
  const size_t head = std::min(n, static_cast<size_t>(((64 - (addr & 63)) & 63) / 4));
  for (size_t i = 0; i < head; ++i) out[i] = 0.0f;
  const __m512 zero = _mm512_setzero_ps();
  size_t i = head;
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(out + i, zero);
  _mm_sfence();
  for (; i < n; ++i) out[i] = 0.0f;
}

Status Bad(std::string_view name, const std::string& what) {
  return DataLossError(std::string(name) + ": " + what);
}

}  // namespace

uint64_t SparseSize::KeepCount(uint64_t n) const {
  if (n == 0) return 0;
  if (!by_ratio) return std::min<uint64_t>(k, n);
  // ratio is in (0, 1] (validated by the registry), so floor(ratio * n) <= n.
  const double f = std::floor(ratio * static_cast<double>(n));
  const uint64_t kf = f < 1.0 ? 1 : static_cast<uint64_t>(f);
  return std::min<uint64_t>(kf, n);
}

uint8_t* WriteSparseHead(const uint32_t* indices, size_t k, uint8_t* body) {
  const uint32_t k32 = static_cast<uint32_t>(k);
  std::memcpy(body, &k32, 4);
  if (k) std::memcpy(body + kSparseCountBytes, indices, k * kSparseIndexBytes);
  return body + kSparseCountBytes + k * kSparseIndexBytes;
}

Status ValidateSparseBody(std::string_view name, ByteSpan body, size_t n, DType dtype) {
  if (body.size() < kSparseCountBytes) {
    return Bad(name, "body is " + std::to_string(body.size()) +
                         " bytes, too short for its 4-byte element count");
  }
  const uint8_t* p = body.data();
  const uint64_t k = LoadU32(p);
  if (k > n) {
    return Bad(name, "payload keeps " + std::to_string(k) + " elements but the tensor has only " +
                         std::to_string(n));
  }
  const uint64_t vsize = DTypeSize(dtype);
  const uint64_t want = kSparseCountBytes + k * (kSparseIndexBytes + vsize);  // k < 2^32
  if (body.size() != want) {
    return Bad(name, "body is " + std::to_string(body.size()) +
                         " bytes but k=" + std::to_string(k) + " indices and " +
                         std::string(DTypeName(dtype)) + " values need " + std::to_string(want));
  }
  const uint8_t* idx = p + kSparseCountBytes;

  // Validate every index before touching `out`. Wire indices are int32: a value >= 2^31 is
  // negative and out of range like any index >= n.
  const uint64_t limit = std::min<uint64_t>(n, kMaxSparseElements + 1);
  int64_t prev = -1;
  for (uint64_t j = 0; j < k; ++j) {
    const uint32_t raw = LoadU32(idx + 4 * j);
    if (raw >= limit) {
      return Bad(name, "index " + std::to_string(static_cast<int32_t>(raw)) + " at position " +
                           std::to_string(j) + " is out of range for " + std::to_string(n) +
                           " elements");
    }
    if (static_cast<int64_t>(raw) <= prev) {
      return Bad(name, "index " + std::to_string(raw) + " at position " + std::to_string(j) +
                           " does not follow index " + std::to_string(prev) +
                           " (indices must be strictly increasing)");
    }
    prev = raw;
  }
  return Status::Ok();
}

Status DecodeSparseBody(std::string_view name, ByteSpan body, size_t n, DType dtype, float* out,
                        bool add) {
  BP_RETURN_IF_ERROR(ValidateSparseBody(name, body, n, dtype));
  const uint8_t* p = body.data();
  const uint64_t k = LoadU32(p);
  const uint8_t* idx = p + kSparseCountBytes;
  const uint8_t* values = idx + k * kSparseIndexBytes;
  if (add) {
    for (uint64_t j = 0; j < k; ++j) out[LoadU32(idx + 4 * j)] += LoadSparseValue(values, j, dtype);
  } else {
    if (n) std::memset(out, 0, n * sizeof(float));
    for (uint64_t j = 0; j < k; ++j) out[LoadU32(idx + 4 * j)] = LoadSparseValue(values, j, dtype);
  }
  return Status::Ok();
}

Status DecodeSparseBodyToTensor(std::string_view name, ByteSpan body, size_t n, DType dtype,
                                float* out, IsaLevel isa) {
  if (isa != IsaLevel::kAvx512 || n < kStreamZeroMin ||
      reinterpret_cast<uintptr_t>(out) % alignof(float) != 0) {
    return DecodeSparseBody(name, body, n, dtype, out, false);
  }
  BP_RETURN_IF_ERROR(ValidateSparseBody(name, body, n, dtype));
  const uint64_t k = LoadU32(body.data());
  const uint8_t* idx = body.data() + kSparseCountBytes;
  const uint8_t* values = idx + k * kSparseIndexBytes;
  StreamZeroAvx512(out, n);
  for (uint64_t j = 0; j < k; ++j) out[LoadU32(idx + 4 * j)] = LoadSparseValue(values, j, dtype);
  return Status::Ok();
}

}  // namespace bitpush::compressors
