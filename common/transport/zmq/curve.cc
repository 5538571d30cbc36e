// What security mode curve adds to the zmq endpoint (zmq_transport.h): the keys, the ZAP
// handler that admits CURVE and lane connections, and both ends of the sealed-lane handshake
// (lane.h): the receiver issuing lanes, the sender asking for, opening and replacing them.
#include <openssl/crypto.h>
#include <zmq.h>

#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/transport/zmq/sockets.h"
#include "common/transport/zmq/zmq_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {

Status ZmqTransport::LoadCurveKeys() {
  const TransportSecurity& sec = options_.security;
  public_key_ = DecodeZ85Key(sec.public_key);
  secret_key_ = DecodeZ85Key(sec.secret_key);
  if (public_key_.empty() || secret_key_.empty()) {
    return InvalidArgumentError(Prefix() +
                                "security mode curve needs this endpoint's public and secret "
                                "keys as Z85 text of 40 characters");
  }
  char derived[41];
  if (zmq_curve_public(derived, sec.secret_key.c_str()) != 0 || sec.public_key != derived) {
    return InvalidArgumentError(Prefix() + "the secret key does not belong to the public key");
  }
  for (const auto& [peer, z85] : sec.peer_keys) {
    const std::string key = DecodeZ85Key(z85);
    if (key.empty()) {
      return InvalidArgumentError(
          Prefix() + fmt::format("the public key of '{}' is not Z85 text of 40 characters", peer));
    }
    auto [it, fresh] = key_names_.emplace(key, peer);
    if (!fresh) {
      return InvalidArgumentError(Prefix() + fmt::format("'{}' and '{}' have the same public key; "
                                                         "each node needs its own",
                                                         it->second, peer));
    }
  }
  return Status::Ok();
}

// The lane socket listens next to the main one: the same interface with a port the system
// picks (tcp), or the main path + ".lane" (ipc). Senders learn its address from the offer.
Status ZmqTransport::BindLaneRouter(const std::string& bind_address) {
  std::string lane_bind;
  if (bind_address.rfind("tcp://", 0) == 0) {
    lane_bind = bind_address.substr(0, bind_address.rfind(':')) + ":*";
  } else {
    lane_bind = bind_address + ".lane";
    Status s = CheckIpcPathFree(lane_bind);
    if (!s.ok()) return Status(s.code(), Prefix() + s.message());
  }
  lane_router_ = zmq_socket(ctx_, ZMQ_ROUTER);
  if (!lane_router_) return InternalError(Prefix() + "zmq_socket(ROUTER): " + ZmqError());
  SetInt(lane_router_, ZMQ_LINGER, 0);
  SetInt(lane_router_, ZMQ_ROUTER_HANDOVER, 0);
  SetInt(lane_router_, ZMQ_PLAIN_SERVER, 1);
  zmq_setsockopt(lane_router_, ZMQ_ZAP_DOMAIN, kZapDomain, sizeof(kZapDomain) - 1);
  // Sealed messages come in chunks (lane.h): no part above kLaneChunkBytes, before the
  // handshake or after.
  BP_RETURN_IF_ERROR(
      SetListenerOptions(lane_router_, kLaneChunkBytes, lane_bind, &lane_router_monitor_));
  if (zmq_bind(lane_router_, lane_bind.c_str()) != 0) {
    return UnavailableError(Prefix() + fmt::format("cannot listen on '{}' (the lane socket): {}",
                                                   lane_bind, ZmqError()));
  }
  char resolved[1024];
  size_t resolved_len = sizeof(resolved);
  if (zmq_getsockopt(lane_router_, ZMQ_LAST_ENDPOINT, resolved, &resolved_len) != 0) {
    return InternalError(Prefix() + "ZMQ_LAST_ENDPOINT: " + ZmqError());
  }
  lane_address_ = resolved;
  return Status::Ok();
}

void ZmqTransport::CloseLane(IoPeer* p) {
  watch_.Remove(p->lane_monitor);
  watch_.Remove(p->lane);
  if (p->lane_monitor) zmq_close(p->lane_monitor);
  if (p->lane) zmq_close(p->lane);  // lingers like the dealer
  p->lane = p->lane_monitor = nullptr;
  p->lane_up = false;
  p->lane_cipher.reset();
}

