#include "common/transport/inproc/transport.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fmt/format.h"

namespace bitpush::transport {

std::shared_ptr<InprocHub> NewInprocHub() {
  return std::make_shared<InprocHub>();
}

namespace inproc {

namespace {
constexpr const char kScheme[] = "inproc://";
}  // namespace

// The receive queue of one endpoint. Senders push into it directly (from their own threads);
// its owner pops. One mutex guards everything; no lock is held while calling out.
class Mailbox {
 public:
  Mailbox(PeerId owner, std::string address)
      : owner_(std::move(owner)), address_(std::move(address)) {}

  const PeerId& Owner() const { return owner_; }

  bool IsClosed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

  // Queues `msg` from `from`, blocking while `from` already has `limit` messages waiting here.
  Status Push(const PeerId& from, Message msg, size_t limit, std::chrono::milliseconds block) {
    std::unique_lock<std::mutex> lock(mu_);
    size_t& waiting = per_sender_[from];
    if (waiting >= limit && !closed_) {
      ++blocked_senders_;
      const bool room = space_.wait_for(lock, block, [&] { return closed_ || waiting < limit; });
      --blocked_senders_;
      if (!room) {
        return UnavailableError(fmt::format("{} messages already queued, none taken for {} ms",
                                            waiting, block.count()));
      }
    }
    if (closed_) return UnavailableError("the peer closed");
    ++waiting;
    queue_.push_back(Received{from, std::move(msg)});
    ready_.notify_one();
    return Status::Ok();
  }

  // Events are not subject to the per-sender bound (they are rare and must not be lost).
  void PushEvent(Received event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    queue_.push_back(std::move(event));
    ready_.notify_one();
  }

  StatusOr<Received> Pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ready_.wait_for(lock, timeout, [&] { return closed_ || !queue_.empty(); })) {
      return TimeoutError(fmt::format("endpoint '{}' ({}): no message within {} ms", owner_,
                                      address_, timeout.count()));
    }
    if (closed_) return CancelledError(fmt::format("endpoint '{}' ({}) closed", owner_, address_));
    Received r = std::move(queue_.front());
    queue_.pop_front();
    if (r.is_message()) {
      auto it = per_sender_.find(r.from);
      if (it != per_sender_.end() && it->second > 0) --it->second;
      if (blocked_senders_ > 0) space_.notify_all();
    }
    return r;
  }

  struct Watcher {
    std::weak_ptr<Mailbox> mailbox;
    PeerId name_there;  // what the watching endpoint calls this one
  };

  void AddWatcher(const std::shared_ptr<Mailbox>& watcher, const PeerId& name_there) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Watcher& w : watchers_) {
      if (w.mailbox.lock() == watcher && w.name_there == name_there) return;
    }
    watchers_.push_back({watcher, name_there});
  }

  void RemoveWatcher(const Mailbox* watcher, const PeerId& name_there) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = watchers_.begin(); it != watchers_.end(); ++it) {
      if (it->mailbox.lock().get() == watcher && it->name_there == name_there) {
        watchers_.erase(it);
        return;
      }
    }
  }

  // Wakes every waiter, drops queued messages (releasing their buffers) and returns the
  // endpoints to notify. Idempotent: a second call returns nothing.
  std::vector<Watcher> Close() {
    std::deque<Received> dropped;
    std::vector<Watcher> watchers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return {};
      closed_ = true;
      dropped.swap(queue_);
      watchers.swap(watchers_);
      ready_.notify_all();
      space_.notify_all();
    }
    return watchers;  // `dropped` is destroyed outside the lock
  }

 private:
  const PeerId owner_;
  const std::string address_;
  mutable std::mutex mu_;
  std::condition_variable ready_;  // queue_ not empty, or closed_
  std::condition_variable space_;  // some sender's count dropped, or closed_
  std::deque<Received> queue_;
  std::unordered_map<PeerId, size_t> per_sender_;  // messages waiting in queue_ per sender
  size_t blocked_senders_ = 0;
  std::vector<Watcher> watchers_;
  bool closed_ = false;
};

