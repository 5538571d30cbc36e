// SocketWatch (socket_watch.h): the epoll set of peers' ZMQ_FDs.
#include "common/transport/zmq/socket_watch.h"

#include <sys/epoll.h>
#include <unistd.h>
#include <zmq.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/transport/zmq/sockets.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {

SocketWatch::~SocketWatch() {
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status SocketWatch::Open() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return InternalError(std::string("epoll_create1: ") + std::strerror(errno));
  return Status::Ok();
}

Status SocketWatch::Add(void* socket, const PeerId& peer) {
  if (socket == nullptr) return Status::Ok();
  due_.insert(peer);
  int fd = -1;
  size_t fd_size = sizeof(fd);
  if (zmq_getsockopt(socket, ZMQ_FD, &fd, &fd_size) != 0) {
    return InternalError(fmt::format("ZMQ_FD of a socket to '{}': {}", peer, ZmqError()));
  }
  const uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = token;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return InternalError(
        fmt::format("epoll_ctl(ADD) for a socket to '{}': {}", peer, std::strerror(errno)));
  }
  sockets_[socket] = {fd, token};
  peers_[token] = peer;
  return Status::Ok();
}

void SocketWatch::Remove(void* socket) {
  auto it = sockets_.find(socket);
  if (it == sockets_.end()) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  peers_.erase(it->second.token);
  sockets_.erase(it);
}

void SocketWatch::Collect() {
  // One look: the descriptors are level-triggered, so those beyond this batch stay readable
  // and are reported on the next turn.
  std::array<epoll_event, 256> events;
  const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 0);
  for (int i = 0; i < n; ++i) {  // n < 0 (EINTR): the caller's next poll comes back here
    // By value: epoll_event is packed on x86-64, so its u64 is not 8-byte aligned.
    const uint64_t token = events[static_cast<size_t>(i)].data.u64;
    auto it = peers_.find(token);
    if (it != peers_.end()) due_.insert(it->second);
  }
}

std::set<PeerId> SocketWatch::TakeDue() {
  return std::exchange(due_, {});
}

}  // namespace bitpush::transport::zmq_backend
