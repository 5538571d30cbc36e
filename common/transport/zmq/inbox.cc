#include "common/transport/zmq/inbox.h"

#include <utility>

namespace bitpush::transport::zmq_backend {

Inbox::Taken Inbox::Take(std::chrono::steady_clock::time_point deadline, Incoming* out,
                         bool* resume) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return closed_ || !entries_.empty(); })) {
    return Taken::kTimeout;
  }
  if (closed_) return Taken::kClosed;
  *out = std::move(entries_.front());
  entries_.pop_front();
  if (out->r.is_message()) --messages_;
  *resume = false;
  if (reader_paused_ && messages_ < max_messages_) {
    reader_paused_ = false;
    *resume = true;
  }
  return Taken::kEntry;
}

size_t Inbox::Room() {
  std::lock_guard<std::mutex> lock(mu_);
  return max_messages_ > messages_ ? max_messages_ - messages_ : 0;
}

bool Inbox::HasRoom() {
  std::lock_guard<std::mutex> lock(mu_);
  reader_paused_ = messages_ >= max_messages_;
  return !reader_paused_;
}

void Inbox::PushMessages(std::vector<Incoming>* batch) {
  if (batch->empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (Incoming& in : *batch) entries_.push_back(std::move(in));
  messages_ += batch->size();
  cv_.notify_one();
}

void Inbox::PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  entries_.push_back(Incoming{Received{peer, TransportEvent{kind, peer, std::move(status)}}});
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

}  // namespace bitpush::transport::zmq_backend
