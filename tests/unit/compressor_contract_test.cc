// The contract every compressor keeps, checked for every registered compressor spec, dtype and
// ISA level this CPU supports:
//  - payload size is exactly what the format says, and never above MaxCompressedBytes;
//  - decompress / decompress_add agree; lossless formats round-trip bit for bit;
//  - error feedback telescopes: sum_t C(q_t) + e_T = sum_t g_t (to fp32 rounding);
//  - payloads and residuals are bit-identical across ISA levels;
//  - decoders reject every truncation, extension and bad header, random bytes never crash,
//    and a rejected DecompressAdd leaves the accumulator untouched;
//  - NaN/inf in the input reach the decompressed output (so AMP can skip the step), where
//    the format can hold them (MethodSpec::carries_non_finite), and never poison the residual.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/vector_ops.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using testing::RandomFloats;
using testing::SupportedIsaLevels;

const std::vector<std::string> kSpecs = {
    "none",
    "fp16",
    "bf16",
    "onebit",
    "onebit:scaled=false",
    "topk:ratio=0.01",
    "topk:k=7",
    "randomk:ratio=0.03125",
    "randomk:ratio=0.25,unbiased=true,seed=7",
    "dithering:levels=15,partition=linear,norm=max",
    "dithering:levels=3,partition=natural,norm=max",
    "dithering:levels=7,partition=linear,norm=l2",
    "dithering:levels=255,partition=linear,norm=max",
    "sdp4bit",
    "sdp4bit:hadamard=off",
    "sdp4bit:bits=8,group=256",
    "loco:scale=8",
    "loco:block=64,pull=fp16",
    "separate",
    "separate:ratio=4,block=64",
    "binsgdm",
    "binsgdm:beta=0.9,seed=3",
};

const size_t kSizes[] = {0, 1, 31, 32, 33, 4097, size_t{1} << 20};

// RandomFloats(n, seed, sigma), drawn once per test program: every case of a test draws the same
// vectors, and drawing a million normals costs more than the compressor under ASan.
const std::vector<float>& Randoms(size_t n, uint64_t seed, float sigma = 1.0f) {
  static std::map<std::tuple<size_t, uint64_t, float>, std::vector<float>> drawn;
  auto [it, fresh] = drawn.try_emplace({n, seed, sigma});
  if (fresh) it->second = RandomFloats(n, seed, sigma);
  return it->second;
}

// The first index in [0, n) where want(i) fails, or n: one assertion per vector instead of one
// per element.
template <typename Pred>
size_t FirstFailure(size_t n, Pred want) {
  for (size_t i = 0; i < n; ++i) {
    if (!want(i)) return i;
  }
  return n;
}