void ZmqTransport::RequestLane(const PeerId& name, IoPeer* p) {
  if (p->lane_requested || !p->control_up) return;
  const std::string request = EncodeLaneRequest(p->lane_request + 1);
  if (zmq_send(p->dealer, request.data(), request.size(), ZMQ_DONTWAIT) < 0) {
    BP_LOG_DEBUG("{}asking '{}' for a lane: {}; asking again when the connection is back", Prefix(),
                 name, ZmqError());
    return;
  }
  ++p->lane_request;
  p->lane_requested = true;
  watch_.MarkDue(name);  // the send drained the dealer's mailbox (socket_watch.h)
}

void ZmqTransport::ReadDealer(const PeerId& name, IoPeer* p) {
  while (true) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, p->dealer, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      return;
    }
    const bool single = !zmq_msg_more(&m);
    StatusOr<LaneOffer> offer =
        ParseLaneOffer(static_cast<const uint8_t*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    zmq_msg_close(&m);
    if (!single) {  // drain the rest: not from a bitpush node
      int more = 1;
      size_t more_size = sizeof(more);
      while (more && zmq_getsockopt(p->dealer, ZMQ_RCVMORE, &more, &more_size) == 0 && more) {
        zmq_msg_init(&m);
        const int got = zmq_msg_recv(&m, p->dealer, ZMQ_DONTWAIT);
        zmq_msg_close(&m);
        if (got < 0) break;
      }
    }
    if (single && offer.ok() && offer->request != p->lane_request) continue;  // superseded
    if (!single || !offer.ok() || !p->lane_requested) {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped an unexpected message from '{}' on its CURVE connection", Prefix(),
                   name);
      continue;
    }
    OpenLane(name, p, *offer);
  }
}

void ZmqTransport::OpenLane(const PeerId& name, IoPeer* p, const LaneOffer& offer) {
  p->lane_requested = false;
  CloseLane(p);
  StatusOr<std::string> address = LaneAddressFor(p->shared->address, offer.address);
  if (!address.ok()) {
    BP_LOG_WARN("{}'{}' offered a lane this node cannot reach: {}", Prefix(), name,
                address.status().message());
    return;
  }
  void* lane = zmq_socket(ctx_, ZMQ_DEALER);
  if (!lane) {
    BP_LOG_WARN("{}a lane to '{}': zmq_socket(DEALER): {}", Prefix(), name, ZmqError());
    return;
  }
  const std::string password = TicketPassword(offer.ticket);
  zmq_setsockopt(lane, ZMQ_PLAIN_USERNAME, options_.name.data(), options_.name.size());
  zmq_setsockopt(lane, ZMQ_PLAIN_PASSWORD, password.data(), password.size());
  SetSenderOptions(lane, *address);
  void* monitor = nullptr;
  Status s = OpenMonitor(lane,
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                         &monitor);
  if (s.ok() && zmq_connect(lane, address->c_str()) != 0) {
    s = UnavailableError(fmt::format("connect to '{}': {}", *address, ZmqError()));
  }
  if (!s.ok()) {
    if (monitor) zmq_close(monitor);
    SetInt(lane, ZMQ_LINGER, 0);
    zmq_close(lane);
    BP_LOG_WARN("{}a lane to '{}': {}", Prefix(), name, s.message());
    return;
  }
  p->lane = lane;
  p->lane_monitor = monitor;
  p->lane_cipher = std::make_unique<LaneCipher>(offer.key);
  Watch(name, lane);
  Watch(name, monitor);
}

void ZmqTransport::ReadLaneMonitor(const PeerId& name, IoPeer* p) {
  uint16_t event;
  std::string endpoint;
  while (p->lane_monitor != nullptr && ReadMonitorEvent(p->lane_monitor, &event, &endpoint)) {
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      p->lane_up = true;
      PeerUp(name, p);
      continue;
    }
    // The lane is gone (dropped, or its ticket refused): its ticket is spent, so ZeroMQ must
    // not reconnect with it. Messages already handed to it are lost (PeerDown says so), and a
    // new lane is asked for over the CURVE connection.
    if (event != ZMQ_EVENT_DISCONNECTED) {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow("lane:" + name, &suppressed)) {
        BP_LOG_WARN(
            "{}'{}' refused this node's lane connection at {} (event {:#x}); asking for "
            "a new lane{}",
            Prefix(), name, endpoint, event,
            suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
      }
    }
    const bool was_up = p->lane_up;
    CloseLane(p);
    if (was_up) PeerDown(name, p);
    RequestLane(name, p);
    return;
  }
}

