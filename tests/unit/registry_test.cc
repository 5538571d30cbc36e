// Spec strings: parsing, defaults, canonical form, and the error messages users see.
#include "compressors/registry.h"

#include <gtest/gtest.h>

namespace bitpush::compressors {
namespace {

std::string Canon(const std::string& spec) {
  auto c = ParseCompressorSpec(spec);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status().ToString();
  return c.ok() ? CompressorSpecString(*c) : "";
}

std::string Error(const std::string& spec) {
  auto c = ParseCompressorSpec(spec);
  EXPECT_FALSE(c.ok()) << spec << " was accepted";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  return c.status().message();
}

TEST(Registry, DocumentedSpecsParse) {
  EXPECT_EQ(Canon("none"), "none");
  EXPECT_EQ(Canon("fp16"), "fp16");
  EXPECT_EQ(Canon("bf16"), "bf16");
  EXPECT_EQ(Canon("onebit"), "onebit:scaled=true");
  EXPECT_EQ(Canon("onebit:scaled=false"), "onebit:scaled=false");
  EXPECT_EQ(Canon("topk:ratio=0.001"), "topk:ratio=0.001");
  EXPECT_EQ(Canon("topk:k=1000"), "topk:k=1000");
  EXPECT_EQ(Canon("randomk:ratio=0.03125,unbiased=true,seed=7"),
            "randomk:ratio=0.03125,unbiased=true,seed=7");
  EXPECT_EQ(Canon("randomk:k=5"), "randomk:k=5,unbiased=false,seed=0");
  EXPECT_EQ(Canon("dithering:levels=15,partition=linear,norm=max"),
            "dithering:levels=15,partition=linear,norm=max,seed=0");
  EXPECT_EQ(Canon("dithering"), "dithering:levels=15,partition=linear,norm=max,seed=0");
  EXPECT_EQ(Canon(" dithering : levels = 3 , partition = natural , norm = l2 "),
            "dithering:levels=3,partition=natural,norm=l2,seed=0");
}

TEST(Registry, CanonicalFormRoundTrips) {
  for (const char* spec : {"onebit:scaled=false", "topk:ratio=0.001", "topk:k=3",
                           "randomk:ratio=0.1,unbiased=true,seed=99",
                           "dithering:levels=255,partition=linear,norm=l2,seed=5"}) {
    const std::string c = Canon(spec);
    EXPECT_EQ(Canon(c), c);
  }
}

TEST(Registry, UnknownNameListsValidNames) {
  const std::string m = Error("twobit");
  EXPECT_NE(m.find("'twobit'"), std::string::npos) << m;
  for (const std::string& name : CompressorNames()) EXPECT_NE(m.find(name), std::string::npos) << m;
}

TEST(Registry, UnknownParameterListsValidParameters) {
  std::string m = Error("topk:ratio=0.1,kk=3");
  EXPECT_NE(m.find("'kk'"), std::string::npos) << m;
  EXPECT_NE(m.find("ratio, k"), std::string::npos) << m;
  m = Error("fp16:x=1");
  EXPECT_NE(m.find("no parameters"), std::string::npos) << m;
  m = Error("dithering:level=3");
  EXPECT_NE(m.find("levels, partition, norm, seed"), std::string::npos) << m;
}

TEST(Registry, OutOfRangeAndMalformedValuesNameTheParameter) {
  EXPECT_NE(Error("topk:ratio=0").find("ratio"), std::string::npos);
  EXPECT_NE(Error("topk:ratio=1.5").find("0 < ratio <= 1"), std::string::npos);
  EXPECT_NE(Error("topk:ratio=abc").find("'abc'"), std::string::npos);
  EXPECT_NE(Error("topk:k=0").find("k >= 1"), std::string::npos);
  EXPECT_NE(Error("topk:k=-3").find("'-3'"), std::string::npos);
  EXPECT_NE(Error("topk").find("ratio=R"), std::string::npos);
  EXPECT_NE(Error("topk:ratio=0.1,k=4").find("not both"), std::string::npos);
  EXPECT_NE(Error("onebit:scaled=maybe").find("true or false"), std::string::npos);
  EXPECT_NE(Error("dithering:levels=0").find("1..255"), std::string::npos);
  EXPECT_NE(Error("dithering:levels=256").find("1..255"), std::string::npos);
  EXPECT_NE(Error("dithering:levels=32,partition=natural").find("1..31"), std::string::npos);
  EXPECT_NE(Error("dithering:partition=cubic").find("linear or natural"), std::string::npos);
  EXPECT_NE(Error("dithering:norm=l1").find("max or l2"), std::string::npos);
  EXPECT_NE(Error("randomk:ratio=0.1,seed=1,seed=2").find("twice"), std::string::npos);
  EXPECT_NE(Error("onebit:scaled").find("param=value"), std::string::npos);
  EXPECT_NE(Error("onebit:").find("param=value"), std::string::npos);
  EXPECT_NE(Error("topk:ratio=nan").find("finite"), std::string::npos);
}

TEST(Registry, ConfigsFromTheWireAreValidated) {
  v1::CompressorConfig c;
  c.set_id(static_cast<v1::CompressorId>(99));
  EXPECT_EQ(CanonicalizeCompressorConfig(c).status().code(), StatusCode::kInvalidArgument);
  c.set_id(v1::COMPRESSOR_ID_TOPK);
  c.mutable_onebit()->set_scaled(true);  // params of another compressor
  EXPECT_EQ(CanonicalizeCompressorConfig(c).status().code(), StatusCode::kInvalidArgument);
  c.mutable_topk()->set_ratio(2.0);
  EXPECT_EQ(CanonicalizeCompressorConfig(c).status().code(), StatusCode::kInvalidArgument);
  c.mutable_topk()->set_ratio(0.5);
  EXPECT_TRUE(CanonicalizeCompressorConfig(c).ok());
  EXPECT_TRUE(CreateCompressor(c).ok());
}

TEST(Registry, CreateGivesTheRightId) {
  for (const std::string& name : CompressorNames()) {
    const std::string spec = name == "topk" || name == "randomk" ? name + ":ratio=0.5" : name;
    auto c = CreateCompressor(spec);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status().ToString();
    EXPECT_EQ(CompressorName((*c)->id()), name);
  }
}

TEST(Registry, ErrorFeedbackPolicies) {
  EXPECT_EQ(*ParseErrorFeedbackPolicy("both"), v1::ERROR_FEEDBACK_BOTH);
  EXPECT_EQ(ErrorFeedbackPolicyName(v1::ERROR_FEEDBACK_WORKER), "worker");
  const Status s = ParseErrorFeedbackPolicy("vanilla").status();
  EXPECT_NE(s.message().find("none, worker, server, both"), std::string::npos);
}

TEST(Registry, FrozenIds) {
  // These numbers are in every payload ever written: they must never change.
  EXPECT_EQ(v1::COMPRESSOR_ID_NONE, 1);
  EXPECT_EQ(v1::COMPRESSOR_ID_FP16, 2);
  EXPECT_EQ(v1::COMPRESSOR_ID_BF16, 3);
  EXPECT_EQ(v1::COMPRESSOR_ID_ONEBIT, 4);
  EXPECT_EQ(v1::COMPRESSOR_ID_TOPK, 5);
  EXPECT_EQ(v1::COMPRESSOR_ID_RANDOMK, 6);
  EXPECT_EQ(v1::COMPRESSOR_ID_DITHERING, 7);
}

}  // namespace
}  // namespace bitpush::compressors
