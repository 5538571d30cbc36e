#include "common/transport/zmq/lane.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

#include "common/little_endian.h"
#include "common/transport/zmq/framing.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {
namespace {

// Part 0 of a sealed message: what the tag authenticates besides the bytes (the sequence
// number and the size of every part: GCM alone would let bytes move across a part boundary).
std::string Prefix(uint64_t sequence, const std::vector<size_t>& sizes) {
  std::string prefix(20 + 8 * sizes.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(prefix.data());
  std::copy(std::begin(kSealedMagic), std::end(kSealedMagic), p);
  PutU64(p + 4, sequence);
  PutU64(p + 12, sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) PutU64(p + 20 + 8 * i, sizes[i]);
  return prefix;
}

size_t Chunks(size_t size) {
  return (size + kLaneChunkBytes - 1) / kLaneChunkBytes;
}

// An uninitialised byte buffer (written whole: zeroing it first would cost a pass).
Buffer NewBuffer(size_t size, uint8_t** data) {
  std::shared_ptr<uint8_t[]> bytes(new uint8_t[size == 0 ? 1 : size]);
  *data = bytes.get();
  return Buffer::Borrow(bytes.get(), size, std::shared_ptr<const void>(bytes, bytes.get()));
}

void Nonce(uint64_t sequence, uint8_t nonce[12]) {
  std::memset(nonce, 0, 4);
  PutU64(nonce + 4, sequence);
}

// Makes `*ctx` ready for the message `sequence`: AES-256-GCM under `key` (set up on first use,
// the key schedule kept), the sequence number as nonce.
Status Begin(EVP_CIPHER_CTX** ctx, bool seal, const std::string& key, uint64_t sequence) {
  const char* what = seal ? "lane seal" : "lane open";
  uint8_t nonce[12];
  Nonce(sequence, nonce);
  const auto* k = reinterpret_cast<const unsigned char*>(key.data());
  const bool fresh = *ctx == nullptr;
  if (fresh) *ctx = EVP_CIPHER_CTX_new();
  if (*ctx == nullptr) return InternalError(fmt::format("{}: cannot set up AES-256-GCM", what));
  const EVP_CIPHER* cipher = fresh ? EVP_aes_256_gcm() : nullptr;
  const int ok = seal ? EVP_EncryptInit_ex(*ctx, cipher, nullptr, fresh ? k : nullptr, nonce)
                      : EVP_DecryptInit_ex(*ctx, cipher, nullptr, fresh ? k : nullptr, nonce);
  if (ok != 1) return InternalError(fmt::format("{}: cannot set the key and nonce", what));
  return Status::Ok();
}

// EVP_*Update take int lengths: large parts go through in slices.
constexpr size_t kSlice = size_t{1} << 30;

}  // namespace

StatusOr<std::string> RandomBytes(size_t bytes) {
  std::string out(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(bytes)) != 1) {
    return InternalError("the random number generator failed (RAND_bytes)");
  }
  return out;
}

std::string EncodeLaneRequest(uint64_t request) {
  std::string out(kLaneRequestBytes, '\0');
  std::memcpy(out.data(), kLaneRequestMagic, sizeof(kLaneRequestMagic));
  PutU64(reinterpret_cast<uint8_t*>(out.data()) + 4, request);
  return out;
}

StatusOr<uint64_t> ParseLaneRequest(const uint8_t* data, size_t size) {
  if (size != kLaneRequestBytes ||
      std::memcmp(data, kLaneRequestMagic, sizeof(kLaneRequestMagic)) != 0) {
    return DataLossError("not a lane request");
  }
  return GetU64(data + 4);
}

std::string EncodeLaneOffer(const LaneOffer& offer) {
  std::string out(kLaneOfferMagic, sizeof(kLaneOfferMagic));
  out.resize(out.size() + 8);
  PutU64(reinterpret_cast<uint8_t*>(out.data()) + 4, offer.request);
  out += offer.key;
  out += offer.ticket;
  out += offer.address;
  return out;
}

StatusOr<LaneOffer> ParseLaneOffer(const uint8_t* data, size_t size) {
  constexpr size_t kFixed = sizeof(kLaneOfferMagic) + 8 + kLaneKeyBytes + kLaneTicketBytes;
  if (size <= kFixed || std::memcmp(data, kLaneOfferMagic, sizeof(kLaneOfferMagic)) != 0) {
    return DataLossError(fmt::format("not a lane offer ({} bytes)", size));
  }
  LaneOffer o;
  o.request = GetU64(data + 4);
  const char* p = reinterpret_cast<const char*>(data) + sizeof(kLaneOfferMagic) + 8;
  o.key.assign(p, kLaneKeyBytes);
  o.ticket.assign(p + kLaneKeyBytes, kLaneTicketBytes);
  o.address.assign(p + kLaneKeyBytes + kLaneTicketBytes, size - kFixed);
  return o;
}