namespace {

class InprocTransport final : public Transport {
 public:
  InprocTransport(const TransportOptions& options, std::shared_ptr<Mailbox> mailbox)
      : options_(options), hub_(options.inproc_hub), mailbox_(std::move(mailbox)) {}
  ~InprocTransport() override { Close(); }

  const PeerId& name() const override { return options_.name; }
  std::string address() const override { return options_.listen_address; }

  using Transport::Connect;
  // No wire, nothing to authenticate: key_owner is not used.
  Status Connect(const PeerId& peer, const std::string& address, const PeerId&) override {
    if (peer.empty()) return InvalidArgumentError(Prefix() + "Connect: empty peer name");
    if (address.rfind(kScheme, 0) != 0 || address.size() == sizeof(kScheme) - 1) {
      return InvalidArgumentError(Prefix() + fmt::format("Connect to '{}': address '{}' is not "
                                                         "inproc://NAME",
                                                         peer, address));
    }
    std::shared_ptr<Mailbox> target = hub_->Find(address);
    std::shared_ptr<Mailbox> previous;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return CancelledError(Prefix() + "closed");
      Peer& p = peers_[peer];
      if (p.address == address && p.mailbox) return Status::Ok();
      previous = std::move(p.mailbox);
      p.address = address;
      p.mailbox = target;
    }
    if (previous && previous != target) previous->RemoveWatcher(mailbox_.get(), peer);
    if (target) target->AddWatcher(mailbox_, peer);
    return Status::Ok();
  }

