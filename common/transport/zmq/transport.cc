// The zmq endpoint's caller API (zmq_transport.h): Connect, Disconnect, Send, Receive, Close and
// stats, called from any thread, and the factory.
#include "common/transport/zmq/transport.h"

#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/transport/zmq/inbox.h"
#include "common/transport/zmq/sockets.h"
#include "common/transport/zmq/zmq_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {

ZmqTransport::~ZmqTransport() {
  Close();
  if (wake_fd_ >= 0) close(wake_fd_);  // only now: a racing Send may still Wake()
}

void ZmqTransport::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

Status ZmqTransport::Connect(const PeerId& peer, const std::string& address,
                             const PeerId& key_owner) {
  if (peer.empty()) return InvalidArgumentError(Prefix() + "Connect: empty peer name");
  if (!HasScheme(address)) {
    return InvalidArgumentError(
        Prefix() + fmt::format("Connect to '{}': address '{}' is not tcp://HOST:PORT or "
                               "ipc://PATH",
                               peer, address));
  }
  std::string server_key;
  if (curve_) {
    auto key = options_.security.peer_keys.find(key_owner);
    if (key == options_.security.peer_keys.end()) {
      return InvalidArgumentError(
          Prefix() + fmt::format("Connect to '{}': no public key for '{}' in the cluster's key "
                                 "list (security.public_keys)",
                                 peer, key_owner));
    }
    server_key = DecodeZ85Key(key->second);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + fmt::format("Connect to '{}': closed", peer));
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second->address == address) return Status::Ok();
    ++connects_in_flight_;
  }
  struct InFlight {
    ZmqTransport* t;
    ~InFlight() {
      std::lock_guard<std::mutex> lock(t->mu_);
      if (--t->connects_in_flight_ == 0) t->connects_done_.notify_all();
    }
  } in_flight{this};
  // The sockets are created here, then handed to the I/O thread (the mutex hand-over is the
  // full memory barrier ZeroMQ requires when a socket changes threads).
  void* dealer = zmq_socket(ctx_, ZMQ_DEALER);
  if (!dealer) {
    return UnavailableError(Prefix() + fmt::format("Connect to '{}': {}", peer, ZmqError()));
  }
  if (curve_) {
    // No routing id: the receiver names us by our key, not by what we call ourselves.
    SetInt(dealer, ZMQ_CURVE_SERVER, 0);
    zmq_setsockopt(dealer, ZMQ_CURVE_SERVERKEY, server_key.data(), server_key.size());
    zmq_setsockopt(dealer, ZMQ_CURVE_PUBLICKEY, public_key_.data(), public_key_.size());
    zmq_setsockopt(dealer, ZMQ_CURVE_SECRETKEY, secret_key_.data(), secret_key_.size());
  } else {
    zmq_setsockopt(dealer, ZMQ_ROUTING_ID, options_.name.data(), options_.name.size());
  }
  SetSenderOptions(dealer, address);
  void* monitor = nullptr;
  Status s = OpenMonitor(dealer,
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
                         &monitor);
  if (s.ok() && zmq_connect(dealer, address.c_str()) != 0) {
    s = InvalidArgumentError(Prefix() +
                             fmt::format("Connect to '{}' at '{}': {}", peer, address, ZmqError()));
  }
  if (!s.ok()) {
    if (monitor) zmq_close(monitor);
    SetInt(dealer, ZMQ_LINGER, 0);
    zmq_close(dealer);
    return s;
  }
  std::shared_ptr<PeerShared> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      auto shared = std::make_shared<PeerShared>();
      shared->address = address;
      std::shared_ptr<PeerShared>& slot = peers_[peer];
      old = std::move(slot);
      if (old) old->removed = true;
      slot = shared;
      commands_.push_back({Command::Kind::kAdd, peer, shared, dealer, monitor});
      dealer = monitor = nullptr;
      if (old) space_.notify_all();
    }
  }
  if (dealer) {  // closed meanwhile
    zmq_close(monitor);
    SetInt(dealer, ZMQ_LINGER, 0);
    zmq_close(dealer);
    return CancelledError(Prefix() + fmt::format("Connect to '{}': closed", peer));
  }
  Wake();
  return Status::Ok();
}

void ZmqTransport::Disconnect(const PeerId& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    it->second->removed = true;
    commands_.push_back({Command::Kind::kRemove, peer, it->second});
    peers_.erase(it);
    space_.notify_all();
  }
  Wake();
}

