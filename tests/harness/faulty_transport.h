// FaultyTransport: a Transport wrapper for fault injection in tests (docs/style: faults are
// injected by wrapping interfaces, never by hooks in production code).
//
// Every wrapper shares a FaultSwitch with the test: SetSilent(true) drops every outgoing
// message (Send still returns OK, like a node whose packets vanish, or a process that hangs);
// Crash() closes the wrapped endpoint as a dying process would (peers see it disconnect,
// its owner's Receive returns Cancelled). SetHolding(true) keeps every outgoing message (Send
// returns OK; nothing is delivered) until ReleaseHeld() or Close drops them: a transport that
// has not let go of a sender's frames yet.
//
// Owned by the test harness (tests/harness). Thread-safety: like the wrapped Transport; the
// FaultSwitch may be flipped from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/transport/transport.h"

namespace bitpush::testing {

class FaultSwitch {
 public:
  void SetSilent(bool silent) { silent_.store(silent); }
  bool silent() const { return silent_.load(); }
  uint64_t dropped() const { return dropped_.load(); }
  void SetHolding(bool holding) { holding_.store(holding); }
  bool holding() const { return holding_.load(); }
  size_t held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  // Drops the held messages (their frames' owners let go), on this thread.
  void ReleaseHeld() {
    std::vector<transport::Message> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dropped.swap(held_);
    }
  }
  void Hold(transport::Message msg) {
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(std::move(msg));
  }

  // Closes the endpoint attached to this switch (now, or as soon as one is attached).
  void Crash();
  bool crashed() const { return crashed_.load(); }

  // Used by FaultyTransport.
  void Attach(std::shared_ptr<transport::Transport> inner);
  void CountDrop() { dropped_.fetch_add(1); }

 private:
  std::atomic<bool> silent_{false};
  std::atomic<bool> crashed_{false};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<bool> holding_{false};
  mutable std::mutex mu_;
  std::shared_ptr<transport::Transport> inner_;  // guarded by mu_
  std::vector<transport::Message> held_;         // guarded by mu_
};

class FaultyTransport final : public transport::Transport {
 public:
  FaultyTransport(std::shared_ptr<transport::Transport> inner, std::shared_ptr<FaultSwitch> sw)
      : inner_(std::move(inner)), switch_(std::move(sw)) {
    switch_->Attach(inner_);
  }
  ~FaultyTransport() override { Close(); }

  const transport::PeerId& name() const override { return inner_->name(); }
  std::string address() const override { return inner_->address(); }
  using transport::Transport::Connect;
  Status Connect(const transport::PeerId& peer, const std::string& address,
                 const transport::PeerId& key_owner) override {
    return inner_->Connect(peer, address, key_owner);
  }
  void Disconnect(const transport::PeerId& peer) override { inner_->Disconnect(peer); }
  Status Send(const transport::PeerId& peer, transport::Message msg) override {
    if (switch_->silent()) {
      switch_->CountDrop();
      return Status::Ok();
    }
    if (switch_->holding()) {
      switch_->Hold(std::move(msg));
      return Status::Ok();
    }
    return inner_->Send(peer, std::move(msg));
  }
  StatusOr<transport::Received> Receive(std::chrono::milliseconds timeout) override {
    return inner_->Receive(timeout);
  }
  void Close() override {
    inner_->Close();
    switch_->ReleaseHeld();  // a closed transport lets go of every frame
  }
  transport::TransportStats stats() const override { return inner_->stats(); }

 private:
  std::shared_ptr<transport::Transport> inner_;
  std::shared_ptr<FaultSwitch> switch_;
};

inline void FaultSwitch::Crash() {
  std::shared_ptr<transport::Transport> inner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    crashed_.store(true);
    inner = inner_;
  }
  if (inner) inner->Close();
}

inline void FaultSwitch::Attach(std::shared_ptr<transport::Transport> inner) {
  bool crash;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inner_ = std::move(inner);
    crash = crashed_.load();
  }
  if (crash) Crash();
}

}  // namespace bitpush::testing
