// Tests of the sparse body format shared by topk and randomk: the keep-count rule, the body
// writer and the validating decoder (every rejection path, `out` untouched on error,
// unaligned bodies, fp32 / fp16 / bf16 values, NaN and inf values accepted).
#include "compressors/sparse/sparse_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/half.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {
namespace {

// A body with the given k field, indices and fp32 values (raw; may be inconsistent).
std::vector<uint8_t> Body(uint32_t k, const std::vector<uint32_t>& idx,
                          const std::vector<float>& values) {
  std::vector<uint8_t> b(4 + 4 * idx.size() + 4 * values.size());
  std::memcpy(b.data(), &k, 4);
  if (!idx.empty()) std::memcpy(b.data() + 4, idx.data(), 4 * idx.size());
  if (!values.empty()) std::memcpy(b.data() + 4 + 4 * idx.size(), values.data(), 4 * values.size());
  return b;
}

Status Decode(const std::vector<uint8_t>& body, size_t n, float* out, bool add,
              DType dtype = DType::kFloat32) {
  return DecodeSparseBody("topk", ByteSpan(body.data(), body.size()), n, dtype, out, add);
}

// Decodes with add == true into a patterned buffer; expects DataLoss containing `what` and
// the buffer unchanged. Same for add == false.
void ExpectRejected(const std::vector<uint8_t>& body, size_t n, const std::string& what,
                    DType dtype = DType::kFloat32) {
  for (bool add : {true, false}) {
    std::vector<float> out(n + 1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = 0.5f + static_cast<float>(i);
    const std::vector<float> before = out;
    const Status s = Decode(body, n, out.data(), add, dtype);
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_EQ(s.message().rfind("topk: ", 0), 0u) << s.message();
    EXPECT_EQ(0, std::memcmp(out.data(), before.data(), out.size() * 4)) << "out was modified";
  }
}

v1::TopkParams Ratio(double r) {
  v1::TopkParams p;
  p.set_ratio(r);
  return p;
}
v1::TopkParams K(uint64_t k) {
  v1::TopkParams p;
  p.set_k(k);
  return p;
}

TEST(SparseSize, KeepCount) {
  const SparseSize r001 = SparseSize::FromParams(Ratio(0.01));
  EXPECT_EQ(r001.KeepCount(0), 0u);
  EXPECT_EQ(r001.KeepCount(1), 1u);  // max(1, floor(0.01))
  EXPECT_EQ(r001.KeepCount(99), 1u);
  EXPECT_EQ(r001.KeepCount(250), 2u);  // floor(2.5)
  EXPECT_EQ(r001.KeepCount(1 << 20), 10485u);
  const SparseSize r1 = SparseSize::FromParams(Ratio(1.0));
  EXPECT_EQ(r1.KeepCount(7), 7u);
  EXPECT_EQ(r1.KeepCount(0), 0u);
  const SparseSize half = SparseSize::FromParams(Ratio(0.5));
  EXPECT_EQ(half.KeepCount(33), 16u);
  const SparseSize k5 = SparseSize::FromParams(K(5));
  EXPECT_EQ(k5.KeepCount(0), 0u);
  EXPECT_EQ(k5.KeepCount(3), 3u);  // clamped to n
  EXPECT_EQ(k5.KeepCount(5), 5u);
  EXPECT_EQ(k5.KeepCount(1000), 5u);
  // Also reads RandomkParams.
  v1::RandomkParams rp;
  rp.set_k(9);
  EXPECT_EQ(SparseSize::FromParams(rp).KeepCount(100), 9u);
  rp.set_ratio(0.25);
  EXPECT_EQ(SparseSize::FromParams(rp).KeepCount(100), 25u);
}

TEST(SparseFormat, BodyBytes) {
  EXPECT_EQ(SparseBodyBytes(0, DType::kFloat32), 4u);
  EXPECT_EQ(SparseBodyBytes(10, DType::kFloat32), 84u);
  EXPECT_EQ(SparseBodyBytes(10, DType::kFloat16), 64u);
  EXPECT_EQ(SparseBodyBytes(10, DType::kBFloat16), 64u);
}

TEST(SparseFormat, WriteAndDecodeAllDtypes) {
  const std::vector<uint32_t> idx = {0, 3, 7, 15};
  const std::vector<float> vals = {1.5f, -2.25f, 1024.0f, -0.0f};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint8_t> body(SparseBodyBytes(idx.size(), dtype));
    uint8_t* values = WriteSparseHead(idx.data(), idx.size(), body.data());
    EXPECT_EQ(static_cast<size_t>(values - body.data()), 4 + 4 * idx.size());
    for (size_t j = 0; j < idx.size(); ++j) {
      EXPECT_EQ(StoreSparseValue(vals[j], dtype, j, values), vals[j]);  // all exact here
    }
    std::vector<float> out(16, 9.0f);
    ASSERT_TRUE(Decode(body, 16, out.data(), false, dtype).ok());
    for (size_t i = 0, j = 0; i < 16; ++i) {
      if (j < idx.size() && idx[j] == i) {
        EXPECT_EQ(FloatBits(out[i]), FloatBits(vals[j])) << i;
        ++j;
      } else {
        EXPECT_EQ(FloatBits(out[i]), 0u) << i;  // +0.0
      }
    }
    std::vector<float> acc(16, 1.0f);
    ASSERT_TRUE(Decode(body, 16, acc.data(), true, dtype).ok());
    for (size_t i = 0, j = 0; i < 16; ++i) {
      const float want = (j < idx.size() && idx[j] == i) ? 1.0f + vals[j++] : 1.0f;
      EXPECT_EQ(acc[i], want) << i;
    }
  }
}

TEST(SparseFormat, StoreRoundsToDtype) {
  uint8_t buf[4];
  const float v = 1.0f + 1.0f / 4096;  // not representable in fp16 or bf16
  EXPECT_EQ(StoreSparseValue(v, DType::kFloat32, 0, buf), v);
  EXPECT_EQ(StoreSparseValue(v, DType::kFloat16, 0, buf), HalfToFloat(FloatToHalf(v)));
  EXPECT_EQ(StoreSparseValue(v, DType::kBFloat16, 0, buf), Bf16ToFloat(FloatToBf16(v)));
  EXPECT_TRUE(std::isinf(StoreSparseValue(1e6f, DType::kFloat16, 0, buf)));
}

TEST(SparseFormat, EmptyBody) {
  std::vector<float> out(3, 7.0f);
  ASSERT_TRUE(Decode(Body(0, {}, {}), 3, out.data(), true).ok());
  EXPECT_EQ(out, std::vector<float>(3, 7.0f));
  ASSERT_TRUE(Decode(Body(0, {}, {}), 3, out.data(), false).ok());
  EXPECT_EQ(out, std::vector<float>(3, 0.0f));
  ASSERT_TRUE(Decode(Body(0, {}, {}), 0, nullptr, false).ok());
}

TEST(SparseFormat, NonFiniteValuesAreData) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> out(4, 1.0f);
  ASSERT_TRUE(Decode(Body(2, {1, 2}, {nan, -inf}), 4, out.data(), true).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], -inf);
  EXPECT_EQ(out[3], 1.0f);
}

