// Receiving (zmq_transport.h): the I/O thread reads the ROUTERs, parses messages (framing.h)
// into the inbox and counts connections; Receive's thread opens sealed messages (lane.h).
#include <sys/socket.h>
#include <zmq.h>

#include <cerrno>
#include <deque>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/transport/zmq/framing.h"
#include "common/transport/zmq/sockets.h"
#include "common/transport/zmq/zmq_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {
namespace {

// Messages taken from the ROUTER per wake-up before looking at other sockets.
constexpr int kReceiveBatch = 256;

// Whether a message received by the ROUTER is bitpush traffic (see framing.h).
Status CheckMessage(const PeerId& from, std::deque<zmq_msg_t>& parts, const uint8_t** header,
                    size_t* header_bytes) {
  // ZeroMQ names peers that set no routing id "\0" + 4 bytes: not a bitpush endpoint.
  if (from.empty() || from[0] == '\0') {
    return DataLossError("the sender has no name (no ZMQ_ROUTING_ID)");
  }
  if (parts.empty()) return DataLossError("no envelope");
  return ParseEnvelope(static_cast<const uint8_t*>(zmq_msg_data(&parts[0])),
                       zmq_msg_size(&parts[0]), parts.size() - 1, header, header_bytes);
}

}  // namespace

void ZmqTransport::ReadRouter(bool lane) {
  void* const socket = lane ? lane_router_ : router_;
  const size_t room = inbox_.Room();
  std::vector<Incoming> batch;
  std::deque<zmq_msg_t> parts;  // a deque: zmq_msg_t must not be moved by memcpy
  while (batch.size() < room && batch.size() < static_cast<size_t>(kReceiveBatch)) {
    zmq_msg_t id;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, socket, ZMQ_DONTWAIT) < 0) {
      const int err = zmq_errno();
      zmq_msg_close(&id);
      if (err != EAGAIN) BP_LOG_WARN("{}receive: {}", Prefix(), zmq_strerror(err));
      break;
    }
    const PeerId routing_id(static_cast<const char*>(zmq_msg_data(&id)), zmq_msg_size(&id));
    bool more = zmq_msg_more(&id);
    zmq_msg_close(&id);
    while (more) {
      parts.emplace_back();
      zmq_msg_init(&parts.back());
      if (zmq_msg_recv(&parts.back(), socket, ZMQ_DONTWAIT) < 0) break;  // not for a ROUTER
      more = zmq_msg_more(&parts.back());
    }
    PeerId from = parts.empty() ? routing_id
                  : lane        ? LaneSenderOf(&parts[0])
                                : SenderOf(routing_id, &parts[0]);
    const uint8_t* header = nullptr;
    size_t header_bytes = 0;
    // Under kCurve the main socket carries lane requests, the lane socket sealed messages:
    // Receive opens those (OpenIncoming).
    Status parsed = Status::Ok();
    bool handled = from.empty() && curve_;  // refused and counted by (Lane)SenderOf
    if (!handled && curve_ && !lane && !parts.empty() &&
        zmq_msg_size(&parts[0]) == kLaneRequestBytes) {
      StatusOr<uint64_t> request = ParseLaneRequest(
          static_cast<const uint8_t*>(zmq_msg_data(&parts[0])), zmq_msg_size(&parts[0]));
      if (request.ok() && parts.size() == 1) {
        IssueLane(from, routing_id, *request);
        handled = true;
      }
    }
    if (!handled && lane) {
      Incoming in;
      in.r.from = from;
      in.lane = lanes_in_.at(in.r.from).rx;
      in.fd = zmq_msg_get(&parts[0], ZMQ_SRCFD);
      in.sealed.reserve(parts.size());
      for (zmq_msg_t& part : parts) {
        in.sealed.push_back(std::make_shared<MsgHolder>());
        zmq_msg_move(&in.sealed.back()->msg, &part);
      }
      batch.push_back(std::move(in));
      handled = true;
    } else if (!handled) {
      parsed = CheckMessage(from, parts, &header, &header_bytes);
    }
    if (handled) {
      // Nothing to deliver.
    } else if (!parsed.ok()) {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped a malformed message from '{}': {}", Prefix(), from, parsed.message());
    } else {
      Message m;
      m.header.assign(reinterpret_cast<const char*>(header), header_bytes);
      m.frames.reserve(parts.size() - 1);
      uint64_t bytes = header_bytes;
      for (size_t i = 1; i < parts.size(); ++i) {
        const size_t size = zmq_msg_size(&parts[i]);
        bytes += size;
        if (size == 0) {
          m.frames.emplace_back();
        } else if (size < kCopyBelowBytes) {
          m.frames.push_back(Buffer::Copy(zmq_msg_data(&parts[i]), size));
        } else {
          auto holder = std::make_shared<MsgHolder>();
          zmq_msg_move(&holder->msg, &parts[i]);
          const void* data = zmq_msg_data(&holder->msg);
          m.frames.push_back(Buffer::Borrow(data, size, std::move(holder)));
        }
      }
      messages_received_.fetch_add(1, std::memory_order_relaxed);
      bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
      batch.push_back(Incoming{Received{std::move(from), std::move(m)}});
    }
    for (zmq_msg_t& p : parts) zmq_msg_close(&p);
    parts.clear();
  }
  inbox_.PushMessages(&batch);
}