StatusOr<std::string> LaneAddressFor(const std::string& peer_address,
                                     const std::string& lane_address) {
  const bool peer_tcp = peer_address.rfind("tcp://", 0) == 0;
  const bool lane_tcp = lane_address.rfind("tcp://", 0) == 0;
  if (!peer_tcp && !lane_tcp && lane_address.rfind("ipc://", 0) == 0) return lane_address;
  const size_t peer_colon = peer_address.rfind(':');
  const size_t lane_colon = lane_address.rfind(':');
  if (!peer_tcp || !lane_tcp || peer_colon == std::string::npos ||
      lane_colon == std::string::npos || lane_colon + 1 == lane_address.size()) {
    return InvalidArgumentError(
        fmt::format("a lane at '{}' cannot be reached through '{}'", lane_address, peer_address));
  }
  return peer_address.substr(0, peer_colon) + lane_address.substr(lane_colon);
}

std::string TicketPassword(const std::string& ticket) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(ticket.size() * 2);
  for (unsigned char c : ticket) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

struct LaneCipher::Ctx {
  EVP_CIPHER_CTX* seal = nullptr;
  EVP_CIPHER_CTX* open = nullptr;
  ~Ctx() {
    EVP_CIPHER_CTX_free(seal);
    EVP_CIPHER_CTX_free(open);
  }
};

LaneCipher::LaneCipher(const std::string& key) : ctx_(std::make_unique<Ctx>()), key_(key) {}

LaneCipher::~LaneCipher() = default;

Status LaneCipher::Seal(const std::vector<ByteSpan>& plain, const std::vector<uint8_t*>& out,
                        std::string* prefix, uint8_t* tag) {
  if (key_.size() != kLaneKeyBytes || out.size() != plain.size()) {
    return InternalError("lane seal: bad arguments");
  }
  if (next_ == std::numeric_limits<uint64_t>::max()) {
    return OutOfRangeError("lane seal: the sequence numbers are used up");
  }
  BP_RETURN_IF_ERROR(Begin(&ctx_->seal, /*seal=*/true, key_, next_));
  std::vector<size_t> sizes(plain.size());
  for (size_t i = 0; i < plain.size(); ++i) sizes[i] = plain[i].size();
  *prefix = Prefix(next_, sizes);
  int len = 0;
  if (EVP_EncryptUpdate(ctx_->seal, nullptr, &len,
                        reinterpret_cast<const unsigned char*>(prefix->data()),
                        static_cast<int>(prefix->size())) != 1) {
    return InternalError("lane seal: associated data");
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    for (size_t off = 0; off < sizes[i]; off += kSlice) {
      const int n = static_cast<int>(std::min(kSlice, sizes[i] - off));
      if (EVP_EncryptUpdate(ctx_->seal, out[i] + off, &len, plain[i].data() + off, n) != 1 ||
          len != n) {
        return InternalError("lane seal: encryption failed");
      }
    }
  }
  if (EVP_EncryptFinal_ex(ctx_->seal, tag, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx_->seal, EVP_CTRL_GCM_GET_TAG, kSealTagBytes, tag) != 1) {
    return InternalError("lane seal: the tag");
  }
  ++next_;
  return Status::Ok();
}