bool SameFloat(float a, float b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// The exact payload size the documented format gives (docs/wire-format.md).
size_t ExpectedPayloadBytes(const v1::CompressorConfig& c, size_t n, DType dtype) {
  auto sparse_k = [n](auto& p) -> size_t {
    if (n == 0) return 0;
    if (p.has_ratio()) return std::max<size_t>(1, static_cast<size_t>(std::floor(p.ratio() * n)));
    return std::min<size_t>(p.k(), n);
  };
  size_t body = 0;
  switch (c.id()) {
    case v1::COMPRESSOR_ID_NONE: body = n * DTypeSize(dtype); break;
    case v1::COMPRESSOR_ID_FP16:
    case v1::COMPRESSOR_ID_BF16: body = 2 * n; break;
    case v1::COMPRESSOR_ID_ONEBIT: body = 4 + 8 * ((n + 63) / 64); break;
    case v1::COMPRESSOR_ID_TOPK: body = 4 + sparse_k(c.topk()) * (4 + DTypeSize(dtype)); break;
    case v1::COMPRESSOR_ID_RANDOMK:
      body = 4 + sparse_k(c.randomk()) * (4 + DTypeSize(dtype));
      break;
    case v1::COMPRESSOR_ID_DITHERING: {
      size_t b = 0;
      while ((size_t{1} << b) < c.dithering().levels() + 1u) ++b;
      body = 4 + (n + 63) / 64 * (b + 1) * 8;
      break;
    }
    case v1::COMPRESSOR_ID_SDP4BIT: {  // kind 1: header, f32 scale per group, packed codes
      const auto& q = c.sdp4bit();
      const size_t m = q.hadamard() ? (n + 31) / 32 * 32 : n;
      body = 8 + 4 * ((m + q.group() - 1) / q.group()) + (q.bits() == 4 ? (m + 1) / 2 : m);
      break;
    }
    case v1::COMPRESSOR_ID_LOCO: {  // a worker's 4-bit push: header, step(s), packed codes
      const uint32_t b = c.loco().block();
      body = 8 + 4 * (b == 0 ? 1 : (n + b - 1) / b) + (n + 1) / 2;
      break;
    }
    case v1::COMPRESSOR_ID_SEPARATE: {  // u64 stream, u32 block, u32 m, f32 per projection
      const uint64_t b = c.separate().block();
      const uint64_t m = std::max<uint64_t>(
          1, std::min<uint64_t>(b, uint64_t(std::ceil(double(b) / c.separate().ratio()))));
      const uint64_t last = n % b;
      body = 16 + 4 * ((n / b) * m + (last ? std::max<uint64_t>(1, (last * m + b - 1) / b) : 0));
      break;
    }
    case v1::COMPRESSOR_ID_BINSGDM: body = (n + 7) / 8; break;  // one bit per element
    default: ADD_FAILURE() << "no expected size for " << c.id();
  }
  return kPayloadHeaderBytes + body;
}

// A tensor of `dtype` holding random values; `f32` receives the exact fp32 values.
struct TestTensor {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  ConstTensorView view() const {
    return dtype == DType::kFloat32 ? ConstTensorView(f32.data(), f32.size())
                                    : ConstTensorView(u16.data(), u16.size(), dtype);
  }
};

TestTensor MakeTensor(const std::vector<float>& values, DType dtype) {
  TestTensor t{dtype, values, {}};
  if (dtype != DType::kFloat32) {
    t.u16.resize(values.size());
    ConvertFromFloat(values.data(), TensorView(t.u16.data(), values.size(), dtype),
                     IsaLevel::kScalar);
    ConvertToFloat(t.view(), t.f32.data(), IsaLevel::kScalar);
  }
  return t;
}

using Param = std::tuple<std::string, DType, IsaLevel>;

class CompressorContract : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    spec_ = std::get<0>(GetParam());
    dtype_ = std::get<1>(GetParam());
    isa_ = std::get<2>(GetParam());
    auto cfg = ParseCompressorSpec(spec_);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    c_ = Make(isa_);
  }
  std::unique_ptr<Compressor> Make(IsaLevel isa) {
    CompressorOptions o;
    o.isa = isa;
    auto c = CreateCompressor(config_, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }
  std::vector<uint8_t> CompressOk(Compressor& c, ConstTensorView x, uint64_t round = 1) {
    std::vector<uint8_t> out(c.MaxCompressedBytes(x.count(), x.dtype()));
    CompressContext ctx{3, round};
    auto r = c.Compress(x, ctx, {out.data(), out.size()});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    out.resize(r.ok() ? *r : 0);
    return out;
  }
  // Decompresses into fp32 (through the payload's dtype).
  std::vector<float> DecompressToFloat(const std::vector<uint8_t>& p, size_t n) {
    std::vector<float> f(n);
    if (dtype_ == DType::kFloat32) {
      EXPECT_TRUE(c_->Decompress({p.data(), p.size()}, TensorView(f.data(), n)).ok());
    } else {
      std::vector<uint16_t> h(n);
      const Status s = c_->Decompress({p.data(), p.size()}, TensorView(h.data(), n, dtype_));
      EXPECT_TRUE(s.ok()) << s.ToString();
      ConvertToFloat(ConstTensorView(h.data(), n, dtype_), f.data(), IsaLevel::kScalar);
    }
    return f;
  }
  bool Lossless() const {
    return config_.id() == v1::COMPRESSOR_ID_NONE ||
           (config_.id() == v1::COMPRESSOR_ID_FP16 && dtype_ == DType::kFloat16) ||
           (config_.id() == v1::COMPRESSOR_ID_BF16 && dtype_ == DType::kBFloat16);
  }

  std::string spec_;
  DType dtype_;
  IsaLevel isa_;
  v1::CompressorConfig config_;
  std::unique_ptr<Compressor> c_;
};

