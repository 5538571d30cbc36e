// The payload header: layout byte by byte, and validation of every field.
#include "compressors/payload.h"

#include <gtest/gtest.h>

#include <vector>

namespace bitpush::compressors {
namespace {

TEST(PayloadHeader, LayoutIsLittleEndianAndDocumented) {
  PayloadHeader h;
  h.compressor_id = v1::COMPRESSOR_ID_TOPK;
  h.dtype = DType::kFloat16;
  h.body_bytes = 0x01020304;
  h.element_count = 0x0000000A0B0C0D0Eull;
  uint8_t b[16];
  WritePayloadHeader(h, b);
  const std::vector<uint8_t> want = {1,    5,    1,    0,    0x04, 0x03, 0x02, 0x01,
                                     0x0E, 0x0D, 0x0C, 0x0B, 0x0A, 0,    0,    0};
  EXPECT_EQ(std::vector<uint8_t>(b, b + 16), want);
}

TEST(PayloadHeader, ParsesWhatWasWritten) {
  std::vector<uint8_t> p(16 + 3);
  PayloadHeader h;
  h.compressor_id = v1::COMPRESSOR_ID_NONE;
  h.body_bytes = 3;
  h.element_count = 42;
  WritePayloadHeader(h, p.data());
  auto parsed = ParsePayloadHeader({p.data(), p.size()});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->element_count, 42u);
  EXPECT_EQ(parsed->body_bytes, 3u);
}

TEST(PayloadHeader, EveryBadFieldIsNamed) {
  std::vector<uint8_t> p(16 + 3);
  PayloadHeader h;
  h.compressor_id = v1::COMPRESSOR_ID_NONE;
  h.body_bytes = 3;
  h.element_count = 42;
  WritePayloadHeader(h, p.data());
  auto msg = [](std::vector<uint8_t> b) {
    auto r = ParsePayloadHeader({b.data(), b.size()});
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    return r.status().message();
  };
  EXPECT_NE(msg(std::vector<uint8_t>(p.begin(), p.begin() + 15)).find("shorter"),
            std::string::npos);
  auto b = p;
  b[0] = 9;
  EXPECT_NE(msg(b).find("version 9"), std::string::npos);
  b = p;
  b[1] = 77;
  EXPECT_NE(msg(b).find("compressor id 77"), std::string::npos);
  b = p;
  b[2] = 5;
  EXPECT_NE(msg(b).find("dtype 5"), std::string::npos);
  b = p;
  b[3] = 2;
  EXPECT_NE(msg(b).find("flags"), std::string::npos);
  b = p;
  b.push_back(0);
  EXPECT_NE(msg(b).find("4 bytes follow"), std::string::npos);
  b = p;
  b[15] = 1;
  EXPECT_NE(msg(b).find("2^40"), std::string::npos);
}

}  // namespace
}  // namespace bitpush::compressors