StatusOr<std::vector<Buffer>> LaneCipher::Open(const std::vector<ByteSpan>& wire) {
  const auto not_sealed = [](const std::string& why) {
    return DataLossError("not a sealed message: " + why);
  };
  if (wire.size() < 2 || wire[0].size() < 20 ||
      std::memcmp(wire[0].data(), kSealedMagic, sizeof(kSealedMagic)) != 0) {
    return not_sealed("no prefix 'BPS1'");
  }
  if (wire.back().size() != kSealTagBytes) return not_sealed("no 16-byte tag");
  const uint8_t* p = wire[0].data();
  const uint64_t sequence = GetU64(p + 4);
  const uint64_t n = GetU64(p + 12);
  if (n == 0 || n > (wire[0].size() - 20) / 8 || wire[0].size() != 20 + 8 * n) {
    return not_sealed(fmt::format("a prefix of {} bytes", wire[0].size()));
  }
  // The parts, chunked as the prefix says.
  std::vector<size_t> sizes(n);
  size_t chunks = 0;
  for (size_t i = 0; i < n; ++i) {
    sizes[i] = GetU64(p + 20 + 8 * i);
    if (sizes[i] > (size_t{1} << 62)) return not_sealed("a part of more than 2^62 bytes");
    chunks += Chunks(sizes[i]);
  }
  if (wire.size() != chunks + 2) {
    return not_sealed(
        fmt::format("the prefix announces {} chunks, {} parts follow", chunks, wire.size() - 2));
  }
  size_t w = 1;
  for (size_t i = 0; i < n; ++i) {
    for (size_t left = sizes[i]; left > 0; ++w) {
      const size_t expect = std::min(left, kLaneChunkBytes);
      if (wire[w].size() != expect) {
        return not_sealed(
            fmt::format("a chunk of {} bytes where {} were due", wire[w].size(), expect));
      }
      left -= expect;
    }
  }
  if (sequence != next_) {
    return FailedPreconditionError(
        fmt::format("sealed message number {} where number {} was next (replayed or out of order)",
                    sequence, next_));
  }
  BP_RETURN_IF_ERROR(Begin(&ctx_->open, /*seal=*/false, key_, sequence));
  int len = 0;
  if (EVP_DecryptUpdate(ctx_->open, nullptr, &len, p, static_cast<int>(wire[0].size())) != 1) {
    return InternalError("lane open: associated data");
  }
  std::vector<Buffer> parts(n);
  w = 1;
  for (size_t i = 0; i < n; ++i) {
    uint8_t* out = nullptr;
    parts[i] = NewBuffer(sizes[i], &out);
    for (size_t off = 0; off < sizes[i]; off += wire[w].size(), ++w) {
      const int size = static_cast<int>(wire[w].size());
      if (EVP_DecryptUpdate(ctx_->open, out + off, &len, wire[w].data(), size) != 1 ||
          len != size) {
        return InternalError("lane open: decryption failed");
      }
    }
  }
  uint8_t final_block[16];
  if (EVP_CIPHER_CTX_ctrl(ctx_->open, EVP_CTRL_GCM_SET_TAG, kSealTagBytes,
                          const_cast<uint8_t*>(wire.back().data())) != 1 ||
      EVP_DecryptFinal_ex(ctx_->open, final_block, &len) != 1) {
    return FailedPreconditionError(fmt::format(
        "sealed message number {} does not verify under the lane's key (altered, or from "
        "another lane)",
        sequence));
  }
  ++next_;
  return parts;
}

Status SealMessage(LaneCipher* lane, Message* m) {
  const size_t n = m->frames.size();
  if (n > UINT32_MAX || m->header.size() > UINT32_MAX) {
    return InvalidArgumentError(
        fmt::format("a message of {} frames and a {}-byte header", n, m->header.size()));
  }
  std::vector<uint8_t> envelope(kEnvelopeFixedBytes + m->header.size());
  EncodeEnvelope(m->header, static_cast<uint32_t>(n), envelope.data());
  std::vector<ByteSpan> plain(n + 1);
  std::vector<uint8_t*> out(n + 1);
  std::vector<Buffer> sealed(n + 1);
  plain[0] = ByteSpan(envelope.data(), envelope.size());
  sealed[0] = NewBuffer(envelope.size(), &out[0]);
  for (size_t i = 0; i < n; ++i) {
    plain[i + 1] = m->frames[i].span();
    sealed[i + 1] = NewBuffer(m->frames[i].size(), &out[i + 1]);
  }
  std::string prefix;
  uint8_t* tag = nullptr;
  Buffer tag_buffer = NewBuffer(kSealTagBytes, &tag);
  BP_RETURN_IF_ERROR(lane->Seal(plain, out, &prefix, tag));
  std::vector<Buffer> wire;
  wire.reserve(n + 3);
  wire.push_back(Buffer::Take(std::move(prefix)));
  for (const Buffer& b : sealed) {
    for (size_t off = 0; off < b.size(); off += kLaneChunkBytes) {
      wire.push_back(
          Buffer::Borrow(b.data() + off, std::min(kLaneChunkBytes, b.size() - off), b.owner()));
    }
  }
  wire.push_back(std::move(tag_buffer));
  m->header.clear();
  m->frames = std::move(wire);
  return Status::Ok();
}

}  // namespace bitpush::transport::zmq_backend