TEST_P(CompressorContract, SizesRoundTripAndDecompressAdd) {
  for (size_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const TestTensor x = MakeTensor(Randoms(n, 100 + n), dtype_);
    const std::vector<uint8_t> p = CompressOk(*c_, x.view());
    EXPECT_EQ(p.size(), ExpectedPayloadBytes(config_, n, dtype_));
    EXPECT_LE(p.size(), c_->MaxCompressedBytes(n, dtype_));
    auto header = ParsePayloadHeader({p.data(), p.size()});
    ASSERT_TRUE(header.ok()) << header.status().ToString();
    EXPECT_EQ(header->compressor_id, config_.id());
    EXPECT_EQ(header->dtype, dtype_);
    EXPECT_EQ(header->element_count, n);

    const std::vector<float> dec = DecompressToFloat(p, n);
    if (Lossless() && n > 0) {
      EXPECT_EQ(0, std::memcmp(dec.data(), x.f32.data(), n * 4));
    }
    // decompress_add onto a random accumulator == accumulator + decompressed (fp32 payloads
    // exactly; fp16/bf16 outputs are rounded to their dtype, the accumulator is not).
    std::vector<float> acc = Randoms(n, 7);
    std::vector<float> expect = acc;
    const Status s = c_->DecompressAdd({p.data(), p.size()}, {acc.data(), acc.size()});
    ASSERT_TRUE(s.ok()) << s.ToString();
    const size_t bad_add = FirstFailure(n, [&](size_t i) {
      const float want = expect[i] + dec[i];
      if (dtype_ == DType::kFloat32) return SameFloat(acc[i], want);
      return std::fabs(acc[i] - want) <= 1e-2f * (std::fabs(dec[i]) + 1e-3f);
    });
    ASSERT_EQ(bad_add, n) << "decompress_add at " << bad_add << ": " << acc[bad_add] << ", want "
                          << expect[bad_add] << " + " << dec[bad_add];
    // DecompressToFloat == DecompressAdd onto zeros (the server's first push of a round).
    std::vector<float> zeros(n, 0.0f);
    ASSERT_TRUE(c_->DecompressAdd({p.data(), p.size()}, {zeros.data(), n}).ok());
    std::vector<float> direct = Randoms(n, 9);
    ASSERT_TRUE(c_->DecompressToFloat({p.data(), p.size()}, {direct.data(), n}).ok());
    const size_t bad_direct =
        FirstFailure(n, [&](size_t i) { return SameFloat(direct[i], zeros[i]); });
    ASSERT_EQ(bad_direct, n) << "decompress " << direct[bad_direct] << " but decompress_add onto "
                             << "zeros " << zeros[bad_direct] << " at " << bad_direct;
  }
}