Status ZmqTransport::Send(const PeerId& peer, Message msg) {
  if (Status g = CheckGlue(msg); !g.ok()) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {}", peer, g.message()));
  }
  JoinGlued(&msg);  // frames travel whole here: a glued run becomes one Buffer (a copy)
  const uint64_t bytes = msg.header.size() + msg.payload_bytes();
  if (msg.frames.size() > UINT32_MAX || msg.header.size() > UINT32_MAX) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {} frames, {}-byte header",
                                                       peer, msg.frames.size(), msg.header.size()));
  }
  bool wake = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + fmt::format("send to '{}': closed", peer));
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return NotFoundError(Prefix() +
                           fmt::format("send to unknown peer '{}' (not connected)", peer));
    }
    std::shared_ptr<PeerShared> p = it->second;
    const size_t limit = options_.max_queued_per_peer;
    auto blocked = [&] { return p->outbox.size() + p->io_held >= limit; };
    if (p->state != PeerState::kDisconnected && blocked()) {
      ++blocked_senders_;
      space_.wait_for(lock, options_.send_block_timeout, [&] {
        return closed_ || p->removed || p->state == PeerState::kDisconnected || !blocked();
      });
      --blocked_senders_;
      if (closed_) return CancelledError(Prefix() + fmt::format("send to '{}': closed", peer));
      if (p->removed) {
        return NotFoundError(Prefix() +
                             fmt::format("send to '{}': the peer was disconnected while the send "
                                         "waited",
                                         peer));
      }
      if (p->state != PeerState::kDisconnected && blocked()) {
        return UnavailableError(
            Prefix() + fmt::format("send to '{}' at {}: {} messages queued, none sent for {} ms",
                                   peer, p->address, p->outbox.size() + p->io_held,
                                   options_.send_block_timeout.count()));
      }
    }
    if (p->state == PeerState::kDisconnected) {
      return UnavailableError(Prefix() + fmt::format("send to '{}' at {}: {}", peer, p->address,
                                                     p->last_error.message()));
    }
    p->outbox.push_back(Outgoing{std::move(msg)});
    wake = !outbox_dirty_;
    outbox_dirty_ = true;
  }
  messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  if (wake) Wake();
  return Status::Ok();
}

StatusOr<Received> ZmqTransport::Receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    bool wake = false;
    Incoming in;
    switch (inbox_.Take(deadline, &in, &wake)) {
      case Inbox::Taken::kTimeout:
        return TimeoutError(Prefix() + fmt::format("no message within {} ms", timeout.count()));
      case Inbox::Taken::kClosed: return CancelledError(Prefix() + "closed");
      case Inbox::Taken::kEntry: break;
    }
    if (wake) Wake();
    if (!in.lane || OpenIncoming(&in).ok()) return std::move(in.r);
    // Refused: the next one, within the same time.
  }
}

void ZmqTransport::Close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    space_.notify_all();
    connects_done_.wait(lock, [&] { return connects_in_flight_ == 0; });
  }
  inbox_.Close();
  if (io_thread_.joinable()) {
    Wake();
    io_thread_.join();
  } else {  // Start failed part-way: close what it opened
    if (router_monitor_) zmq_close(router_monitor_);
    if (router_) zmq_close(router_);
    if (lane_router_monitor_) zmq_close(lane_router_monitor_);
    if (lane_router_) zmq_close(lane_router_);
    if (zap_) zmq_close(zap_);
  }
  router_ = router_monitor_ = lane_router_ = lane_router_monitor_ = zap_ = nullptr;
  if (ctx_) zmq_ctx_term(ctx_);  // waits at most kCloseLingerMs for messages to flush
  ctx_ = nullptr;
  inbox_.Clear();
  std::map<PeerId, std::shared_ptr<PeerShared>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers.swap(peers_);
    commands_.clear();
  }
}

TransportStats ZmqTransport::stats() const {
  TransportStats s;
  s.messages_sent = messages_sent_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.messages_received = messages_received_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  s.malformed_dropped = malformed_dropped_.load(std::memory_order_relaxed);
  s.auth_refused = auth_refused_.load(std::memory_order_relaxed);
  s.identity_refused = identity_refused_.load(std::memory_order_relaxed);
  s.connections_refused = connections_refused_.load(std::memory_order_relaxed);
  return s;
}

StatusOr<std::unique_ptr<Transport>> CreateZmqTransport(const TransportOptions& options) {
  auto t = std::make_unique<ZmqTransport>(options);
  Status s = t->Start();
  if (!s.ok()) return s;  // ~ZmqTransport closes what Start opened
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace bitpush::transport::zmq_backend
