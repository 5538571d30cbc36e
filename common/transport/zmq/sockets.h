// ZeroMQ socket plumbing of the zmq backend: the limits every socket is given, the hand-over of
// Buffer frames to and from zmq_msg_t (zero-copy above kCopyBelowBytes), sending a message's
// parts, reading a socket monitor's events, and the checks and resolution of listen
// addresses. The endpoint (zmq_transport.h) uses them on the sockets it owns; nothing here
// owns a socket or any state.
//
// Thread-safety: the functions are pure or act only on the socket they are given, which the
// caller owns (ZeroMQ sockets are not thread-safe: in practice the endpoint's I/O thread, or
// Start and Connect before they hand a socket over). A MsgHolder may be released from any
// thread.
#pragma once

#include <zmq.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport/message.h"

namespace bitpush::transport::zmq_backend {

// How long Close() lets ZeroMQ flush messages already handed to a connected peer.
inline constexpr int kCloseLingerMs = 2000;
// Frames below this size are copied into / out of ZeroMQ messages: cheaper than the
// bookkeeping of a zero-copy hand-over.
inline constexpr size_t kCopyBelowBytes = 4096;
// Largest part a DEALER accepts: it never reads what its peer sends, so anything beyond the
// handshake is refused (a hostile listener cannot fill our memory through it).
inline constexpr int64_t kDealerMaxPartBytes = 64 * 1024;
// Largest part the main ROUTER accepts under kCurve (it carries only lane requests).
inline constexpr int64_t kCurveMaxPartBytes = 4 * 1024;
// How long a connection may take for the ZMTP greeting and security handshake.
inline constexpr int kHandshakeMs = 10000;
// A listener's accept queue (ZMQ_BACKLOG; listen.cc): room for every node of a large cluster
// connecting at once.
inline constexpr int kListenBacklog = 4096;
// The ZAP endpoint libzmq asks to authenticate CURVE clients (RFC 27), and our domain.
inline constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
inline constexpr char kZapDomain[] = "bitpush";

// The text of the calling thread's last ZeroMQ error.
std::string ZmqError();

// Whether `address` is tcp:// or ipc://.
bool HasScheme(const std::string& address);

void SetInt(void* socket, int option, int value);

// Owns one zmq_msg_t; a received Buffer keeps it alive instead of copying its bytes.
struct MsgHolder {
  MsgHolder() { zmq_msg_init(&msg); }
  ~MsgHolder() { zmq_msg_close(&msg); }
  MsgHolder(const MsgHolder&) = delete;
  MsgHolder& operator=(const MsgHolder&) = delete;
  zmq_msg_t msg;
};

// Offers `frames` to `socket` as the rest of a message (first_taken: its first part was
// already accepted) or as a whole message. 0 when sent; EAGAIN when ZeroMQ took nothing
// (retry later); another errno when the message was lost part-way.
int SendFrames(void* socket, const std::vector<Buffer>& frames, bool first_taken);

// Sends `m` as the envelope (framing.h) and its frames; returns as SendFrames.
int SendMessage(void* dealer, const Message& m);

// Reads one monitor event, if one waits: its event number, the endpoint address, and (when
// asked) its value (the connection's file descriptor for ACCEPTED and DISCONNECTED).
bool ReadMonitorEvent(void* monitor, uint16_t* event, std::string* endpoint,
                      uint32_t* value = nullptr);

// The address zmq_bind is given for `listen` (host names resolved; see the definition).
StatusOr<std::string> BindableAddress(const std::string& listen);

// Refuses an ipc:// path that a live process listens on (ZeroMQ would silently unlink it and
// steal the address); a stale socket file is fine.
Status CheckIpcPathFree(const std::string& address);

// A Z85 key (40 characters) as its 32 bytes; "" when it is not one.
std::string DecodeZ85Key(const std::string& z85);

}  // namespace bitpush::transport::zmq_backend
