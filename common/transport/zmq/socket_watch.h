// The zmq endpoint's I/O thread keeps its peers' sockets here (io_thread.cc): an epoll set of
// their ZMQ_FDs, so that a wake-up costs the peers whose sockets signalled, not every peer.
// With one zmq_poll over every socket a scheduler of N nodes paid O(N) per message, O(N^2) per
// heartbeat interval.
//
// ZeroMQ's ZMQ_FD of a socket is readable when the socket's state may have changed (its command
// mailbox has something); the socket's own ZMQ_EVENTS, which drains the mailbox, then says what
// is ready. An operation on the socket (send, receive, ZMQ_EVENTS) drains the mailbox too, and
// what it drained is not signalled again: so the owner looks at a peer's sockets again after
// operating on them (MarkDue) and whenever they signalled (Collect), and at nothing else.
//
// Ownership: the endpoint owns one; it refers to sockets by pointer and to peers by name, and
// owns only the epoll descriptor. A socket is Removed before it is closed.
// Thread-safety: none; the I/O thread alone uses it once Start returned.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "common/transport/transport.h"

namespace bitpush::transport::zmq_backend {

class SocketWatch {
 public:
  SocketWatch() = default;
  ~SocketWatch();
  SocketWatch(const SocketWatch&) = delete;
  SocketWatch& operator=(const SocketWatch&) = delete;

  Status Open();
  // The epoll descriptor: readable when a watched socket signalled (for zmq_poll).
  int fd() const { return epoll_fd_; }

  // Watches `socket` (nullptr: nothing) on behalf of `peer`, and marks the peer due: a new
  // socket may have events already.
  Status Add(void* socket, const PeerId& peer);
  // Before the socket is closed (its descriptor lives on in ZeroMQ's reaper for a while).
  void Remove(void* socket);

  void MarkDue(const PeerId& peer) { due_.insert(peer); }
  bool HasDue() const { return !due_.empty(); }
  // Marks due the peers whose sockets signalled, without blocking.
  void Collect();
  // The peers due, in name order; none are due afterwards.
  std::set<PeerId> TakeDue();

  size_t watched() const { return sockets_.size(); }

 private:
  struct Watched {
    int fd;
    uint64_t token;
  };
  int epoll_fd_ = -1;
  uint64_t next_token_ = 1;
  std::unordered_map<void*, Watched> sockets_;
  std::unordered_map<uint64_t, PeerId> peers_;  // token -> peer
  std::set<PeerId> due_;
};

}  // namespace bitpush::transport::zmq_backend
