// The zmq endpoint's I/O thread (zmq_transport.h): its poll loop, the peers' sockets it owns,
// the outgoing messages it takes from the outboxes and hands to ZeroMQ, and peers reported up
// and down.
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/transport/zmq/sockets.h"
#include "common/transport/zmq/zmq_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {

void ZmqTransport::IoLoop() {
  // The endpoint's own sockets, polled every turn, then the watch of the peers' sockets
  // (socket_watch.h): a turn looks only at the peers whose sockets signalled or were used.
  std::vector<zmq_pollitem_t> items;
  while (true) {
    std::deque<Command> commands;
    bool closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
      closing = closed_;
      outbox_dirty_ = false;
    }
    ApplyCommands(&commands);
    CollectOutboxes();
    for (auto& [name, p] : io_peers_) {
      if (!p.pending.empty()) FlushPending(name, &p);
    }
    if (closing) break;

    items.clear();
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    items.push_back({router_, 0, static_cast<short>(inbox_.HasRoom() ? ZMQ_POLLIN : 0), 0});
    items.push_back({router_monitor_, 0, ZMQ_POLLIN, 0});
    items.push_back({zap_, -1, static_cast<short>(zap_ ? ZMQ_POLLIN : 0), 0});
    const bool lane_room = curve_ && items[1].events != 0;
    items.push_back({lane_router_, -1, static_cast<short>(lane_room ? ZMQ_POLLIN : 0), 0});
    items.push_back(
        {lane_router_monitor_, -1, static_cast<short>(lane_router_monitor_ ? ZMQ_POLLIN : 0), 0});
    items.push_back({nullptr, watch_.fd(), ZMQ_POLLIN, 0});

    // Peers left due by this turn's work are looked at without waiting.
    if (zmq_poll(items.data(), static_cast<int>(items.size()), watch_.HasDue() ? 0 : -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      BP_LOG_ERROR("{}zmq_poll: {}; the I/O thread stops", Prefix(), ZmqError());
      break;
    }
    if (items[0].revents) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
    if (items[3].revents & ZMQ_POLLIN) AnswerZap();
    if (items[2].revents & ZMQ_POLLIN) ReadRouterMonitor(router_monitor_, false);
    if (items[5].revents & ZMQ_POLLIN) ReadRouterMonitor(lane_router_monitor_, true);
    if (items[1].revents & ZMQ_POLLIN) ReadRouter(false);
    if (items[4].revents & ZMQ_POLLIN) ReadRouter(true);
    if (items[6].revents & ZMQ_POLLIN) watch_.Collect();
    for (const PeerId& name : watch_.TakeDue()) {
      auto it = io_peers_.find(name);
      if (it != io_peers_.end()) ServicePeer(it->first, &it->second);
    }
  }
  for (auto& [name, p] : io_peers_) CloseIoPeer(&p);
  io_peers_.clear();
  lanes_in_.clear();
  zmq_close(router_monitor_);
  zmq_close(router_);
  if (lane_router_) {
    zmq_close(lane_router_monitor_);
    zmq_close(lane_router_);
  }
  if (zap_) zmq_close(zap_);  // after the ROUTERs: no connection is admitted without it
}

namespace {

// The socket's ready events (ZMQ_POLLIN / ZMQ_POLLOUT); reading them drains its mailbox, which
// re-arms its ZMQ_FD (socket_watch.h). 0 for no socket.
int ReadyEvents(void* socket) {
  int events = 0;
  size_t size = sizeof(events);
  if (socket == nullptr || zmq_getsockopt(socket, ZMQ_EVENTS, &events, &size) != 0) return 0;
  return events;
}

}  // namespace

void ZmqTransport::ServicePeer(const PeerId& name, IoPeer* p) {
  bool read = false;
  if (ReadyEvents(p->monitor) & ZMQ_POLLIN) {
    ReadPeerMonitor(name, p);
    read = true;
  }
  if (curve_) {
    // kCurve: the dealer is read (the offer); the lane is written.
    if (ReadyEvents(p->dealer) & ZMQ_POLLIN) {
      ReadDealer(name, p);
      read = true;
    }
    if (ReadyEvents(p->lane_monitor) & ZMQ_POLLIN) {
      ReadLaneMonitor(name, p);
      read = true;
    }
    ReadyEvents(p->lane);  // POLLOUT: pending messages go out at the top of the loop
  } else {
    ReadyEvents(p->dealer);  // written only; as the lane
  }
  // What a handler did (a lane request sent, a lane opened or closed) may have drained a
  // mailbox: one more look next turn.
  if (read) watch_.MarkDue(name);
}

void ZmqTransport::ApplyCommands(std::deque<Command>* commands) {
  for (Command& c : *commands) {
    auto it = io_peers_.find(c.peer);
    if (c.kind == Command::Kind::kRemove) {
      if (it != io_peers_.end() && it->second.shared == c.shared) {
        CloseIoPeer(&it->second);
        io_peers_.erase(it);
      }
      continue;
    }
    if (it != io_peers_.end()) {
      CloseIoPeer(&it->second);
      io_peers_.erase(it);
    }
    IoPeer& p = io_peers_[c.peer];
    p.shared = std::move(c.shared);
    p.dealer = c.dealer;
    p.monitor = c.monitor;
    Watch(c.peer, p.monitor);
    Watch(c.peer, p.dealer);
  }
  commands->clear();
}

void ZmqTransport::Watch(const PeerId& name, void* socket) {
  Status s = watch_.Add(socket, name);
  // Without its descriptor the socket is looked at only when the peer is due for another
  // reason; it still works, late. Not expected: the descriptor exists from zmq_socket on.
  if (!s.ok()) BP_LOG_ERROR("{}{}", Prefix(), s.message());
}

