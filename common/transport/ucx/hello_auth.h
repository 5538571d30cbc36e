// The ucx backend's HELLO authentication under TransportSecurity::Mode::kCurve
// (docs/transport-ucx.md "Authentication", docs/security.md): a token that proves the sender of a
// HELLO holds the CURVE key of the node it names, computed by both ends from keys they already
// hold, so it costs no extra round trip.
//
//   pair secret      = X25519(own secret key, peer's public key)   (the same at both ends)
//   token(a -> b)    = HMAC-SHA256(pair secret, "bitpush-ucx-hello-v1" || a || 0x00 || b)
//
// `a` is the sender's PeerId and `b` the receiver's, so a token is bound to one direction of one
// pair of nodes: token(a -> b) is of no use for b -> a, for c -> b or for a -> c. It is the same
// for every connection of that pair (there is no nonce): whoever can read the fabric can replay
// it, which docs/security.md states as the limit of what it proves.
//
// HelloAuth is one endpoint's view, built (and its TransportSecurity validated) once at creation:
// the token it presents to each node and the token it expects from each. Immutable after Create;
// its const methods are thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "common/status.h"
#include "common/transport/transport.h"

namespace bitpush::transport::ucx_backend {

inline constexpr size_t kHelloTokenBytes = 32;  // HMAC-SHA256
inline constexpr char kHelloTokenLabel[] = "bitpush-ucx-hello-v1";

// The 32 bytes of a Curve25519 key written as Z85 text (40 characters). InvalidArgument naming
// `field` (e.g. "security.public_key") when it is empty, of another length or not Z85.
StatusOr<std::string> DecodeCurveKey(const std::string& z85, const std::string& field);

// X25519(secret, peer_public), both raw 32-byte keys: the secret the two key holders share.
// InvalidArgument when a key is not 32 bytes or X25519 refuses the public key (a point of low
// order, whose shared secret would be all zeros).
StatusOr<std::string> PairSecret(const std::string& secret, const std::string& peer_public);

// token(from -> to) from a pair secret (32 bytes). InvalidArgument when the secret is not 32
// bytes or a name is empty or contains NUL (the separator: names with NUL would make two pairs
// of names one input).
StatusOr<std::string> HelloToken(const std::string& pair_secret, const PeerId& from,
                                 const PeerId& to);

// token(from -> to) from Z85 keys: `own_secret` is the secret key of the end that computes it,
// `peer_public` the public key of the other end (from computes it with its secret and to's
// public key, to with its secret and from's public key). InvalidArgument naming the key that is
// not a Curve25519 key in Z85 ("own_secret", "peer_public").
StatusOr<std::string> HelloTokenFromKeys(const std::string& own_secret,
                                         const std::string& peer_public, const PeerId& from,
                                         const PeerId& to);

class HelloAuth {
 public:
  // Validates `security` for kCurve (this endpoint's key pair and peer_keys, every error naming
  // the field) and computes the tokens for every node in peer_keys.
  static StatusOr<HelloAuth> Create(const PeerId& self, const TransportSecurity& security);

  // The token this endpoint presents in a HELLO to `key_owner`; NotFound when peer_keys lists no
  // key for it.
  StatusOr<std::string> TokenTo(const PeerId& key_owner) const;

  // Why a HELLO was refused, or kAccepted.
  enum class Verdict { kAccepted, kUnknownNode, kMissingToken, kBadToken };
  // Whether a HELLO that claims the name `claimed` and carries `token` came from the holder of
  // claimed's key (a constant-time comparison with token(claimed -> self)).
  Verdict Check(const PeerId& claimed, const std::string& token) const;
  // "unknown node", "missing token", "bad token" (for logs).
  static const char* Describe(Verdict verdict);

 private:
  HelloAuth() = default;

  PeerId self_;
  std::map<PeerId, std::string> to_;    // token(self -> peer)
  std::map<PeerId, std::string> from_;  // token(peer -> self)
};

}  // namespace bitpush::transport::ucx_backend
