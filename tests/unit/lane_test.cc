// The sealed lanes of the zmq backend (common/transport/zmq/lane.h): what a receiver opens and
// what it refuses. The lanes at work between real endpoints are in transport_security_test.cc.
#include "common/transport/zmq/lane.h"

#include "common/transport/zmq/framing.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace bitpush::transport::zmq_backend {
namespace {

// One message as a sender hands it over and as it arrives: parts 0..n (the envelope, the
// frames), sealed into part buffers plus the tag.
struct Sealed {
  std::vector<std::vector<uint8_t>> parts;  // sealed, then the tag

  std::vector<uint8_t*> pointers() {
    std::vector<uint8_t*> p;
    for (auto& part : parts) p.push_back(part.data());
    return p;
  }
  std::vector<size_t> sizes() const {
    std::vector<size_t> s;
    for (const auto& part : parts) s.push_back(part.size());
    return s;
  }
};

Sealed SealParts(LaneCipher* c, const std::vector<std::vector<uint8_t>>& plain) {
  Sealed out;
  std::vector<const uint8_t*> in;
  std::vector<size_t> sizes;
  std::vector<uint8_t*> dst;
  out.parts.resize(plain.size() + 1);
  for (size_t i = 0; i < plain.size(); ++i) {
    in.push_back(plain[i].data());
    sizes.push_back(plain[i].size());
    out.parts[i].resize(plain[i].size() + (i == 0 ? kSealedPrefixBytes : 0));
  }
  for (size_t i = 0; i < plain.size(); ++i) dst.push_back(out.parts[i].data());
  out.parts.back().resize(kSealTagBytes);
  EXPECT_TRUE(c->Seal(in, sizes, dst, out.parts.back().data()).ok());
  return out;
}

std::vector<std::vector<uint8_t>> Sample(uint8_t seed) {
  std::vector<std::vector<uint8_t>> parts = {std::vector<uint8_t>(20), std::vector<uint8_t>(5000),
                                             std::vector<uint8_t>(0), std::vector<uint8_t>(33)};
  for (auto& p : parts) {
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
  }
  return parts;
}

// The plain parts an opened message holds (the envelope after the sealed prefix).
std::vector<std::vector<uint8_t>> Opened(const Sealed& s) {
  std::vector<std::vector<uint8_t>> out;
  for (size_t i = 0; i + 1 < s.parts.size(); ++i) {
    const size_t skip = i == 0 ? kSealedPrefixBytes : 0;
    out.emplace_back(s.parts[i].begin() + skip, s.parts[i].end());
  }
  return out;
}

const std::string kKey(kLaneKeyBytes, 'k');

TEST(Lane, MessagesOpenInOrderBitForBit) {
  LaneCipher tx(kKey), rx(kKey);
  for (uint8_t m = 0; m < 3; ++m) {
    const auto plain = Sample(m);
    Sealed s = SealParts(&tx, plain);
    EXPECT_NE(Opened(s)[1], plain[1]) << "the frame is not sent in the clear";
    ASSERT_TRUE(rx.Open(s.pointers(), s.sizes()).ok());
    EXPECT_EQ(Opened(s), plain);
  }
  EXPECT_EQ(rx.next_sequence(), 3u);
}

TEST(Lane, AnAlteredByteIsRefusedAndTheLaneGoesOn) {
  LaneCipher tx(kKey), rx(kKey);
  Sealed s = SealParts(&tx, Sample(1));
  s.parts[1][4000] ^= 1;
  Status st = rx.Open(s.pointers(), s.sizes());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.message();
  EXPECT_NE(st.message().find("does not verify"), std::string::npos) << st.message();
  EXPECT_EQ(rx.next_sequence(), 0u);
  // The genuine message still opens.
  LaneCipher tx_again(kKey);
  Sealed again = SealParts(&tx_again, Sample(1));
  EXPECT_TRUE(rx.Open(again.pointers(), again.sizes()).ok());
}

TEST(Lane, BytesMovedAcrossAPartBoundaryAreRefused) {
  LaneCipher tx(kKey), rx(kKey);
  Sealed s = SealParts(&tx, Sample(2));
  // The same ciphertext stream, split differently: GCM alone would accept it.
  const uint8_t moved = s.parts[1].back();
  s.parts[1].pop_back();
  s.parts[3].insert(s.parts[3].begin(), moved);
  EXPECT_EQ(rx.Open(s.pointers(), s.sizes()).code(), StatusCode::kFailedPrecondition);
}

TEST(Lane, AReplayedOrSkippedMessageIsRefused) {
  LaneCipher tx(kKey), rx(kKey);
  Sealed first = SealParts(&tx, Sample(3));
  Sealed copy = first;
  Sealed second = SealParts(&tx, Sample(4));
  Status skipped = rx.Open(second.pointers(), second.sizes());
  EXPECT_EQ(skipped.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(skipped.message().find("number 1 where number 0 was next"), std::string::npos)
      << skipped.message();
  ASSERT_TRUE(rx.Open(first.pointers(), first.sizes()).ok());
  EXPECT_EQ(rx.Open(copy.pointers(), copy.sizes()).code(), StatusCode::kFailedPrecondition);
  // A replay that claims the next number does not verify: the number is authenticated.
  Sealed renumbered = copy;
  renumbered.parts[0][4] = 1;
  EXPECT_EQ(rx.Open(renumbered.pointers(), renumbered.sizes()).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(rx.Open(second.pointers(), second.sizes()).ok());
}

TEST(Lane, ASealedMessageOpensToItsEnvelopeAndFrames) {
  LaneCipher tx(kKey), rx(kKey);
  Message m;
  m.header = "header";
  m.frames.push_back(Buffer::Copy("frame-one", 9));
  m.frames.push_back(Buffer());
  ASSERT_TRUE(SealMessage(&tx, &m).ok());
  EXPECT_TRUE(m.header.empty());
  ASSERT_EQ(m.frames.size(), 4u);  // envelope, the two frames, the tag
  Sealed s;
  for (const Buffer& b : m.frames) s.parts.emplace_back(b.data(), b.data() + b.size());
  ASSERT_TRUE(rx.Open(s.pointers(), s.sizes()).ok());
  const uint8_t* header = nullptr;
  size_t header_bytes = 0;
  ASSERT_TRUE(ParseEnvelope(s.parts[0].data() + kSealedPrefixBytes,
                            s.parts[0].size() - kSealedPrefixBytes, 2, &header, &header_bytes)
                  .ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(header), header_bytes), "header");
  EXPECT_EQ(std::string(s.parts[1].begin(), s.parts[1].end()), "frame-one");
  EXPECT_TRUE(s.parts[2].empty());
}

TEST(Lane, AnotherLanesKeyDoesNotOpen) {
  LaneCipher tx(std::string(kLaneKeyBytes, 'a')), rx(kKey);
  Sealed s = SealParts(&tx, Sample(5));
  EXPECT_EQ(rx.Open(s.pointers(), s.sizes()).code(), StatusCode::kFailedPrecondition);
}

TEST(Lane, WhatIsNotASealedMessageIsDataLoss) {
  LaneCipher rx(kKey);
  std::vector<uint8_t> junk(40, 'x'), tag(kSealTagBytes);
  EXPECT_EQ(rx.Open({junk.data(), tag.data()}, {junk.size(), tag.size()}).code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(rx.Open({junk.data()}, {junk.size()}).code(), StatusCode::kDataLoss);
}

TEST(Lane, RequestsAndOffersRoundTrip) {
  const std::string request = EncodeLaneRequest(77);
  StatusOr<uint64_t> number =
      ParseLaneRequest(reinterpret_cast<const uint8_t*>(request.data()), request.size());
  ASSERT_TRUE(number.ok());
  EXPECT_EQ(*number, 77u);
  EXPECT_FALSE(ParseLaneRequest(reinterpret_cast<const uint8_t*>("BPT1xxxxxxxx"), 12).ok());

  LaneOffer offer{9, kKey, std::string(kLaneTicketBytes, 't'), "tcp://0.0.0.0:41234"};
  const std::string text = EncodeLaneOffer(offer);
  StatusOr<LaneOffer> back =
      ParseLaneOffer(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->request, 9u);
  EXPECT_EQ(back->key, offer.key);
  EXPECT_EQ(back->ticket, offer.ticket);
  EXPECT_EQ(back->address, offer.address);
  EXPECT_FALSE(ParseLaneOffer(reinterpret_cast<const uint8_t*>(text.data()), 30).ok());
}

TEST(Lane, TheLaneIsReachedWhereThePeerIs) {
  EXPECT_EQ(*LaneAddressFor("tcp://ps0:9000", "tcp://0.0.0.0:41234"), "tcp://ps0:41234");
  EXPECT_EQ(*LaneAddressFor("tcp://[::1]:9000", "tcp://[::]:41234"), "tcp://[::1]:41234");
  EXPECT_EQ(*LaneAddressFor("ipc:///run/a.sock", "ipc:///run/a.sock.lane"),
            "ipc:///run/a.sock.lane");
  EXPECT_FALSE(LaneAddressFor("ipc:///run/a.sock", "tcp://0.0.0.0:1").ok());
  EXPECT_EQ(TicketPassword(std::string("\x01\xab", 2)), "01ab");
}

TEST(Lane, RandomBytesDiffer) {
  StatusOr<std::string> a = RandomBytes(32), b = RandomBytes(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace bitpush::transport::zmq_backend