TEST_P(CompressorContract, ErrorFeedbackTelescopes) {
  for (size_t n : {size_t{33}, size_t{4097}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> e(n, 0.0f), sum_g(n, 0.0), sum_c(n, 0.0f), sum_abs(n, 0.0f);
    std::vector<uint8_t> out(c_->MaxCompressedBytes(n, dtype_));
    // Unbiased random-k is an Algorithm 3 compressor: under error feedback its residual grows
    // by (n/k - 1) each time an element is kept, and fp16 values overflow within 100 rounds.
    // The identity still holds; check it over 10 rounds there.
    const bool grows = config_.id() == v1::COMPRESSOR_ID_RANDOMK && config_.randomk().unbiased();
    const uint64_t rounds = grows ? 10 : 100;
    // Any unbiased compressor that is not contractive (a random projection: E||C(q) - q||^2 =
    // (d+1)/m ||q||^2) makes the vanilla residual grow geometrically; the identity holds while
    // the values are finite, so the rounds stop once the residual passes 1e6.
    float max_e = 0;
    for (uint64_t t = 0; t < rounds && max_e < 1e6f; ++t) {
      const TestTensor g = MakeTensor(Randoms(n, 1000 + t), dtype_);
      auto r = c_->CompressWithFeedback(g.view(), {e.data(), n}, {5, t}, {out.data(), out.size()});
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      std::vector<float> dec(n, 0.0f);
      ASSERT_TRUE(c_->DecompressAdd({out.data(), *r}, {dec.data(), n}).ok());
      for (size_t i = 0; i < n; ++i) {
        sum_g[i] += g.f32[i];
        sum_c[i] += dec[i];
        sum_abs[i] += std::fabs(g.f32[i]) + std::fabs(dec[i]) + std::fabs(e[i]);
        max_e = std::max(max_e, std::fabs(e[i]));
      }
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(sum_c[i] + e[i], sum_g[i], 1e-5f * sum_abs[i] + 1e-6f) << "element " << i;
    }
  }
}

// Every level matches a fresh scalar instance byte for byte (for the scalar level this checks
// that results do not depend on an instance's history or reused scratch buffers).
TEST_P(CompressorContract, IsaLevelsAgreeBitForBit) {
  auto ref = Make(IsaLevel::kScalar);
  const TestTensor warm = MakeTensor(Randoms(5000, 1), dtype_);
  (void)CompressOk(*c_, warm.view(), 9);
  for (size_t n : {size_t{1}, size_t{33}, size_t{1000}, size_t{4097}, size_t{65536 + 5}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const TestTensor x = MakeTensor(Randoms(n, 9 + n), dtype_);
    EXPECT_EQ(CompressOk(*c_, x.view(), 4), CompressOk(*ref, x.view(), 4));
    std::vector<float> e1 = Randoms(n, 77, 0.1f), e2 = e1;
    std::vector<uint8_t> p1(c_->MaxCompressedBytes(n, dtype_)), p2(p1.size());
    auto r1 = c_->CompressWithFeedback(x.view(), {e1.data(), n}, {1, 2}, {p1.data(), p1.size()});
    auto r2 = ref->CompressWithFeedback(x.view(), {e2.data(), n}, {1, 2}, {p2.data(), p2.size()});
    ASSERT_TRUE(r1.ok() && r2.ok());
    p1.resize(*r1);
    p2.resize(*r2);
    EXPECT_EQ(p1, p2);
    EXPECT_EQ(0, std::memcmp(e1.data(), e2.data(), n * 4));
    std::vector<float> d1 = Randoms(n, 3), d2 = d1;
    ASSERT_TRUE(c_->DecompressAdd({p1.data(), p1.size()}, {d1.data(), n}).ok());
    ASSERT_TRUE(ref->DecompressAdd({p2.data(), p2.size()}, {d2.data(), n}).ok());
    EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), n * 4));
  }
}

