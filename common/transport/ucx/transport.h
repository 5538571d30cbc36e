// The ucx transport backend: UCX (UCP, the client-server API with Active Messages) over
// `ucx://HOST:PORT` addresses, for the data plane where UCX finds a faster path than TCP
// sockets (shared memory and cross-memory attach on one host, RDMA between hosts).
//
// Objects. Each endpoint owns one UCP context (configured from TransportOptions::ucx_config on
// top of the UCX_* environment), one UCP worker, one listener bound to its listen address,
// one client UCP endpoint per Connect()ed peer (send) and one server UCP endpoint per accepted
// connection (receive). Nothing is process-wide: two endpoints in one process are two contexts.
//
// Threads. One progress thread per endpoint ("bp-ucx") owns the worker and every UCP object
// after creation (the worker is UCS_THREAD_MODE_SERIALIZED); it sleeps in epoll on the worker's
// event fd (ucp_worker_arm) and an eventfd that the other threads write, with a bounded timeout
// (reconnect timers). Send() (any thread) appends to the peer's outbox and wakes it; the
// progress thread sends with ucp_am_send_nbx, handing the frames to UCX as an iov (not copied;
// the Message stays alive until the send completes). Received messages wait in a queue that
// Receive() (one thread at a time) takes from. UCX adds its own async thread inside the
// context.
//
// Protocol (wire.h). The first Active Message on every connection is a HELLO naming the sender;
// the listener binds the connection to that name, reports every later message as from it, and
// grants credits: at most max_queued_per_peer of the receiver's messages travel or wait in
// its queue per connection, so a receiver that stops calling Receive stops its senders, whose
// Send then blocks (outbox full: max_queued_per_peer) for at most send_block_timeout and fails
// with Unavailable. Large messages go by rendezvous straight into one block allocated for
// them; the received frames are views of that block. Messages before the HELLO, malformed
// headers or layouts are dropped and counted in stats().malformed_dropped; a part above
// max_message_bytes is refused before its bytes are received, and its connection closed.
//
// Failures. UCP endpoints use UCP_ERR_HANDLING_MODE_PEER: when an established connection fails
// (the peer closed or died), a kPeerDisconnected event names the peer, its outbox is dropped,
// sends fail with Unavailable, and the progress thread reconnects (100 ms, doubling up to
// 1 s); the peer back is reported as kPeerConnected.
//
// Security (hello_auth.h). Under TransportSecurity::kCurve the HELLO carries a token that only
// the holder of the named node's CURVE key can compute (X25519 of the two nodes' keys, then
// HMAC-SHA256 over both names); the listener admits a connection only when the name has a key in
// peer_keys and the token matches, and otherwise closes it unheard, counted in
// stats().auth_refused. Under kNone the name is a claim, and a HELLO with a token (a kCurve peer)
// is refused the same way. The fabric is not encrypted (docs/security.md).
//
// Thread-safety: as Transport (transport.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/transport/transport.h"

namespace bitpush::transport::ucx_backend {

// Creates, binds and starts a ucx endpoint (options already validated by CreateTransport,
// except the address and, under kCurve, the keys: InvalidArgument naming the field).
StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options);

// What UCX chose for the connection from `t` (an endpoint made by CreateUcxTransport) to `peer`:
// the text ucp_ep_print_info prints for the client endpoint that sends to it, one line per lane
// ("lane[0]:  1:tcp/lo.0 md[1] ... am am_bw#0"; info.h ParseEpLanes reads it). UCX 1.13's
// ucp_ep_query does not report transports, so this is where they show. Answered by the
// endpoint's progress thread (which owns the UCP objects), within `timeout`. InvalidArgument
// when `t` is not a ucx endpoint; Unavailable while `peer` has no established connection.
StatusOr<std::string> DescribePeerEndpoint(Transport* t, const PeerId& peer,
                                           std::chrono::milliseconds timeout);

// OK where UCX can run here (a UCP context with Active Messages and wake-up can be created);
// otherwise why not.
Status UcxViable();

}  // namespace bitpush::transport::ucx_backend
