#include "common/transport/ucx/inbox.h"

#include <algorithm>

namespace bitpush::transport::ucx_backend {

Inbox::Inbox(size_t max_queued_per_peer)
    : credit_batch_(std::max<size_t>(1, max_queued_per_peer / 4)) {}

Inbox::Taken Inbox::Take(std::chrono::steady_clock::time_point deadline, Incoming* out,
                         bool* credits_due) {
  *credits_due = false;
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return closed_ || !entries_.empty(); })) {
    return Taken::kTimeout;
  }
  if (closed_) return Taken::kClosed;
  *out = std::move(entries_.front());
  entries_.pop_front();
  if (out->conn != 0) {
    auto it = credit_.find(out->conn);
    if (it != credit_.end()) {
      --it->second.queued;
      ++it->second.to_return;
      if (!credits_due_ && (it->second.to_return >= credit_batch_ || it->second.queued == 0)) {
        credits_due_ = true;
        *credits_due = true;
      }
    }
  }
  return Taken::kEntry;
}

void Inbox::AddConnection(uint64_t conn) {
  std::lock_guard<std::mutex> lock(mu_);
  credit_[conn] = CreditShare{};
}

void Inbox::RemoveConnection(uint64_t conn) {
  std::lock_guard<std::mutex> lock(mu_);
  credit_.erase(conn);
}

std::vector<std::pair<uint64_t, uint64_t>> Inbox::TakeCreditsDue() {
  std::vector<std::pair<uint64_t, uint64_t>> give;
  std::lock_guard<std::mutex> lock(mu_);
  credits_due_ = false;
  for (auto& [id, share] : credit_) {
    if (share.to_return > 0 && (share.to_return >= credit_batch_ || share.queued == 0)) {
      give.emplace_back(id, share.to_return);
      share.to_return = 0;
    }
  }
  return give;
}

void Inbox::PushMessages(uint64_t conn, const PeerId& from, std::vector<Message>* messages) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  credit_[conn].queued += messages->size();
  for (Message& m : *messages) entries_.push_back(Incoming{Received{from, std::move(m)}, conn});
  cv_.notify_one();
}

void Inbox::PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  entries_.push_back(Incoming{Received{peer, TransportEvent{kind, peer, std::move(status)}}, 0});
  cv_.notify_one();
}

void Inbox::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

void Inbox::Clear() {
  std::deque<Incoming> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(entries_);
  }
}

}  // namespace bitpush::transport::ucx_backend
