// The ucx endpoint's inbox: Receive's queue, and the credits it owes the senders. The progress
// thread appends the messages of each accepted connection in order, and events about peers;
// Receive takes them one at a time. Every message Receive takes is a credit its connection's
// sender gets back: the inbox counts them per connection, and asks for a wake-up of the
// progress thread once a connection owes a batch (a quarter of max_queued_per_peer) or has
// nothing left in the queue, so that the progress thread returns them (TakeCreditsDue) without
// a round trip per message.
//
// Owned by the endpoint (UcxTransport). Thread-safety: internally synchronised; Take is called
// by one thread at a time (Receive's), the others by the progress thread, except Close and
// Clear (Close).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/transport/transport.h"

namespace bitpush::transport::ucx_backend {

// Receive's queue entry: a message (of connection `conn`) or an event (conn 0).
struct Incoming {
  Received r;
  uint64_t conn = 0;
};

class Inbox {
 public:
  // `max_queued_per_peer`: the credits a connection is granted; they go back in batches of a
  // quarter of it.
  explicit Inbox(size_t max_queued_per_peer);

  enum class Taken { kEntry, kTimeout, kClosed };
  // Receive's thread: waits until `deadline` for the next entry and moves it to *out.
  // *credits_due: credits are due to a sender (the caller wakes the progress thread).
  Taken Take(std::chrono::steady_clock::time_point deadline, Incoming* out, bool* credits_due);

  // Progress thread: the credits owed for an accepted connection are counted from now on /
  // no longer.
  void AddConnection(uint64_t conn);
  void RemoveConnection(uint64_t conn);
  // Progress thread: the credits due (a batch reached, or nothing queued), by connection;
  // they count as returned.
  std::vector<std::pair<uint64_t, uint64_t>> TakeCreditsDue();

  // Progress thread: appends messages of connection `conn` from `from` (dropped once closed).
  void PushMessages(uint64_t conn, const PeerId& from, std::vector<Message>* messages);
  // Appends an event about `peer` (dropped once closed).
  void PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status);

  // Take returns kClosed from now on, at once; nothing more is queued.
  void Close();
  // Drops whatever still waits (after Close, once the progress thread stopped).
  void Clear();

 private:
  // Per accepted connection, what Receive and the progress thread share.
  struct CreditShare {
    size_t queued = 0;       // its messages in the inbox
    uint64_t to_return = 0;  // taken by Receive, not yet given back to the sender as credits
  };

  const size_t credit_batch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Incoming> entries_;
  std::unordered_map<uint64_t, CreditShare> credit_;  // by accepted connection
  bool credits_due_ = false;                          // some to_return reached its batch
  bool closed_ = false;
};

}  // namespace bitpush::transport::ucx_backend