TEST_P(CompressorContract, DecoderRejectsTruncationExtensionAndBadHeaders) {
  for (size_t n : {size_t{1}, size_t{31}, size_t{33}, size_t{130}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const TestTensor x = MakeTensor(Randoms(n, n), dtype_);
    const std::vector<uint8_t> p = CompressOk(*c_, x.view());
    const std::vector<float> acc0 = Randoms(n, 5);
    auto expect_rejected = [&](const std::vector<uint8_t>& bad, const char* what) {
      std::vector<float> acc = acc0;
      const Status s = c_->DecompressAdd({bad.data(), bad.size()}, {acc.data(), n});
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << what << ": " << s.ToString();
      EXPECT_EQ(0, std::memcmp(acc.data(), acc0.data(), n * 4)) << what << ": acc modified";
      const Status t = c_->DecompressToFloat({bad.data(), bad.size()}, {acc.data(), n});
      EXPECT_EQ(t.code(), StatusCode::kDataLoss) << what << ": " << t.ToString();
      EXPECT_EQ(0, std::memcmp(acc.data(), acc0.data(), n * 4)) << what << ": out modified";
    };
    for (size_t len = 0; len < p.size(); ++len) {
      expect_rejected(std::vector<uint8_t>(p.begin(), p.begin() + len), "truncated");
    }
    std::vector<uint8_t> longer = p;
    longer.push_back(0);
    expect_rejected(longer, "one extra byte");
    std::vector<uint8_t> bad = p;
    bad[0] = 2;
    expect_rejected(bad, "format version 2");
    bad = p;
    bad[1] = static_cast<uint8_t>(config_.id() == v1::COMPRESSOR_ID_NONE ? 2 : 1);
    expect_rejected(bad, "another compressor's id");
    bad[1] = 0;
    expect_rejected(bad, "id 0");
    bad[1] = 200;
    expect_rejected(bad, "unknown id 200");
    bad = p;
    bad[2] = 3;
    expect_rejected(bad, "dtype 3");
    bad = p;
    bad[3] = 1;
    expect_rejected(bad, "flags 1");
    bad = p;
    bad[8] ^= 1;  // element count off by one
    expect_rejected(bad, "element count");
    bad = p;
    bad[15] = 0x80;  // element count 2^63
    expect_rejected(bad, "huge element count");
    // A wrong output dtype is the caller's mistake, not corrupt data.
    std::vector<float> out(n);
    if (dtype_ != DType::kFloat32) {
      EXPECT_EQ(c_->Decompress({p.data(), p.size()}, TensorView(out.data(), n)).code(),
                StatusCode::kInvalidArgument);
    }
  }
}

// Payloads arrive inside network frames at any offset: decoding from an odd address must give
// the same result (and, under UBSan, no misaligned access).
TEST_P(CompressorContract, PayloadAtAnyAlignmentDecodes) {
  const size_t n = 1000;
  const TestTensor x = MakeTensor(Randoms(n, 21), dtype_);
  const std::vector<uint8_t> p = CompressOk(*c_, x.view());
  std::vector<float> ref(n, 0.5f);
  ASSERT_TRUE(c_->DecompressAdd({p.data(), p.size()}, {ref.data(), n}).ok());
  for (size_t offset : {1, 2, 3, 5}) {
    std::vector<uint8_t> shifted(p.size() + offset);
    std::memcpy(shifted.data() + offset, p.data(), p.size());
    std::vector<float> acc(n, 0.5f);
    ASSERT_TRUE(c_->DecompressAdd({shifted.data() + offset, p.size()}, {acc.data(), n}).ok());
    EXPECT_EQ(0, std::memcmp(acc.data(), ref.data(), n * 4)) << "offset " << offset;
    // ... and encoding into a buffer at that offset writes the same bytes.
    std::vector<uint8_t> out(c_->MaxCompressedBytes(n, dtype_) + offset);
    auto r = c_->Compress(x.view(), {3, 1}, {out.data() + offset, out.size() - offset});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + offset, out.begin() + offset + *r), p);
    std::vector<float> e(n, 0.25f), e_ref(n, 0.25f);
    std::vector<uint8_t> p_ef(c_->MaxCompressedBytes(n, dtype_));
    auto r1 =
        c_->CompressWithFeedback(x.view(), {e_ref.data(), n}, {3, 1}, {p_ef.data(), p_ef.size()});
    auto r2 = c_->CompressWithFeedback(x.view(), {e.data(), n}, {3, 1},
                                       {out.data() + offset, out.size() - offset});
    ASSERT_TRUE(r1.ok() && r2.ok());
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + offset, out.begin() + offset + *r2),
              std::vector<uint8_t>(p_ef.begin(), p_ef.begin() + *r1));
  }
}

TEST_P(CompressorContract, RandomBytesNeverCrash) {
  std::mt19937 rng(11);
  const TestTensor x = MakeTensor(Randoms(200, 1), dtype_);
  const std::vector<uint8_t> valid = CompressOk(*c_, x.view());
  std::vector<float> acc(200);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b;
    if (iter % 2 == 0) {  // mutate a valid payload: header stays plausible
      b = valid;
      const int flips = 1 + rng() % 4;
      for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    } else {
      b.resize(rng() % 400);
      for (auto& v : b) v = static_cast<uint8_t>(rng());
    }
    // Either the bytes happen to form a valid payload, or they are refused as corrupt data.
    const Status st = c_->DecompressAdd({b.data(), b.size()}, {acc.data(), acc.size()});
    ASSERT_TRUE(st.ok() || st.code() == StatusCode::kDataLoss) << st.ToString();
  }
}

