// The zmq endpoint's inbox: what its I/O thread hands to Receive, in order. Messages parsed by
// the I/O thread, events about peers, and under security mode curve sealed messages that
// Receive opens itself (LaneRx: the lane's cipher, so that sealing on the I/O thread and
// opening on Receive's thread run in parallel).
//
// The inbox bounds the messages (not events) that wait to `max_messages` (the endpoint's
// max_queued_per_peer): the I/O thread asks HasRoom before it reads its ROUTER sockets, and
// stops reading while the inbox is full; Take tells Receive when the reader may resume, so a
// slow receiver pushes back to its senders through ZeroMQ's high-water marks.
//
// Owned by the endpoint (ZmqTransport). Thread-safety: internally synchronised; Take is called
// by one thread at a time (Receive's), the Push methods, Room and HasRoom by the I/O thread,
// Close and Clear by Close.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport/transport.h"
#include "common/transport/zmq/lane.h"
#include "common/transport/zmq/sockets.h"

namespace bitpush::transport::zmq_backend {

// kCurve: the receiving end of a lane. Created by the I/O thread, then used only by the thread
// in Receive, which opens the lane's messages (so sealing, on the I/O thread, and opening run
// in parallel).
struct LaneRx {
  explicit LaneRx(const std::string& key) : cipher(key) {}
  LaneCipher cipher;
  int fd = -1;  // the lane connection, once a message opened on it
};

// What the I/O thread hands to Receive: a message or event, or under kCurve a sealed message
// that Receive opens (its lane, the connection it came on, its parts).
struct Incoming {
  Incoming() = default;
  explicit Incoming(Received received) : r(std::move(received)) {}
  Received r;
  std::shared_ptr<LaneRx> lane;
  int fd = -1;
  std::vector<std::shared_ptr<MsgHolder>> sealed;
};

class Inbox {
 public:
  explicit Inbox(size_t max_messages) : max_messages_(max_messages) {}

  enum class Taken { kEntry, kTimeout, kClosed };
  // Receive's thread: waits until `deadline` for the next entry and moves it to *out.
  // *resume: the I/O thread had stopped reading and may read again (the caller wakes it).
  Taken Take(std::chrono::steady_clock::time_point deadline, Incoming* out, bool* resume);

  // I/O thread: how many more messages fit.
  size_t Room();
  // I/O thread: whether a message fits; when none does, notes that the reader paused.
  bool HasRoom();
  // I/O thread: appends received messages (at most Room()).
  void PushMessages(std::vector<Incoming>* batch);
  // Appends an event about `peer` (dropped once closed).
  void PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status);

  // Take returns kClosed from now on, at once; events are no longer queued.
  void Close();
  // Drops whatever still waits (after Close, once the I/O thread stopped).
  void Clear();

 private:
  const size_t max_messages_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Incoming> entries_;
  size_t messages_ = 0;         // messages (not events) in entries_
  bool reader_paused_ = false;  // the I/O thread stopped reading: entries_ full
  bool closed_ = false;
};

}  // namespace bitpush::transport::zmq_backend
