#include "common/transport/ucx/hello_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <zmq.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

constexpr size_t kKeyBytes = 32;
constexpr size_t kZ85KeyChars = 40;

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;

const auto* Bytes(const std::string& s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

Pkey PrivateKey(const std::string& secret) {
  return Pkey(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, Bytes(secret), kKeyBytes));
}

// The public key that belongs to a raw X25519 secret key; "" when OpenSSL refuses it.
std::string PublicKeyOf(const std::string& secret) {
  Pkey key = PrivateKey(secret);
  std::string out(kKeyBytes, '\0');
  size_t length = out.size();
  if (!key ||
      EVP_PKEY_get_raw_public_key(key.get(), reinterpret_cast<unsigned char*>(out.data()),
                                  &length) != 1 ||
      length != kKeyBytes) {
    return "";
  }
  return out;
}

// Wipes a secret held in a string once it is no longer needed.
struct Wipe {
  std::string* s;
  ~Wipe() { OPENSSL_cleanse(s->data(), s->size()); }
};

}  // namespace

StatusOr<std::string> DecodeCurveKey(const std::string& z85, const std::string& field) {
  if (z85.empty()) return InvalidArgumentError(fmt::format("{} is empty", field));
  // zmq_z85_decode reads up to the first NUL: a NUL inside would decode a shorter key.
  if (z85.size() != kZ85KeyChars || z85.find('\0') != std::string::npos) {
    return InvalidArgumentError(
        fmt::format("{} is {} characters long; a Curve25519 key in Z85 is {}", field, z85.size(),
                    kZ85KeyChars));
  }
  std::string out(kKeyBytes, '\0');
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(out.data()), z85.c_str()) == nullptr) {
    return InvalidArgumentError(fmt::format("{} is not Z85 text", field));
  }
  return out;
}

StatusOr<std::string> PairSecret(const std::string& secret, const std::string& peer_public) {
  if (secret.size() != kKeyBytes || peer_public.size() != kKeyBytes) {
    return InvalidArgumentError(fmt::format("X25519 needs 32-byte keys, got {} and {} bytes",
                                            secret.size(), peer_public.size()));
  }
  Pkey own = PrivateKey(secret);
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, Bytes(peer_public), kKeyBytes));
  if (!own || !peer) return InternalError("OpenSSL refused a raw X25519 key");
  PkeyCtx ctx(EVP_PKEY_CTX_new(own.get(), nullptr));
  std::string out(kKeyBytes, '\0');
  size_t length = out.size();
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 ||
      EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &length) != 1 ||
      length != kKeyBytes) {
    // OpenSSL refuses a public key of low order (the shared secret would be all zeros).
    return InvalidArgumentError("X25519 refuses the public key (a point of low order)");
  }
  return out;
}

StatusOr<std::string> HelloToken(const std::string& pair_secret, const PeerId& from,
                                 const PeerId& to) {
  if (pair_secret.size() != kKeyBytes) {
    return InvalidArgumentError(
        fmt::format("a pair secret of {} bytes, expected {}", pair_secret.size(), kKeyBytes));
  }
  for (const PeerId* name : {&from, &to}) {
    if (name->empty() || name->find('\0') != std::string::npos) {
      return InvalidArgumentError(
          fmt::format("the HELLO token needs names that are not empty and contain no NUL; "
                      "got '{}' ({} bytes)",
                      *name, name->size()));
    }
  }
  std::string input = kHelloTokenLabel;
  input += from;
  input.push_back('\0');
  input += to;
  std::string out(kHelloTokenBytes, '\0');
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), pair_secret.data(), static_cast<int>(pair_secret.size()), Bytes(input),
           input.size(), reinterpret_cast<unsigned char*>(out.data()), &length) == nullptr ||
      length != kHelloTokenBytes) {
    return InternalError("HMAC-SHA256 failed");
  }
  return out;
}