  void Disconnect(const PeerId& peer) override {
    std::shared_ptr<Mailbox> target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(peer);
      if (it == peers_.end()) return;
      target = std::move(it->second.mailbox);
      peers_.erase(it);
    }
    if (target) target->RemoveWatcher(mailbox_.get(), peer);
  }

  Status Send(const PeerId& peer, Message msg) override {
    if (Status g = CheckGlue(msg); !g.ok()) {
      return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {}", peer, g.message()));
    }
    JoinGlued(&msg);  // frames travel whole here: a glued run becomes one Buffer (a copy)
    std::shared_ptr<Mailbox> target;
    std::string address;
    bool was_connected = false;
    bool resolved = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return CancelledError(Prefix() + fmt::format("send to '{}': closed", peer));
      auto it = peers_.find(peer);
      if (it == peers_.end()) {
        return NotFoundError(Prefix() +
                             fmt::format("send to unknown peer '{}' (not connected)", peer));
      }
      address = it->second.address;
      target = it->second.mailbox;
      was_connected = target != nullptr;
      if (!target || target->IsClosed()) {
        // Not there at Connect time, or gone: the address may have been (re)registered.
        target = hub_->Find(address);
        it->second.mailbox = target;
        resolved = target != nullptr;
      }
    }
    if (!target) {
      return UnavailableError(Prefix() + fmt::format("send to '{}': {} at {}", peer,
                                                     was_connected ? "the peer is gone (closed)"
                                                                   : "no endpoint listening",
                                                     address));
    }
    if (resolved) {
      target->AddWatcher(mailbox_, peer);
      // The peer was reported gone (its Close sent us kPeerDisconnected) and is back.
      if (was_connected) {
        mailbox_->PushEvent(Received{
            peer, TransportEvent{TransportEvent::Kind::kPeerConnected, peer, Status::Ok()}});
      }
    }
    const uint64_t bytes = msg.header.size() + msg.payload_bytes();
    Status s = target->Push(options_.name, std::move(msg), options_.max_queued_per_peer,
                            options_.send_block_timeout);
    if (!s.ok()) {
      return Status(s.code(),
                    Prefix() + fmt::format("send to '{}' at {}: {}", peer, address, s.message()));
    }
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
    return Status::Ok();
  }

  StatusOr<Received> Receive(std::chrono::milliseconds timeout) override {
    StatusOr<Received> r = mailbox_->Pop(timeout);
    if (r.ok() && r->is_message()) {
      messages_received_.fetch_add(1, std::memory_order_relaxed);
      bytes_received_.fetch_add(r->message().header.size() + r->message().payload_bytes(),
                                std::memory_order_relaxed);
    }
    return r;
  }

  void Close() override {
    std::map<PeerId, Peer> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      peers.swap(peers_);
    }
    hub_->Unregister(options_.listen_address, mailbox_.get());
    for (auto& [peer, p] : peers) {
      if (p.mailbox) p.mailbox->RemoveWatcher(mailbox_.get(), peer);
    }
    for (const Mailbox::Watcher& w : mailbox_->Close()) {
      std::shared_ptr<Mailbox> watcher = w.mailbox.lock();
      if (!watcher) continue;
      TransportEvent ev{TransportEvent::Kind::kPeerDisconnected, w.name_there,
                        UnavailableError(fmt::format("peer '{}' at {} closed", w.name_there,
                                                     options_.listen_address))};
      watcher->PushEvent(Received{w.name_there, std::move(ev)});
    }
  }

  TransportStats stats() const override {
    TransportStats s;
    s.messages_sent = messages_sent_.load(std::memory_order_relaxed);
    s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
    s.messages_received = messages_received_.load(std::memory_order_relaxed);
    s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
    return s;  // inproc traffic cannot be malformed: malformed_dropped stays 0
  }

 private:
  struct Peer {
    std::string address;
    std::shared_ptr<Mailbox> mailbox;  // null until an endpoint listens at `address`
  };

  std::string Prefix() const {
    return fmt::format("endpoint '{}' ({}): ", options_.name, options_.listen_address);
  }

  const TransportOptions options_;
  const std::shared_ptr<InprocHub> hub_;
  const std::shared_ptr<Mailbox> mailbox_;

  std::mutex mu_;
  std::map<PeerId, Peer> peers_;  // guarded by mu_
  bool closed_ = false;           // guarded by mu_

  std::atomic<uint64_t> messages_sent_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> messages_received_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(const TransportOptions& options) {
  if (!options.inproc_hub) {
    return InvalidArgumentError(fmt::format(
        "endpoint '{}': the inproc backend needs TransportOptions::inproc_hub (NewInprocHub())",
        options.name));
  }
  const std::string& address = options.listen_address;
  if (address.rfind(kScheme, 0) != 0 || address.size() == sizeof(kScheme) - 1) {
    return InvalidArgumentError(fmt::format(
        "endpoint '{}': listen address '{}' is not inproc://NAME", options.name, address));
  }
  auto mailbox = std::make_shared<Mailbox>(options.name, address);
  BP_RETURN_IF_ERROR(options.inproc_hub->Register(address, mailbox));
  return std::unique_ptr<Transport>(new InprocTransport(options, std::move(mailbox)));
}

}  // namespace inproc

Status InprocHub::Register(const std::string& address,
                           const std::shared_ptr<inproc::Mailbox>& mailbox) {
  std::lock_guard<std::mutex> lock(mu_);
  std::weak_ptr<inproc::Mailbox>& slot = endpoints_[address];
  if (std::shared_ptr<inproc::Mailbox> existing = slot.lock(); existing && !existing->IsClosed()) {
    return UnavailableError(
        fmt::format("address {} is in use by endpoint '{}'", address, existing->Owner()));
  }
  slot = mailbox;
  return Status::Ok();
}

void InprocHub::Unregister(const std::string& address, const inproc::Mailbox* mailbox) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = endpoints_.find(address);
  if (it == endpoints_.end()) return;
  std::shared_ptr<inproc::Mailbox> current = it->second.lock();
  if (!current || current.get() == mailbox) endpoints_.erase(it);
}

std::shared_ptr<inproc::Mailbox> InprocHub::Find(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = endpoints_.find(address);
  if (it == endpoints_.end()) return nullptr;
  std::shared_ptr<inproc::Mailbox> mb = it->second.lock();
  if (mb && mb->IsClosed()) return nullptr;
  return mb;
}

}  // namespace bitpush::transport
