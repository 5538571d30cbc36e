// Transport: the one interface through which bitpush processes exchange messages, whatever the
// backend (common/transport/<backend>/). Control plane and data plane use the same transport
// type but different header messages (proto/bitpush/v1/control.proto).
//
// Model
//  - Every endpoint has a name (its PeerId, e.g. "server:0") and listens on one address
//    (`inproc://name`, `tcp://127.0.0.1:9000`, `tcp://127.0.0.1:0` for any free port,
//    `ipc:///tmp/x.sock`). `address()` returns the resolved address to advertise.
//  - Connect(peer, address) makes `peer` reachable by name; Send(peer, msg) queues `msg` and
//    returns at once. Messages to one peer arrive in the order they were sent (per-peer FIFO);
//    there is no order between different senders.
//  - Receive(timeout) returns the next message from any peer, with the sender's name, or
//    Timeout after `timeout` — every wait is bounded.
//  - Errors reach the owner as Status: Send to an unknown or disconnected peer fails at once;
//    failures discovered later (peer gone, send failed on the wire) are returned by the next
//    Receive as a TransportEvent, naming the peer. Malformed traffic (bytes that are not a
//    bitpush frame, a truncated message) is dropped and counted in stats(), never delivered.
//
// Backends: "inproc" (queues inside one process, through an InprocHub object that the
// endpoints of one in-process cluster share — no process-wide singleton) and "zmq" (ZeroMQ
// over tcp:// and ipc://, zero-copy sends of Buffer frames). Create them with CreateTransport,
// which picks the backend from the listen address's scheme (factory.h).
//
// Thread-safety: all methods may be called from any thread concurrently. Each backend owns
// its internal threads (see docs/threading.md); Receive may be called by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>

#include "common/status.h"
#include "common/transport/message.h"

namespace bitpush::transport {

using PeerId = std::string;

// Something that happened to a peer, reported in order with the messages.
struct TransportEvent {
  enum class Kind { kPeerConnected, kPeerDisconnected, kSendFailed };
  Kind kind;
  PeerId peer;
  Status status;  // why (for kPeerDisconnected / kSendFailed)
};

struct Received {
  PeerId from;
  // Either a message or an event about `from`.
  std::variant<Message, TransportEvent> body;