PeerId ZmqTransport::SenderOf(const PeerId& routing_id, zmq_msg_t* first_part) {
  if (!curve_) return routing_id;
  const char* user = zmq_msg_gets(first_part, "User-Id");
  if (user == nullptr || *user == '\0') {  // cannot happen behind our ZAP handler
    auth_refused_.fetch_add(1, std::memory_order_relaxed);
    return "";
  }
  PeerId id(user);
  const int fd = zmq_msg_get(first_part, ZMQ_SRCFD);
  auto bound = bound_fd_.find(id);
  if (bound != bound_fd_.end() && bound->second == fd) return id;
  if (superseded_fds_.count(fd) != 0) {
    // File descriptors are reused: a waiting disconnect may free this one.
    ReadRouterMonitor(router_monitor_, false);
  }
  if (superseded_fds_.count(fd) != 0) {
    identity_refused_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("identity:" + id, &suppressed)) {
      BP_LOG_WARN(
          "{}refused a message from an older connection of '{}': a newer connection "
          "authenticated with the same key took over{}",
          Prefix(), id,
          suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    return "";
  }
  bound = bound_fd_.find(id);
  if (bound != bound_fd_.end() && bound->second >= 0) {
    superseded_fds_.insert(bound->second);
    BP_LOG_INFO(
        "{}'{}' speaks through a new connection, authenticated with the same key; its "
        "older connection is no longer heard",
        Prefix(), id);
  }
  bound_fd_[id] = fd;
  return id;
}

Status ZmqTransport::OpenIncoming(Incoming* in) {
  LaneRx& rx = *in->lane;
  const PeerId& from = in->r.from;
  std::vector<ByteSpan> wire(in->sealed.size());
  for (size_t i = 0; i < in->sealed.size(); ++i) {
    wire[i] = ByteSpan(static_cast<const uint8_t*>(zmq_msg_data(&in->sealed[i]->msg)),
                       zmq_msg_size(&in->sealed[i]->msg));
  }
  StatusOr<std::vector<Buffer>> opened = rx.cipher.Open(wire);
  in->sealed.clear();  // the plain parts are new buffers
  Status s = opened.status();
  const uint8_t* header = nullptr;
  size_t header_bytes = 0;
  if (s.ok()) {
    if (rx.fd < 0) rx.fd = in->fd;
    s = ParseEnvelope((*opened)[0].data(), (*opened)[0].size(), opened->size() - 1, &header,
                      &header_bytes);
    if (!s.ok()) s = DataLossError(s.message());
  }
  if (!s.ok()) {
    std::string what, reason;
    if (s.code() == StatusCode::kFailedPrecondition && rx.fd >= 0 && in->fd != rx.fd) {
      // The lane connection of an earlier lane of the same sender: a newer one took over.
      identity_refused_.fetch_add(1, std::memory_order_relaxed);
      reason = "identity:" + from;
      what = fmt::format(
          "refused a message from an older lane connection of '{}': a newer connection "
          "authenticated with the same key took over",
          from);
    } else if (s.code() == StatusCode::kFailedPrecondition) {
      auth_refused_.fetch_add(1, std::memory_order_relaxed);
      reason = "sealed:" + from;
      what = fmt::format("refused a message on the lane of '{}': {}", from, s.message());
    } else {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped a malformed message from '{}': {}", Prefix(), from, s.message());
      return s;
    }
    uint64_t suppressed = 0;
    if (receive_log_limiter_.Allow(reason, &suppressed)) {
      BP_LOG_WARN("{}{}{}", Prefix(), what,
                  suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    return s;
  }
  Message m;
  m.header.assign(reinterpret_cast<const char*>(header), header_bytes);
  m.frames.assign(std::make_move_iterator(opened->begin() + 1),
                  std::make_move_iterator(opened->end()));
  const uint64_t bytes = header_bytes + m.payload_bytes();
  messages_received_.fetch_add(1, std::memory_order_relaxed);
  bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
  in->r.body = std::move(m);
  return Status::Ok();
}

void ZmqTransport::ReadRouterMonitor(void* monitor, bool lane) {
  uint16_t event;
  uint32_t value;
  std::string endpoint;
  while (ReadMonitorEvent(monitor, &event, &endpoint, &value)) {
    const int fd = static_cast<int>(value);
    if (event == ZMQ_EVENT_ACCEPTED) {
      if (++open_connections_ > options_.max_connections) {
        // Shut, not closed: ZeroMQ owns the descriptor and cleans up when it reads the end.
        shutdown(fd, SHUT_RDWR);
        connections_refused_.fetch_add(1, std::memory_order_relaxed);
        uint64_t suppressed = 0;
        if (log_limiter_.Allow("connections", &suppressed)) {
          BP_LOG_WARN(
              "{}refused a connection: {} are open, the limit is {}{}", Prefix(),
              open_connections_ - 1, options_.max_connections,
              suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
        }
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      if (open_connections_ > 0) --open_connections_;
      superseded_fds_.erase(fd);
      for (auto it = bound_fd_.begin(); it != bound_fd_.end();) {
        it = it->second == fd ? bound_fd_.erase(it) : std::next(it);
      }
    } else if (curve_ &&
               (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH))) {
      // Under CURVE every failed handshake is a peer that did not authenticate: an unknown key
      // (logged by AnswerZap), a peer that does not speak CURVE (whichever side notices the
      // mismatch first, the other sees the connection end), or bytes that are not ZMTP.
      auth_refused_.fetch_add(1, std::memory_order_relaxed);
      if (event != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && !lane) {
        uint64_t suppressed = 0;
        if (log_limiter_.Allow("mechanism", &suppressed)) {
          BP_LOG_WARN(
              "{}refused a connection that does not speak CURVE (security.mode none on "
              "the other side, or not a bitpush node){}",
              Prefix(),
              suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
        }
      }
    } else if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped a connection that failed the ZMTP handshake (event {:#x})", Prefix(),
                   event);
    }
  }
}

}  // namespace bitpush::transport::zmq_backend
