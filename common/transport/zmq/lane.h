// Sealed lanes: how the zmq backend carries messages under security mode curve without paying
// for CURVE's cipher on every payload byte (docs/security.md "What encryption costs").
//
// A lane is one direction of traffic, sender -> receiver, with its own AES-256-GCM key:
//  1. The sender's CURVE connection (authenticated and encrypted by ZeroMQ) carries a lane
//     request ("BPLQ" | u64 request number) to the receiver.
//  2. The receiver answers on the same CURVE connection with an offer ("BPLO"): the request
//     number, a fresh random key, a fresh random one-time ticket and the address of its lane
//     socket; the lane replaces any earlier one of that sender. Only the holder of the sender's
//     secret key can have asked, and only it can read the answer; it takes only the answer to
//     its latest request.
//  3. The sender connects to the lane socket with ZeroMQ's PLAIN mechanism, the ticket as
//     password (the user name is only what it calls itself). The receiver's ZAP handler admits
//     a lane connection only with a ticket it issued and has not seen used, so nobody else gets
//     past the handshake, and binds the connection to the node it issued the ticket to.
//  4. Every message on the lane is sealed: AES-256-GCM under the lane's key with the message's
//     sequence number (0, 1, 2, ... per lane) as nonce, authenticating the sequence number and
//     the size of every part. The receiver opens only the next sequence number, so a message
//     cannot be forged, altered, replayed, reordered or moved to another lane.
//
// On the wire (the parts after the routing id the receiving ROUTER prepends), little-endian:
//
//   part 0      "BPS1" | u64 sequence | u64 n | u64 size[n]   (clear; the GCM associated data)
//   chunks      each of the n sealed parts (the envelope of framing.h, then the payload frames)
//               as ceil(size / kLaneChunkBytes) ZeroMQ parts: kLaneChunkBytes each, the last
//               one the remainder (an empty part has none)
//   last part   the 16-byte GCM tag
//
// No ZeroMQ part exceeds kLaneChunkBytes (nor part 0, for n < 131070), so a lane socket
// accepts parts of at most 1 MiB: a peer that has not completed the handshake can make a node
// hold no more than that.
//
// Thread-safety: a LaneCipher is used by one thread at a time (the sending transport's I/O
// thread; the receiving transport's thread in Receive); the free functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport/message.h"

namespace bitpush::transport::zmq_backend {

inline constexpr char kLaneRequestMagic[4] = {'B', 'P', 'L', 'Q'};
inline constexpr char kLaneOfferMagic[4] = {'B', 'P', 'L', 'O'};
inline constexpr char kSealedMagic[4] = {'B', 'P', 'S', '1'};
inline constexpr size_t kLaneKeyBytes = 32;
inline constexpr size_t kLaneTicketBytes = 16;
inline constexpr size_t kSealTagBytes = 16;
inline constexpr size_t kLaneChunkBytes = size_t{1} << 20;
inline constexpr size_t kLaneRequestBytes = 12;  // magic + request number

// What a receiver tells a sender about the lane it opens for it.
struct LaneOffer {
  uint64_t request = 0;
  std::string key;      // kLaneKeyBytes
  std::string ticket;   // kLaneTicketBytes
  std::string address;  // the receiver's lane socket as it resolved it (tcp://IP:PORT, ipc://PATH)
};

// `bytes` random bytes from the operating system's CSPRNG (OpenSSL RAND_bytes).
StatusOr<std::string> RandomBytes(size_t bytes);

std::string EncodeLaneRequest(uint64_t request);
// The request number of a lane request; DataLoss if it is not one.
StatusOr<uint64_t> ParseLaneRequest(const uint8_t* data, size_t size);
std::string EncodeLaneOffer(const LaneOffer& offer);
StatusOr<LaneOffer> ParseLaneOffer(const uint8_t* data, size_t size);

// Where the sender reaches a lane socket: the host it reaches the receiver's main socket at
// (`peer_address`, the address it was given) with the port of `lane_address` (tcp); the lane
// address itself for ipc. InvalidArgument when the two do not fit together.
StatusOr<std::string> LaneAddressFor(const std::string& peer_address,
                                     const std::string& lane_address);

// The password of the PLAIN handshake for a ticket (lowercase hex).
std::string TicketPassword(const std::string& ticket);

// One direction of one lane: seals (sender) or opens (receiver) its messages in order.
class LaneCipher {
 public:
  // `key`: kLaneKeyBytes.
  explicit LaneCipher(const std::string& key);
  ~LaneCipher();
  LaneCipher(const LaneCipher&) = delete;
  LaneCipher& operator=(const LaneCipher&) = delete;

  // The sequence number the next Seal uses / the next Open expects.
  uint64_t next_sequence() const { return next_; }

  // Seals the next message: `plain` are its parts (the envelope, then the frames); `out[i]`
  // receives the ciphertext of part i (the same size), `prefix` part 0 of the wire format and
  // `tag` kSealTagBytes. Advances the sequence.
  Status Seal(const std::vector<ByteSpan>& plain, const std::vector<uint8_t*>& out,
              std::string* prefix, uint8_t* tag);

  // Opens the next message from its wire parts (after the routing id: the prefix, the chunks,
  // the tag) into new buffers, one per sealed part (the envelope first). On success the
  // sequence advances; otherwise nothing advances and the error says why (DataLoss: not a
  // sealed message; FailedPrecondition: a sequence number other than the next, or the tag does
  // not verify).
  StatusOr<std::vector<Buffer>> Open(const std::vector<ByteSpan>& wire);

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  std::string key_;
  uint64_t next_ = 0;
};

// Seals `m` (header and frames) as the next message of `lane`: afterwards m->header is empty
// and m->frames are its wire parts (the prefix, the chunks — slices of one new buffer per sealed
// part — and the tag); the plain buffers are released.
Status SealMessage(LaneCipher* lane, Message* m);

}  // namespace bitpush::transport::zmq_backend