// CompressContext::store_as (the server's reply in an fp16 / bf16 key's dtype): an fp32 input
// stored as the parameter's dtype gives the payload size of that dtype, and decodes to exactly
// the fp32 payload's values rounded once to it; with error feedback the rounding error stays in
// the residual. A narrower input cannot be stored as another dtype.
TEST_P(CompressorContract, StoreAsNarrowsFp32Input) {
  const size_t n = 4097;
  const std::vector<float> x = Randoms(n, 31);
  const ConstTensorView xv(x.data(), n);
  std::vector<uint8_t> out(c_->MaxCompressedBytes(n, DType::kFloat32));
  CompressContext ctx{3, 1};
  ctx.store_as = dtype_;
  if (dtype_ == DType::kFloat32) {  // identity; and a narrower input is refused
    EXPECT_EQ(*c_->Compress(xv, ctx, {out.data(), out.size()}), CompressOk(*c_, xv).size());
    const TestTensor h = MakeTensor(x, DType::kFloat16);
    ctx.store_as = DType::kBFloat16;
    const Status s = c_->Compress(h.view(), ctx, {out.data(), out.size()}).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("cannot be stored as bfloat16"), std::string::npos) << s.ToString();
    return;
  }
  auto r = c_->Compress(xv, ctx, {out.data(), out.size()});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, ExpectedPayloadBytes(config_, n, dtype_));
  ASSERT_EQ(ParsePayloadHeader({out.data(), *r})->dtype, dtype_);
  std::vector<uint16_t> narrow(n);
  ASSERT_TRUE(c_->Decompress({out.data(), *r}, TensorView(narrow.data(), n, dtype_)).ok());
  // Reference: the fp32 payload of the same call, decoded to fp32, rounded once.
  const std::vector<uint8_t> wide = CompressOk(*c_, xv);
  std::vector<float> wide_dec(n);
  ASSERT_TRUE(c_->Decompress({wide.data(), wide.size()}, TensorView(wide_dec.data(), n)).ok());
  std::vector<uint16_t> want(n);
  ConvertFromFloat(wide_dec.data(), TensorView(want.data(), n, dtype_), IsaLevel::kScalar);
  ASSERT_EQ(narrow, want);
  // Error feedback from e = 0: decoded + e == x (to fp32 rounding of q - decoded).
  std::vector<float> e(n, 0.0f);
  r = c_->CompressWithFeedback(xv, {e.data(), n}, ctx, {out.data(), out.size()});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(ParsePayloadHeader({out.data(), *r})->dtype, dtype_);
  std::vector<float> dec(n, 0.0f);
  ASSERT_TRUE(c_->DecompressAdd({out.data(), *r}, {dec.data(), n}).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(dec[i] + e[i], x[i], 1e-6f * (std::fabs(x[i]) + std::fabs(dec[i]))) << i;
  }
}

