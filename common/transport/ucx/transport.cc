// The ucx endpoint's caller API (ucx_transport.h): Connect, Disconnect, Send, Receive, Close,
// stats and DescribePeer, called from any thread; the factory and the viability probe.
#include "common/transport/ucx/transport.h"

#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/transport/ucx/context.h"
#include "common/transport/ucx/inbox.h"
#include "common/transport/ucx/ucx_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {

UcxTransport::~UcxTransport() {
  Close();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void UcxTransport::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

Status UcxTransport::Connect(const PeerId& peer, const std::string& address,
                             const PeerId& key_owner) {
  if (peer.empty()) return InvalidArgumentError(Prefix() + "Connect: empty peer name");
  StatusOr<SockAddr> sockaddr = ParseAddress(address);
  if (!sockaddr.ok()) {
    return InvalidArgumentError(
        Prefix() + fmt::format("Connect to '{}': {}", peer, sockaddr.status().message()));
  }
  std::string token;
  if (auth_) {
    StatusOr<std::string> t = auth_->TokenTo(key_owner);
    if (!t.ok()) {
      return InvalidArgumentError(Prefix() +
                                  fmt::format("Connect to '{}': {}", peer, t.status().message()));
    }
    token = std::move(t).value();
  }
  std::shared_ptr<PeerShared> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + fmt::format("Connect to '{}': closed", peer));
    std::shared_ptr<PeerShared>& slot = peers_[peer];
    if (slot && slot->address == address && slot->key_owner == key_owner) return Status::Ok();
    auto shared = std::make_shared<PeerShared>();
    shared->address = address;
    shared->sockaddr = *sockaddr;
    shared->key_owner = key_owner;
    shared->hello_token = std::move(token);
    old = std::move(slot);
    if (old) {
      old->removed = true;
      space_.notify_all();
    }
    slot = shared;
    commands_.push_back({Command::Kind::kAdd, peer, shared});
    dirty_ = true;
  }
  Wake();
  return Status::Ok();
}

void UcxTransport::Disconnect(const PeerId& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    it->second->removed = true;
    commands_.push_back({Command::Kind::kRemove, peer, it->second});
    peers_.erase(it);
    dirty_ = true;
    space_.notify_all();
  }
  Wake();
}

Status UcxTransport::Send(const PeerId& peer, Message msg) {
  if (Status g = CheckGlue(msg); !g.ok()) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {}", peer, g.message()));
  }
  if (msg.frames.size() > UINT32_MAX || msg.header.size() > UINT32_MAX) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {} frames, {}-byte header",
                                                       peer, msg.frames.size(), msg.header.size()));
  }
  const uint64_t bytes = msg.header.size() + msg.payload_bytes();
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
    if (p->state != PeerState::kDisconnected && p->outbox.size() >= limit) {
      ++blocked_senders_;
      space_.wait_for(lock, options_.send_block_timeout, [&] {
        return closed_ || p->removed || p->state == PeerState::kDisconnected ||
               p->outbox.size() < limit;
      });
      --blocked_senders_;
      if (closed_) return CancelledError(Prefix() + fmt::format("send to '{}': closed", peer));
      if (p->removed) {
        return NotFoundError(Prefix() +
                             fmt::format("send to '{}': the peer was disconnected while the send "
                                         "waited",
                                         peer));
      }
      if (p->state != PeerState::kDisconnected && p->outbox.size() >= limit) {
        return UnavailableError(
            Prefix() + fmt::format("send to '{}' at {}: {} messages queued, none sent for {} ms",
                                   peer, p->address, p->outbox.size(),
                                   options_.send_block_timeout.count()));
      }
    }
    if (p->state == PeerState::kDisconnected) {
      return UnavailableError(Prefix() + fmt::format("send to '{}' at {}: {}", peer, p->address,
                                                     p->last_error.message()));
    }
    p->outbox.push_back(std::move(msg));
    wake = !dirty_;
    dirty_ = true;
  }
  messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  if (wake) Wake();
  return Status::Ok();
}

StatusOr<Received> UcxTransport::Receive(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  bool wake = false;
  Incoming in;
  switch (inbox_.Take(deadline, &in, &wake)) {
    case Inbox::Taken::kTimeout:
      return TimeoutError(Prefix() + fmt::format("no message within {} ms", timeout.count()));
    case Inbox::Taken::kClosed: return CancelledError(Prefix() + "closed");
    case Inbox::Taken::kEntry: break;
  }
  if (wake) Wake();
  return std::move(in.r);
}

void UcxTransport::Close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    space_.notify_all();
  }
  inbox_.Close();
  if (thread_.joinable()) {
    Wake();
    thread_.join();  // the thread closed every UCP object it used (Shutdown)
  } else if (listener_ != nullptr) {
    ucp_listener_destroy(listener_);  // Start failed part-way
  }
  listener_ = nullptr;
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  // UCX completed or abandoned every operation: release what it still held.
  for (SendOp* op : send_ops_) delete op;
  send_ops_.clear();
  for (RecvOp* op : recv_ops_) delete op;
  recv_ops_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
  inbox_.Clear();
  std::map<PeerId, std::shared_ptr<PeerShared>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers.swap(peers_);
    commands_.clear();
  }
}

TransportStats UcxTransport::stats() const {
  TransportStats s;
  s.messages_sent = messages_sent_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.messages_received = messages_received_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  s.malformed_dropped = malformed_dropped_.load(std::memory_order_relaxed);
  s.connections_refused = connections_refused_.load(std::memory_order_relaxed);
  s.auth_refused = auth_refused_.load(std::memory_order_relaxed);
  s.identity_refused = identity_refused_.load(std::memory_order_relaxed);
  return s;
}

StatusOr<std::string> UcxTransport::DescribePeer(const PeerId& peer, milliseconds timeout) {
  auto q = std::make_shared<EpQuery>();
  q->peer = peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + "closed");
    queries_.push_back(q);
    dirty_ = true;
  }
  Wake();
  std::unique_lock<std::mutex> lock(q->mu);
  if (!q->cv.wait_for(lock, timeout, [&] { return q->done; })) {
    return TimeoutError(Prefix() +
                        fmt::format("no answer about '{}' in {} ms", peer, timeout.count()));
  }
  return q->answer;
}

StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options) {
  auto t = std::make_unique<UcxTransport>(options);
  Status s = t->Start();
  if (!s.ok()) return s;  // ~UcxTransport releases what Start created
  return std::unique_ptr<Transport>(std::move(t));
}

StatusOr<std::string> DescribePeerEndpoint(Transport* t, const PeerId& peer,
                                           std::chrono::milliseconds timeout) {
  auto* ucx = dynamic_cast<UcxTransport*>(t);
  if (ucx == nullptr) return InvalidArgumentError("DescribePeerEndpoint: not a ucx endpoint");
  return ucx->DescribePeer(peer, timeout);
}

Status UcxViable() {
  // Probed once per process: creating a context reads the machine's devices.
  static const Status kViable = [] {
    StatusOr<ucp_context_h> context = NewContext({}, ContextUse::kProbe);
    if (!context.ok()) return context.status();
    ucp_cleanup(*context);
    return Status::Ok();
  }();
  return kViable;
}

}  // namespace bitpush::transport::ucx_backend