  bool is_message() const { return std::holds_alternative<Message>(body); }
  Message& message() { return std::get<Message>(body); }
  TransportEvent& event() { return std::get<TransportEvent>(body); }
};

struct TransportStats {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;  // header + frames
  uint64_t bytes_received = 0;
  uint64_t malformed_dropped = 0;  // frames/connections that were not valid bitpush traffic
  // Security (TransportSecurity): connections refused by authentication (zmq under kCurve: an
  // unknown key, or any failed handshake: another mechanism, bytes that are not ZMTP; ucx: a
  // HELLO whose token does not prove its name, or a token where the mode is kNone), messages
  // refused because a newer connection authenticated as the same node took over (ucx: the older
  // connections closed for it), connections shut because max_connections were open.
  uint64_t auth_refused = 0;
  uint64_t identity_refused = 0;
  uint64_t connections_refused = 0;
};

// How an endpoint proves who it is and learns who sent each message (docs/security.md).
//  - kNone: no proof. A message's sender is the name the connecting peer gives itself; anyone
//    who reaches the port can claim any name. For trusted networks and benchmarks.
//  - kCurve (zmq backend): ZeroMQ CURVE. Every connection is encrypted and authenticated with
//    the endpoints' key pairs; a connection is admitted only with a public key listed in
//    peer_keys, and every message it carries is reported as sent by the PeerId that key is
//    bound to, whatever name the peer gives itself. Connect(peer) expects the peer to prove
//    the key peer_keys lists for it.
//    (ucx backend): the first message of a connection names the sender and carries a token
//    only the holder of that name's key can compute (ucx/hello_auth.h); the listener admits
//    the connection only when the name is listed in peer_keys and the token matches. Messages
//    are not encrypted (docs/security.md "The ucx data plane").
// The inproc backend has no wire and ignores the mode.
struct TransportSecurity {
  enum class Mode { kNone, kCurve };
  Mode mode = Mode::kNone;
  // kCurve: this endpoint's key pair, Z85 text (40 characters each).
  std::string public_key;
  std::string secret_key;
  // kCurve: every node this endpoint may hear from or send to, PeerId -> public key (Z85).
  // Each key names exactly one PeerId.
  std::map<PeerId, std::string> peer_keys;
};

class InprocHub;

struct TransportOptions {
  // The backend ("inproc", "zmq"): "" = the one serving listen_address's scheme (factory.h);
  // when set, it must be that one.
  std::string backend;
  // This endpoint's name, unique in the cluster (e.g. "scheduler", "server:0", "worker:1").
  PeerId name;
  // Address to listen on. zmq: tcp://HOST:PORT (PORT 0 = any free port) or ipc://PATH;
  // inproc: inproc://NAME.
  std::string listen_address;
  // inproc only: the hub shared by the endpoints of one in-process cluster (required).
  std::shared_ptr<InprocHub> inproc_hub;
  // Bound on messages queued for one peer before Send blocks (backpressure), and on how long
  // it may block before failing with Unavailable.
  size_t max_queued_per_peer = 1024;
  std::chrono::milliseconds send_block_timeout{30000};
  TransportSecurity security;
  // Largest message part (header or frame) accepted from a peer; a peer that sends a larger
  // one is disconnected before its bytes are buffered. The node sets it from the
  // configuration (the largest legal frame). zmq under kCurve does not use it: messages travel
  // sealed in chunks of 1 MiB, its largest part (zmq/lane.h).
  uint64_t max_message_bytes = uint64_t{1} << 32;
  // Connections accepted at once; a connection beyond it is shut as soon as it is accepted
  // and counted in connections_refused.
  size_t max_connections = 1024;
  // ucx only: UCX configuration entries for this endpoint's UCP context, by name without the
  // UCX_ prefix (e.g. {"TLS", "tcp,self"}), applied with ucp_config_modify over what the UCX_*
  // environment variables set. Empty: UCX's defaults and the environment.
  std::map<std::string, std::string> ucx_config;
  // ucx only: how long a connection may go without the next message in its order while later
  // ones have arrived (the transport lost it, or a peer skipped it) before the receiver closes
  // it as broken, naming the missing message.
  std::chrono::milliseconds sequence_gap_timeout{10000};
  // ucx only: how long a message handed to UCX may go uncompleted (a peer that is alive but
  // takes nothing: stopped, or its transport thread stuck) before the sender closes that
  // connection, which ends every send on it and lets go of their frames, and reports the peer
  // disconnected. Bounds how long a sender's borrowed frames stay in use.
  std::chrono::milliseconds send_complete_timeout{60000};
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const PeerId& name() const = 0;
  // The address others connect to (resolved: the real port when 0 was asked).
  virtual std::string address() const = 0;

  // Makes `peer` (listening at `address`) reachable by name. Idempotent for the same address.
  Status Connect(const PeerId& peer, const std::string& address) {
    return Connect(peer, address, peer);
  }
  // The same, for a peer reached under another name (an alias) that must prove the identity
  // of `key_owner` (TransportSecurity::peer_keys[key_owner] under kCurve).
  virtual Status Connect(const PeerId& peer, const std::string& address,
                         const PeerId& key_owner) = 0;
  // Forgets `peer`; later sends to it fail with NotFound.
  virtual void Disconnect(const PeerId& peer) = 0;

  // Queues `msg` for `peer`; returns once the transport owns it (frames are not copied).
  virtual Status Send(const PeerId& peer, Message msg) = 0;

  // The next message or event, or Timeout naming this endpoint after `timeout`.
  virtual StatusOr<Received> Receive(std::chrono::milliseconds timeout) = 0;

  // Stops the backend's threads; pending Receive calls return Cancelled. Idempotent.
  virtual void Close() = 0;

  virtual TransportStats stats() const = 0;
};

// Creates, binds and starts an endpoint with the backend of the listen address's scheme
// (factory.cc). InvalidArgument for a bad address or unknown backend ("unknown transport
// backend 'x'; valid: inproc, zmq, ucx"); Unavailable if the address is in use or the backend
// cannot run here.
StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options);

// Shared state of the inproc endpoints of one in-process cluster.
std::shared_ptr<InprocHub> NewInprocHub();

}  // namespace bitpush::transport