TEST_P(CompressorContract, CallerErrorsAreInvalidArgument) {
  const TestTensor x = MakeTensor(Randoms(100, 1), dtype_);
  std::vector<uint8_t> small(c_->MaxCompressedBytes(100, dtype_) - 1);
  EXPECT_EQ(c_->Compress(x.view(), {}, {small.data(), small.size()}).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> out(c_->MaxCompressedBytes(100, dtype_));
  std::vector<float> e(99);
  EXPECT_EQ(c_->CompressWithFeedback(x.view(), {e.data(), e.size()}, {}, {out.data(), out.size()})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_P(CompressorContract, OversizedTensorIsRefusedBeforeAnyRead) {
  // The views point nowhere: the count alone must be refused, nothing read.
  const uint64_t limit =
      config_.id() == v1::COMPRESSOR_ID_TOPK || config_.id() == v1::COMPRESSOR_ID_RANDOMK
          ? 0x7FFFFFFFull
          : kMaxPayloadElements;
  const ConstTensorView huge(nullptr, limit + 1, dtype_);
  const Status s = c_->Compress(huge, {}, {}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(std::to_string(limit)), std::string::npos) << s.message();
  EXPECT_EQ(c_->CompressWithFeedback(huge, {}, {}, {}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_P(CompressorContract, NonFiniteInputReachesOutput) {
  // A method whose format has no non-finite value (MethodSpec::carries_non_finite == false:
  // binsgdm's +-1) cannot carry it; it must still decode to finite values and keep its residual
  // finite.
  const bool carries = FindMethod(config_.id())->carries_non_finite;
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> v = Randoms(4097, 3);
    v[1234] = bad;
    const TestTensor x = MakeTensor(v, dtype_);
    const std::vector<uint8_t> p = CompressOk(*c_, x.view());
    const std::vector<float> dec = DecompressToFloat(p, v.size());
    size_t non_finite = 0;
    for (float f : dec) non_finite += !std::isfinite(f);
    if (carries) {
      EXPECT_GT(non_finite, 0u) << "input value " << bad;
    } else {
      EXPECT_EQ(non_finite, 0u) << "input value " << bad;
    }

    // With error feedback: the output still carries the non-finite value, and the residual
    // is left finite (reset), so later rounds are not poisoned.
    std::vector<float> e = Randoms(v.size(), 8, 0.01f);
    std::vector<uint8_t> out(c_->MaxCompressedBytes(v.size(), dtype_));
    auto r =
        c_->CompressWithFeedback(x.view(), {e.data(), e.size()}, {1, 1}, {out.data(), out.size()});
    ASSERT_TRUE(r.ok());
    out.resize(*r);
    const std::vector<float> dec_ef = DecompressToFloat(out, v.size());
    non_finite = 0;
    for (float f : dec_ef) non_finite += !std::isfinite(f);
    if (carries) {
      EXPECT_GT(non_finite, 0u) << "EF, input value " << bad;
    } else {
      EXPECT_EQ(non_finite, 0u) << "EF, input value " << bad;
    }
    for (size_t i = 0; i < e.size(); ++i) {
      ASSERT_TRUE(std::isfinite(e[i]))
          << "residual " << i << " is " << e[i] << " after input " << bad;
    }
  }
}

// The worker engine's non-finite check (RoundPipeline::CompressAndPush) takes a compression's
// own report where there is one (CompressorTelemetry::input_checked, from the compressor or its
// worker error-feedback state) instead of a pass of its own. Where reported, it is exact: a
// NaN / inf at the first, a middle or the last element is seen and a finite input is not; and
// the methods whose encode reads every value on a path that shows one do report it.
TEST_P(CompressorContract, InputCheckIsExactWhereReported) {
  const v1::CompressorId id = config_.id();
  const bool reports = id == v1::COMPRESSOR_ID_FP16 || id == v1::COMPRESSOR_ID_BF16 ||
                       id == v1::COMPRESSOR_ID_ONEBIT || id == v1::COMPRESSOR_ID_TOPK ||
                       id == v1::COMPRESSOR_ID_RANDOMK || id == v1::COMPRESSOR_ID_DITHERING ||
                       id == v1::COMPRESSOR_ID_SDP4BIT || id == v1::COMPRESSOR_ID_LOCO ||
                       id == v1::COMPRESSOR_ID_BINSGDM;
  const size_t n = 4097;
  auto made = CreateErrorFeedback(config_, ErrorFeedbackSide::kWorker, n);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<ErrorFeedback> state = std::move(made).value();
  uint64_t round = 0;
  for (bool via_state : {false, true}) {
    for (size_t pos : {size_t{0}, size_t{1234}, n - 1}) {
      for (float value : {0.5f, std::nanf(""), INFINITY, -INFINITY}) {
        SCOPED_TRACE((via_state ? "through the worker state, " : "plain, ") +
                     std::to_string(value) + " at " + std::to_string(pos));
        std::vector<float> v = Randoms(n, 3);
        v[pos] = value;
        const TestTensor x = MakeTensor(v, dtype_);
        std::vector<uint8_t> out(c_->MaxCompressedBytes(n, dtype_));
        const CompressContext ctx{3, ++round};
        auto r = via_state ? state->Compress(*c_, x.view(), ctx, {out.data(), out.size()})
                           : c_->Compress(x.view(), ctx, {out.data(), out.size()});
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        CompressorTelemetry t;
        c_->TakeTelemetry(&t);
        state->TakeTelemetry(&t);
        // separate reports through its state (the compression reads g + e there), none with
        // a residual (the cast's pass forms q = g + e; without one it copies, unread).
        if (reports ||
            (via_state && (id == v1::COMPRESSOR_ID_SEPARATE || id == v1::COMPRESSOR_ID_NONE))) {
          EXPECT_TRUE(t.input_checked);
        }
        if (t.input_checked) EXPECT_EQ(t.input_non_finite, !std::isfinite(value));
      }
    }
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  std::string s = std::get<0>(info.param) + "_" + std::string(DTypeName(std::get<1>(info.param))) +
                  "_" + std::string(IsaLevelName(std::get<2>(info.param)));
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, CompressorContract,
                         ::testing::Combine(::testing::ValuesIn(kSpecs),
                                            ::testing::Values(DType::kFloat32, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::ValuesIn(SupportedIsaLevels())),
                         ParamName);

}  // namespace
}  // namespace bitpush::compressors
