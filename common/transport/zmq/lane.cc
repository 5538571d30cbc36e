#include "common/transport/zmq/lane.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

#include "common/transport/zmq/framing.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {
namespace {

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// What the tag authenticates besides the bytes: the sequence number and the size of every part
// (GCM alone would let bytes move across a part boundary).
std::vector<uint8_t> AssociatedData(uint64_t sequence, const std::vector<size_t>& sizes) {
  std::vector<uint8_t> aad(4 + 8 + 8 + 8 * sizes.size());
  std::copy(std::begin(kSealedMagic), std::end(kSealedMagic), aad.begin());
  PutU64(aad.data() + 4, sequence);
  PutU64(aad.data() + 12, sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) PutU64(aad.data() + 20 + 8 * i, sizes[i]);
  return aad;
}

void Nonce(uint64_t sequence, uint8_t nonce[12]) {
  std::memset(nonce, 0, 4);
  PutU64(nonce + 4, sequence);
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

Status LaneCipher::Seal(const std::vector<const uint8_t*>& plain, const std::vector<size_t>& sizes,
                        const std::vector<uint8_t*>& out, uint8_t* tag) {
  if (key_.size() != kLaneKeyBytes || plain.empty() || plain.size() != sizes.size() ||
      out.size() != sizes.size()) {
    return InternalError("lane seal: bad arguments");
  }
  if (next_ == std::numeric_limits<uint64_t>::max()) {
    return OutOfRangeError("lane seal: the sequence numbers are used up");
  }
  auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  uint8_t nonce[12];
  Nonce(next_, nonce);
  if (ctx_->seal == nullptr) {
    ctx_->seal = EVP_CIPHER_CTX_new();
    if (ctx_->seal == nullptr ||
        EVP_EncryptInit_ex(ctx_->seal, EVP_aes_256_gcm(), nullptr, key, nonce) != 1) {
      return InternalError("lane seal: cannot set up AES-256-GCM");
    }
  } else if (EVP_EncryptInit_ex(ctx_->seal, nullptr, nullptr, nullptr, nonce) != 1) {
    return InternalError("lane seal: cannot set the nonce");
  }
  std::vector<size_t> sealed_sizes = sizes;
  sealed_sizes[0] += kSealedPrefixBytes;
  const std::vector<uint8_t> aad = AssociatedData(next_, sealed_sizes);
  int len = 0;
  if (EVP_EncryptUpdate(ctx_->seal, nullptr, &len, aad.data(), static_cast<int>(aad.size())) != 1) {
    return InternalError("lane seal: associated data");
  }
  std::copy(std::begin(kSealedMagic), std::end(kSealedMagic), out[0]);
  PutU64(out[0] + 4, next_);
  for (size_t i = 0; i < plain.size(); ++i) {
    uint8_t* dst = out[i] + (i == 0 ? kSealedPrefixBytes : 0);
    for (size_t off = 0; off < sizes[i]; off += kSlice) {
      const int n = static_cast<int>(std::min(kSlice, sizes[i] - off));
      if (EVP_EncryptUpdate(ctx_->seal, dst + off, &len, plain[i] + off, n) != 1 || len != n) {
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

Status LaneCipher::Open(const std::vector<uint8_t*>& parts, const std::vector<size_t>& sizes) {
  if (parts.size() < 2 || parts.size() != sizes.size() || sizes.back() != kSealTagBytes ||
      sizes[0] < kSealedPrefixBytes || std::memcmp(parts[0], kSealedMagic, 4) != 0) {
    return DataLossError("not a sealed message (magic 'BPS1', a sequence number, a 16-byte tag)");
  }
  const uint64_t sequence = GetU64(parts[0] + 4);
  if (sequence != next_) {
    return FailedPreconditionError(
        fmt::format("sealed message number {} where number {} was next (replayed or out of order)",
                    sequence, next_));
  }
  auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  uint8_t nonce[12];
  Nonce(sequence, nonce);
  if (ctx_->open == nullptr) {
    ctx_->open = EVP_CIPHER_CTX_new();
    if (ctx_->open == nullptr ||
        EVP_DecryptInit_ex(ctx_->open, EVP_aes_256_gcm(), nullptr, key, nonce) != 1) {
      return InternalError("lane open: cannot set up AES-256-GCM");
    }
  } else if (EVP_DecryptInit_ex(ctx_->open, nullptr, nullptr, nullptr, nonce) != 1) {
    return InternalError("lane open: cannot set the nonce");
  }
  const std::vector<size_t> covered(sizes.begin(), sizes.end() - 1);
  const std::vector<uint8_t> aad = AssociatedData(sequence, covered);
  int len = 0;
  if (EVP_DecryptUpdate(ctx_->open, nullptr, &len, aad.data(), static_cast<int>(aad.size())) != 1) {
    return InternalError("lane open: associated data");
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const size_t skip = i == 0 ? kSealedPrefixBytes : 0;
    uint8_t* p = parts[i] + skip;
    const size_t size = sizes[i] - skip;
    for (size_t off = 0; off < size; off += kSlice) {
      const int n = static_cast<int>(std::min(kSlice, size - off));
      if (EVP_DecryptUpdate(ctx_->open, p + off, &len, p + off, n) != 1 || len != n) {
        return InternalError("lane open: decryption failed");
      }
    }
  }
  uint8_t final_block[16];
  if (EVP_CIPHER_CTX_ctrl(ctx_->open, EVP_CTRL_GCM_SET_TAG, kSealTagBytes, parts.back()) != 1 ||
      EVP_DecryptFinal_ex(ctx_->open, final_block, &len) != 1) {
    return FailedPreconditionError(fmt::format(
        "sealed message number {} does not verify under the lane's key (altered, or from "
        "another lane)",
        sequence));
  }
  ++next_;
  return Status::Ok();
}

namespace {

// An uninitialised byte buffer (a sealed part is written whole: zeroing it first would cost a
// pass over the bytes).
Buffer NewBuffer(size_t size, uint8_t** data) {
  std::shared_ptr<uint8_t[]> bytes(new uint8_t[size == 0 ? 1 : size]);
  *data = bytes.get();
  return Buffer::Borrow(bytes.get(), size, std::shared_ptr<const void>(bytes, bytes.get()));
}

}  // namespace

Status SealMessage(LaneCipher* lane, Message* m) {
  const size_t n = m->frames.size();
  if (n > UINT32_MAX - 2 || m->header.size() > UINT32_MAX) {
    return InvalidArgumentError(fmt::format("a message of {} frames and a {}-byte header", n,
                                            m->header.size()));
  }
  std::vector<uint8_t> envelope(kEnvelopeFixedBytes + m->header.size());
  EncodeEnvelope(m->header, static_cast<uint32_t>(n), envelope.data());
  std::vector<const uint8_t*> plain(n + 1);
  std::vector<size_t> sizes(n + 1);
  std::vector<uint8_t*> out(n + 1);
  std::vector<Buffer> sealed(n + 2);
  plain[0] = envelope.data();
  sizes[0] = envelope.size();
  sealed[0] = NewBuffer(kSealedPrefixBytes + envelope.size(), &out[0]);
  for (size_t i = 0; i < n; ++i) {
    plain[i + 1] = m->frames[i].data();
    sizes[i + 1] = m->frames[i].size();
    sealed[i + 1] = NewBuffer(sizes[i + 1], &out[i + 1]);
  }
  uint8_t* tag = nullptr;
  sealed[n + 1] = NewBuffer(kSealTagBytes, &tag);
  BP_RETURN_IF_ERROR(lane->Seal(plain, sizes, out, tag));
  m->header.clear();
  m->frames = std::move(sealed);
  return Status::Ok();
}

}  // namespace bitpush::transport::zmq_backend
