// The zmq transport backend: ZeroMQ (libzmq, C API) over tcp:// and ipc://.
//
// Sockets. Each endpoint owns one ZeroMQ context (no process-wide context), binds one ROUTER
// socket on its listen address (receive only) and keeps one DEALER per Connect()ed peer (send
// only) whose routing id is this endpoint's name, so the receiving ROUTER reports the sender's
// name with every message. Two endpoints that talk both ways use two connections.
// Under security mode curve the DEALER is a CURVE client and the ROUTER a CURVE server, but they
// carry only the set-up of a sealed lane (lane.h): each endpoint also binds a lane ROUTER (PLAIN,
// admitted by one-time ticket) and keeps one lane DEALER per peer, and every message travels
// sealed (AES-256-GCM) on the lane.
//
// Threads. One I/O thread per endpoint owns every socket after creation (ZeroMQ sockets are
// not thread-safe) and sleeps in zmq_poll when idle; ZeroMQ adds its own I/O and reaper
// threads inside the context. Send() (any thread) appends to the peer's outbox and wakes the
// I/O thread through an eventfd; the I/O thread hands the message to the DEALER without copying
// payload frames (zmq_msg_init_data; the Buffer's owner stays alive until ZeroMQ releases it;
// under curve the I/O thread seals the frames into new buffers instead, and Receive opens
// received ones into new buffers).
// Received messages are parsed by the I/O thread (framing.h) into a bounded queue that
// Receive() waits on; frames larger than a few KiB are not copied on receipt either (the
// Buffer owns the zmq_msg_t). See docs/threading.md.
//
// Flow control. At most max_queued_per_peer messages wait in a peer's outbox (Send blocks up to
// send_block_timeout, then fails with Unavailable); ZeroMQ's send/receive high-water marks are
// set to the same bound, and the I/O thread stops reading the ROUTER while max_queued_per_peer
// received messages wait for Receive, so a slow receiver pushes back to its senders.
//
// Failures. A monitor on each DEALER reports the connection: when an established connection
// drops, the peer's queued messages are dropped, a kPeerDisconnected event names it, and sends
// fail with Unavailable until ZeroMQ reconnects (then a kPeerConnected event). A monitor on the
// ROUTER counts connections that fail the ZMTP handshake (raw bytes on the port) in
// malformed_dropped, as are messages that do not parse as bitpush frames.
//
// Thread-safety: as Transport (transport.h).
#pragma once

#include <memory>

#include "common/status.h"
#include "common/transport/transport.h"

namespace bitpush::transport::zmq_backend {

// Creates, binds and starts a zmq endpoint (options already validated by CreateTransport,
// except the address, checked here).
StatusOr<std::unique_ptr<Transport>> CreateZmqTransport(const TransportOptions& options);

}  // namespace bitpush::transport::zmq_backend