StatusOr<std::string> HelloTokenFromKeys(const std::string& own_secret,
                                         const std::string& peer_public, const PeerId& from,
                                         const PeerId& to) {
  BP_ASSIGN_OR_RETURN(std::string secret, DecodeCurveKey(own_secret, "own_secret"));
  Wipe wipe_secret{&secret};
  BP_ASSIGN_OR_RETURN(std::string pub, DecodeCurveKey(peer_public, "peer_public"));
  StatusOr<std::string> shared = PairSecret(secret, pub);
  if (!shared.ok()) {
    return Status(shared.status().code(), "peer_public: " + shared.status().message());
  }
  Wipe wipe_shared{&*shared};
  return HelloToken(*shared, from, to);
}

StatusOr<HelloAuth> HelloAuth::Create(const PeerId& self, const TransportSecurity& security) {
  constexpr char kPrefix[] = "security mode curve: ";
  auto invalid = [&](const Status& s) { return InvalidArgumentError(kPrefix + s.message()); };
  if (self.empty() || self.find('\0') != std::string::npos) {
    return InvalidArgumentError(
        fmt::format("{}the endpoint name must not be empty or contain NUL", kPrefix));
  }
  StatusOr<std::string> pub = DecodeCurveKey(security.public_key, "security.public_key");
  if (!pub.ok()) return invalid(pub.status());
  StatusOr<std::string> secret = DecodeCurveKey(security.secret_key, "security.secret_key");
  if (!secret.ok()) return invalid(secret.status());
  Wipe wipe_secret{&*secret};
  if (PublicKeyOf(*secret) != *pub) {
    return InvalidArgumentError(
        fmt::format("{}security.secret_key does not belong to security.public_key", kPrefix));
  }
  if (security.peer_keys.empty()) {
    return InvalidArgumentError(
        fmt::format("{}security.peer_keys is empty; it lists the public key of every node this "
                    "endpoint may hear from or send to",
                    kPrefix));
  }
  HelloAuth auth;
  auth.self_ = self;
  std::map<std::string, PeerId> owners;  // raw public key -> the node it is listed for
  for (const auto& [peer, z85] : security.peer_keys) {
    const std::string field = fmt::format("security.peer_keys['{}']", peer);
    if (peer.empty() || peer.find('\0') != std::string::npos) {
      return InvalidArgumentError(
          fmt::format("{}{}: a node name must not be empty or contain NUL", kPrefix, field));
    }
    StatusOr<std::string> key = DecodeCurveKey(z85, field);
    if (!key.ok()) return invalid(key.status());
    auto [it, fresh] = owners.emplace(*key, peer);
    if (!fresh) {
      return InvalidArgumentError(fmt::format(
          "{}security.peer_keys: '{}' and '{}' have the same public key; each node needs its own",
          kPrefix, it->second, peer));
    }
    StatusOr<std::string> shared = PairSecret(*secret, *key);
    if (!shared.ok()) {
      return InvalidArgumentError(
          fmt::format("{}{}: {}", kPrefix, field, shared.status().message()));
    }
    Wipe wipe_shared{&*shared};
    BP_ASSIGN_OR_RETURN(auth.to_[peer], HelloToken(*shared, self, peer));
    BP_ASSIGN_OR_RETURN(auth.from_[peer], HelloToken(*shared, peer, self));
  }
  return auth;
}

StatusOr<std::string> HelloAuth::TokenTo(const PeerId& key_owner) const {
  auto it = to_.find(key_owner);
  if (it == to_.end()) {
    return NotFoundError(fmt::format("no public key for '{}' in security.peer_keys", key_owner));
  }
  return it->second;
}

HelloAuth::Verdict HelloAuth::Check(const PeerId& claimed, const std::string& token) const {
  auto it = from_.find(claimed);
  if (it == from_.end()) return Verdict::kUnknownNode;
  if (token.empty()) return Verdict::kMissingToken;
  if (token.size() != it->second.size() ||
      CRYPTO_memcmp(token.data(), it->second.data(), token.size()) != 0) {
    return Verdict::kBadToken;
  }
  return Verdict::kAccepted;
}

const char* HelloAuth::Describe(Verdict verdict) {
  switch (verdict) {
    case Verdict::kAccepted: return "accepted";
    case Verdict::kUnknownNode: return "unknown node";
    case Verdict::kMissingToken: return "missing token";
    case Verdict::kBadToken: return "bad token";
  }
  return "?";
}

}  // namespace bitpush::transport::ucx_backend