void ZmqTransport::CloseIoPeer(IoPeer* p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    p->shared->io_held = 0;
  }
  p->pending.clear();
  CloseLane(p);
  watch_.Remove(p->monitor);
  watch_.Remove(p->dealer);
  zmq_close(p->monitor);
  zmq_close(p->dealer);  // lingers (in ZeroMQ's threads) up to kCloseLingerMs
  p->monitor = p->dealer = nullptr;
}

void ZmqTransport::PeerUp(const PeerId& name, IoPeer* p) {
  bool reconnected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reconnected = p->shared->state == PeerState::kDisconnected;
    p->shared->state = PeerState::kConnected;
    p->shared->last_error = Status::Ok();
  }
  if (reconnected) PushEvent(name, TransportEvent::Kind::kPeerConnected, Status::Ok());
}

void ZmqTransport::PeerDown(const PeerId& name, IoPeer* p) {
  std::deque<Outgoing> dropped;
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A connection that never completed the handshake is still "connecting".
    if (p->shared->state != PeerState::kConnected) return;
    dropped.swap(p->shared->outbox);
    const size_t n = dropped.size() + p->pending.size();
    why = UnavailableError(
        fmt::format("peer '{}' at {} disconnected{}", name, p->shared->address,
                    n ? fmt::format(" ({} queued messages dropped)", n) : std::string()));
    p->shared->state = PeerState::kDisconnected;
    p->shared->last_error = why;
    p->shared->io_held = 0;
    space_.notify_all();
  }
  p->pending.clear();
  dropped.clear();
  PushEvent(name, TransportEvent::Kind::kPeerDisconnected, why);
}

void ZmqTransport::CollectOutboxes() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, p] : io_peers_) {
    std::deque<Outgoing>& outbox = p.shared->outbox;
    if (outbox.empty()) continue;
    p.shared->io_held += outbox.size();
    if (p.pending.empty()) {
      p.pending.swap(outbox);
    } else {
      for (Outgoing& o : outbox) p.pending.push_back(std::move(o));
      outbox.clear();
    }
  }
}

void ZmqTransport::FlushPending(const PeerId& name, IoPeer* p) {
  // kCurve: messages wait for the lane.
  void* socket = curve_ ? (p->lane_up ? p->lane : nullptr) : p->dealer;
  if (socket == nullptr) return;
  int events = 0;
  size_t events_size = sizeof(events);
  if (zmq_getsockopt(socket, ZMQ_EVENTS, &events, &events_size) == 0 && !(events & ZMQ_POLLOUT)) {
    return;  // not connected or at the high-water mark: poll for POLLOUT
  }
  size_t handed = 0;
  while (!p->pending.empty()) {
    Outgoing& o = p->pending.front();
    int err;
    if (!curve_) {
      err = SendMessage(p->dealer, o.msg);
    } else {
      // Sealed here, once: a message ZeroMQ did not take (EAGAIN) stays sealed for the retry.
      // One sealed for a lane that is gone cannot be opened on this one (a lane is replaced
      // only after its peer was reported disconnected, which dropped what was queued).
      err = 0;
      if (o.sealed_with == nullptr) {
        Status sealed = SealMessage(p->lane_cipher.get(), &o.msg);
        if (sealed.ok()) {
          o.sealed_with = p->lane_cipher.get();
        } else {
          BP_LOG_ERROR("{}send to '{}': {}", Prefix(), name, sealed.message());
          err = EPROTO;
        }
      }
      if (o.sealed_with == p->lane_cipher.get())
        err = SendFrames(p->lane, o.msg.frames, /*first_taken=*/false);
    }
    if (err == EAGAIN) break;  // not connected or at the high-water mark: wait for POLLOUT
    if (err != 0) {
      PushEvent(name, TransportEvent::Kind::kSendFailed,
                UnavailableError(Prefix() + fmt::format("send to '{}' at {} failed: {}", name,
                                                        p->shared->address, zmq_strerror(err))));
    }
    p->pending.pop_front();
    ++handed;
  }
  if (handed == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  p->shared->io_held -= handed;
  if (blocked_senders_ > 0) space_.notify_all();
}

void ZmqTransport::ReadPeerMonitor(const PeerId& name, IoPeer* p) {
  uint16_t event;
  std::string endpoint;
  while (ReadMonitorEvent(p->monitor, &event, &endpoint)) {
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      if (!curve_) {
        PeerUp(name, p);
      } else {
        // The peer's state follows its lane; a (re)connected CURVE connection asks for one
        // unless a lane is open or being opened.
        p->control_up = true;
        p->lane_requested = false;
        if (p->lane == nullptr) RequestLane(name, p);
      }
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
               event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow("handshake:" + name, &suppressed)) {
        BP_LOG_WARN("{}the security handshake with '{}' at {} failed ({}); retrying{}", Prefix(),
                    name, p->shared->address,
                    event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                        ? "it refused this node's key: is this node's public key in its "
                          "security.public_keys?"
                    : curve_ ? "is security.mode curve on that node too, and its key the one "
                               "security.public_keys lists?"
                             : "is security.mode none on that node too?",
                    suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      if (!curve_) {
        PeerDown(name, p);
      } else {
        p->control_up = false;  // the lane, if any, reports its own end
        p->lane_requested = false;
      }
    }
  }
}

void ZmqTransport::PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status) {
  inbox_.PushEvent(peer, kind, std::move(status));
}

}  // namespace bitpush::transport::zmq_backend
