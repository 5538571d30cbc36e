// The sealed lanes of the zmq backend (common/transport/zmq/lane.h): what a receiver opens and
// what it refuses. The lanes at work between real endpoints are in transport_security_test.cc.
#include "common/transport/zmq/lane.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/transport/zmq/framing.h"

namespace bitpush::transport::zmq_backend {
namespace {

// A message's wire parts, as the receiving socket hands them over (copies).
using Wire = std::vector<std::vector<uint8_t>>;

std::vector<ByteSpan> Spans(const Wire& w) {
  std::vector<ByteSpan> out;
  for (const auto& part : w) out.emplace_back(part.data(), part.size());
  return out;
}

Message Sample(uint8_t seed) {
  Message m;
  m.header = "header-" + std::to_string(seed);
  for (size_t size : {size_t{5000}, size_t{0}, size_t{33}, kLaneChunkBytes * 2 + 17}) {
    std::vector<uint8_t> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
    m.frames.push_back(Buffer::Take(std::move(bytes)));
  }
  return m;
}

Wire Seal(LaneCipher* c, Message m) {
  EXPECT_TRUE(SealMessage(c, &m).ok());
  Wire w;
  for (const Buffer& b : m.frames) w.emplace_back(b.data(), b.data() + b.size());
  return w;
}

// The message a receiver gets from opened parts (the envelope, then the frames).
Message Opened(const std::vector<Buffer>& parts) {
  const uint8_t* header = nullptr;
  size_t header_bytes = 0;
  EXPECT_TRUE(
      ParseEnvelope(parts[0].data(), parts[0].size(), parts.size() - 1, &header, &header_bytes)
          .ok());
  Message m;
  m.header.assign(reinterpret_cast<const char*>(header), header_bytes);
  m.frames.assign(parts.begin() + 1, parts.end());
  return m;
}

void ExpectSame(const Message& a, const Message& b) {
  EXPECT_EQ(a.header, b.header);
  ASSERT_EQ(a.frames.size(), b.frames.size());
  for (size_t i = 0; i < a.frames.size(); ++i) {
    EXPECT_TRUE(std::equal(a.frames[i].data(), a.frames[i].data() + a.frames[i].size(),
                           b.frames[i].data(), b.frames[i].data() + b.frames[i].size()))
        << "frame " << i;
  }
}

const std::string kKey(kLaneKeyBytes, 'k');

TEST(Lane, MessagesOpenInOrderBitForBitFromChunksOfAtMost1MiB) {
  LaneCipher tx(kKey), rx(kKey);
  for (uint8_t n = 0; n < 3; ++n) {
    const Message plain = Sample(n);
    const Wire w = Seal(&tx, plain);
    // prefix, envelope, 5000, (empty: none), 33, three chunks of the 2 MiB + 17, tag
    ASSERT_EQ(w.size(), 1u + 1 + 1 + 0 + 1 + 3 + 1);
    for (const auto& part : w) EXPECT_LE(part.size(), kLaneChunkBytes);
    EXPECT_EQ(w[5].size(), kLaneChunkBytes);
    EXPECT_EQ(w[6].size(), 17u);
    EXPECT_FALSE(std::equal(w[2].begin(), w[2].end(), plain.frames[0].data()))
        << "a frame is not sent in the clear";
    StatusOr<std::vector<Buffer>> opened = rx.Open(Spans(w));
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    ExpectSame(Opened(*opened), plain);
  }
  EXPECT_EQ(rx.next_sequence(), 3u);
}

TEST(Lane, AnAlteredByteIsRefusedAndTheLaneGoesOn) {
  LaneCipher tx(kKey), rx(kKey);
  Wire w = Seal(&tx, Sample(1));
  w[5][4000] ^= 1;
  StatusOr<std::vector<Buffer>> opened = rx.Open(Spans(w));
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.status().message().find("does not verify"), std::string::npos)
      << opened.status().message();
  EXPECT_EQ(rx.next_sequence(), 0u);
  // The genuine message still opens.
  LaneCipher tx_again(kKey);
  EXPECT_TRUE(rx.Open(Spans(Seal(&tx_again, Sample(1)))).ok());
}

TEST(Lane, BytesMovedAcrossAPartBoundaryAreRefused) {
  LaneCipher tx(kKey), rx(kKey);
  Wire w = Seal(&tx, Sample(2));
  // The same ciphertext stream with one byte moved from frame 0 to frame 2, the prefix's sizes
  // changed to match: GCM alone would accept it, the associated data does not.
  const uint8_t moved = w[2].back();
  w[2].pop_back();
  w[3].insert(w[3].begin(), moved);
  w[0][20 + 8 * 1] -= 1;  // size[1] (frame 0): 5000 -> 4999
  w[0][20 + 8 * 3] += 1;  // size[3] (frame 2): 33 -> 34
  EXPECT_EQ(rx.Open(Spans(w)).status().code(), StatusCode::kFailedPrecondition);
  // Chunks that disagree with the prefix are not a sealed message at all.
  Wire rechunked = Seal(&tx, Sample(3));
  rechunked[5].push_back(rechunked[6][0]);
  rechunked[6].erase(rechunked[6].begin());
  EXPECT_EQ(rx.Open(Spans(rechunked)).status().code(), StatusCode::kDataLoss);
}

TEST(Lane, AReplayedOrSkippedMessageIsRefused) {
  LaneCipher tx(kKey), rx(kKey);
  const Wire first = Seal(&tx, Sample(3));
  const Wire second = Seal(&tx, Sample(4));
  StatusOr<std::vector<Buffer>> skipped = rx.Open(Spans(second));
  EXPECT_EQ(skipped.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(skipped.status().message().find("number 1 where number 0 was next"), std::string::npos)
      << skipped.status().message();
  ASSERT_TRUE(rx.Open(Spans(first)).ok());
  EXPECT_EQ(rx.Open(Spans(first)).status().code(), StatusCode::kFailedPrecondition);
  // A replay that claims the next number does not verify: the number is authenticated.
  Wire renumbered = first;
  renumbered[0][4] = 1;
  EXPECT_EQ(rx.Open(Spans(renumbered)).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(rx.Open(Spans(second)).ok());
}

TEST(Lane, AnotherLanesKeyDoesNotOpen) {
  LaneCipher tx(std::string(kLaneKeyBytes, 'a')), rx(kKey);
  EXPECT_EQ(rx.Open(Spans(Seal(&tx, Sample(5)))).status().code(), StatusCode::kFailedPrecondition);
}

TEST(Lane, WhatIsNotASealedMessageIsDataLoss) {
  LaneCipher rx(kKey);
  const Wire junk = {std::vector<uint8_t>(40, 'x'), std::vector<uint8_t>(kSealTagBytes)};
  EXPECT_EQ(rx.Open(Spans(junk)).status().code(), StatusCode::kDataLoss);
  const Wire lone = {std::vector<uint8_t>(40, 'x')};
  EXPECT_EQ(rx.Open(Spans(lone)).status().code(), StatusCode::kDataLoss);
  // A prefix that announces more parts than it has room for.
  LaneCipher tx(kKey);
  Wire w = Seal(&tx, Sample(6));
  w[0][12] = 0xff;
  EXPECT_EQ(rx.Open(Spans(w)).status().code(), StatusCode::kDataLoss);
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