TEST(SparseFormat, UnalignedBody) {
  const std::vector<uint8_t> body = Body(2, {2, 5}, {3.0f, -4.0f});
  std::vector<uint8_t> shifted(body.size() + 3);
  for (size_t off = 1; off <= 3; ++off) {
    std::memcpy(shifted.data() + off, body.data(), body.size());
    std::vector<float> out(6, 0.0f);
    ASSERT_TRUE(DecodeSparseBody("topk", ByteSpan(shifted.data() + off, body.size()), 6,
                                 DType::kFloat32, out.data(), false)
                    .ok());
    EXPECT_EQ(out, (std::vector<float>{0, 0, 3, 0, 0, -4}));
  }
}

TEST(SparseFormat, RejectsShortBody) {
  for (size_t len = 0; len < 4; ++len) {
    ExpectRejected(std::vector<uint8_t>(len, 0), 16, "too short");
  }
}

TEST(SparseFormat, RejectsEveryTruncationAndExtension) {
  const std::vector<uint8_t> good = Body(3, {1, 4, 9}, {1.0f, 2.0f, 3.0f});
  std::vector<float> out(16);
  ASSERT_TRUE(Decode(good, 16, out.data(), false).ok());
  for (size_t len = 4; len < good.size(); ++len) {
    ExpectRejected(std::vector<uint8_t>(good.begin(), good.begin() + len), 16,
                   "body is " + std::to_string(len) + " bytes but k=3");
  }
  for (size_t extra : {1, 2, 4, 8}) {
    std::vector<uint8_t> longer = good;
    longer.resize(good.size() + extra, 0);
    ExpectRejected(longer, 16, "but k=3");
  }
  // A 2-byte-value body decoded as fp32 (and vice versa) has the wrong length.
  ExpectRejected(good, 16, "float16", DType::kFloat16);
}

TEST(SparseFormat, RejectsKAboveN) {
  ExpectRejected(Body(5, {0, 1, 2, 3, 4}, {1, 1, 1, 1, 1}), 4,
                 "payload keeps 5 elements but the tensor has only 4");
  // A huge k must not overflow the length check.
  ExpectRejected(Body(0xFFFFFFFFu, {}, {}), 16, "payload keeps 4294967295 elements");
}

TEST(SparseFormat, RejectsIndexOutOfRange) {
  ExpectRejected(Body(4, {1, 2, 5, 17}, {1, 1, 1, 1}), 16,
                 "topk: index 17 at position 3 is out of range for 16 elements");
  ExpectRejected(Body(1, {16}, {1}), 16, "index 16 at position 0 is out of range");
  // int32 on the wire: 0xFFFFFFFF is index -1.
  ExpectRejected(Body(1, {0xFFFFFFFFu}, {1}), 16, "index -1 at position 0 is out of range");
  ExpectRejected(Body(2, {0, 0x80000000u}, {1, 1}), 16, "index -2147483648 at position 1");
}

TEST(SparseFormat, RejectsUnorderedIndices) {
  ExpectRejected(Body(3, {1, 5, 3}, {1, 1, 1}), 16,
                 "index 3 at position 2 does not follow index 5");
  ExpectRejected(Body(3, {1, 5, 5}, {1, 1, 1}), 16,
                 "index 5 at position 2 does not follow index 5");
  ExpectRejected(Body(2, {0, 0}, {1, 1}), 16, "strictly increasing");
}

TEST(SparseFormat, BadIndexAfterManyGoodOnesLeavesOutUntouched) {
  std::vector<uint32_t> idx(100);
  for (uint32_t i = 0; i < 100; ++i) idx[i] = 2 * i;
  idx[99] = 1000;  // out of range for n = 200
  ExpectRejected(Body(100, idx, std::vector<float>(100, 3.0f)), 200, "index 1000 at position 99");
}

}  // namespace
}  // namespace bitpush::compressors