void ZmqTransport::IssueLane(const PeerId& from, const std::string& routing_id, uint64_t request) {
  StatusOr<std::string> key = RandomBytes(kLaneKeyBytes);
  StatusOr<std::string> ticket = RandomBytes(kLaneTicketBytes);
  if (!key.ok() || !ticket.ok()) {
    BP_LOG_ERROR("{}no lane for '{}': {}", Prefix(), from,
                 (key.ok() ? ticket.status() : key.status()).message());
    return;
  }
  LaneIn& in = lanes_in_[from];  // replaces an earlier lane of the same sender
  in.ticket = *ticket;
  in.ticket_used = false;
  in.rx = std::make_shared<LaneRx>(*key);
  LaneOffer offer;
  offer.request = request;
  offer.key = *key;
  offer.ticket = *ticket;
  offer.address = lane_address_;
  const std::string text = EncodeLaneOffer(offer);
  // Unroutable (the connection went meanwhile): ZeroMQ drops it, and the sender asks again.
  if (zmq_send(router_, routing_id.data(), routing_id.size(), ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0 ||
      zmq_send(router_, text.data(), text.size(), ZMQ_DONTWAIT) < 0) {
    BP_LOG_DEBUG("{}the lane offer to '{}' was not sent: {}", Prefix(), from, ZmqError());
  }
}

PeerId ZmqTransport::LaneSenderOf(zmq_msg_t* first_part) {
  const char* user = zmq_msg_gets(first_part, "User-Id");
  if (user == nullptr || lanes_in_.count(user) == 0) {  // cannot happen behind our ZAP handler
    auth_refused_.fetch_add(1, std::memory_order_relaxed);
    return "";
  }
  return user;
}

void ZmqTransport::AnswerZap() {
  while (true) {
    std::vector<std::string> frames;
    bool more = true;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        if (frames.empty()) return;
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    // RFC 27: version, request id, domain, address, routing id, mechanism, credentials.
    const std::string version = frames.size() > 0 ? frames[0] : "1.0";
    const std::string request_id = frames.size() > 1 ? frames[1] : "";
    const std::string address = frames.size() > 3 ? frames[3] : "?";
    std::string status = "400", text, user;
    if (frames.size() >= 8 && frames[5] == "PLAIN") {
      // A lane connection (lane.h step 3): a ticket issued and not used yet. It names the
      // sender (the PLAIN user name is only what the sender calls itself).
      auto it = lanes_in_.begin();
      for (; it != lanes_in_.end(); ++it) {
        const std::string expected = TicketPassword(it->second.ticket);
        if (!it->second.ticket_used && frames[7].size() == expected.size() &&
            CRYPTO_memcmp(frames[7].data(), expected.data(), expected.size()) == 0) {
          break;
        }
      }
      if (it != lanes_in_.end()) {
        it->second.ticket_used = true;
        status = "200";
        text = "OK";
        user = it->first;
      } else {
        text = "a lane connection without a valid ticket";
      }
    } else if (frames.size() >= 7 && frames[5] == "CURVE" && frames[6].size() == 32) {
      auto it = key_names_.find(frames[6]);
      if (it != key_names_.end()) {
        status = "200";
        text = "OK";
        user = it->second;
      } else {
        char z85[41] = {};
        zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(frames[6].data()), 32);
        text = fmt::format("public key {} is not in the cluster's key list", z85);
      }
    } else {
      text = "not a CURVE request";
    }
    if (status != "200") {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow("address:" + address, &suppressed)) {
        BP_LOG_WARN("{}refused a connection from {}: {}{}", Prefix(), address, text,
                    suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
      }
    }
    const std::string reply[] = {version, request_id, status, text, user, ""};
    for (size_t i = 0; i < 6; ++i) {
      zmq_send(zap_, reply[i].data(), reply[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
    }
  }
}

}  // namespace bitpush::transport::zmq_backend
