#include "worker/ipc/channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/logging.h"
#include "worker/ipc/socket_dir.h"

namespace bitpush::worker::ipc {
namespace {

using Clock = std::chrono::steady_clock;

std::string ErrnoText(int err) {
  return std::strerror(err);
}

int PollTimeout(Clock::time_point deadline) {
  // Round up so a poll never returns just before the deadline and spins on a 0 ms wait.
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

StatusOr<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError(fmt::format("Unix socket path '{}' must have 1..{} characters",
                                            path, sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

StatusOr<PeerCredentials> ReadPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return InternalError(fmt::format("SO_PEERCRED: {}", ErrnoText(errno)));
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

void SizeBuffers(int fd, const ChannelOptions& options) {
  // Two full frames fit, so one large frame never fails with EMSGSIZE.
  int bytes = static_cast<int>(2 * (options.max_frame_bytes + kFramePrefixBytes) + 4096);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

}  // namespace

Status ChannelOptions::Validate() const {
  if (max_frame_bytes == 0 || max_frame_bytes > kMaxFrameLimit) {
    return InvalidArgumentError(fmt::format("ChannelOptions.max_frame_bytes = {} not in 1..{}",
                                            max_frame_bytes, kMaxFrameLimit));
  }
  if (send_timeout.count() < 0) {
    return InvalidArgumentError("ChannelOptions.send_timeout must not be negative");
  }
  return Status::Ok();
}

// ---- Channel ----

Channel::Channel(int fd, PeerCredentials peer, std::string peer_name, const ChannelOptions& options)
    : fd_(fd),
      peer_(peer),
      options_(options),
      peer_name_(std::move(peer_name)),
      rx_(options.max_frame_bytes + kFramePrefixBytes) {}

Channel::~Channel() {
  close(fd_);
}

std::string Channel::peer_name() const {
  std::lock_guard<std::mutex> lock(name_mu_);
  return peer_name_;
}

void Channel::set_peer_name(std::string name) {
  std::lock_guard<std::mutex> lock(name_mu_);
  peer_name_ = std::move(name);
}

void Channel::Shutdown() {
  if (!shut_down_.exchange(true)) shutdown(fd_, SHUT_RDWR);
}

Status Channel::ClosedError(std::string_view doing) const {
  if (shut_down_.load()) {
    return CancelledError(fmt::format("{} {}: the channel was shut down", doing, peer_name()));
  }
  return UnavailableError(
      fmt::format("{} {}: the peer closed the connection (process exited?)", doing, peer_name()));
}

StatusOr<std::unique_ptr<Channel>> Channel::Connect(const std::string& path,
                                                    std::chrono::milliseconds timeout,
                                                    const ChannelOptions& options) {
  BP_RETURN_IF_ERROR(options.Validate());
  BP_ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddress(path));
  const Clock::time_point deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(10);
  int attempts = 0;
  std::string last_error;
  for (;;) {
    ++attempts;
    // The directory first: a socket in a directory others control proves nothing. Not there
    // yet (the daemon makes it): retry like a missing socket.
    if (Status dir = CheckSocketDirectory(path, /*create=*/false); !dir.ok()) {
      if (dir.code() != StatusCode::kNotFound) return dir;
      last_error = dir.message();
    } else {
      int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return InternalError(fmt::format("socket(AF_UNIX): {}", ErrnoText(errno)));
      SizeBuffers(fd, options);
      if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
        StatusOr<PeerCredentials> cred = ReadPeerCredentials(fd);
        if (!cred.ok()) {
          close(fd);
          return cred.status();
        }
        // Before anything is sent: a listener of another user is not our daemon.
        if (cred->uid != SocketUser()) {
          close(fd);
          return FailedPreconditionError(fmt::format(
              "refusing the bitpush-worker daemon at {}: the process listening there (pid {}) "
              "runs as {}, but this training process runs as {}; the daemon must run as the "
              "same user (nothing was sent to it)",
              path, cred->pid, DescribeUid(cred->uid), DescribeUid(SocketUser())));
        }
        std::string name = fmt::format("bitpush-worker daemon at {} (pid {})", path, cred->pid);
        return std::unique_ptr<Channel>(new Channel(fd, *cred, std::move(name), options));
      }
      const int err = errno;
      close(fd);
      // Nobody listening yet (the daemon may start after us, or a dead one left its file) or
      // its backlog is full: retry.
      const bool retry = err == ENOENT || err == ECONNREFUSED || err == EAGAIN || err == EINTR;
      if (!retry) {
        return UnavailableError(fmt::format("cannot connect to the bitpush-worker daemon at {}: {}",
                                            path, ErrnoText(err)));
      }
      last_error = ErrnoText(err);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  return TimeoutError(fmt::format(
      "no bitpush-worker daemon accepted at {} within {} ms ({} attempts; last error: {})", path,
      timeout.count(), attempts, last_error));
}

Status Channel::Send(std::string_view payload) {
  if (payload.size() > options_.max_frame_bytes) {
    return InvalidArgumentError(fmt::format("a {}-byte frame to {} exceeds the {}-byte limit",
                                            payload.size(), peer_name(), options_.max_frame_bytes));
  }
  char prefix[kFramePrefixBytes];
  PutU32(prefix, kFrameMagic);
  PutU32(prefix + 4, static_cast<uint32_t>(payload.size()));
  iovec iov[2] = {{prefix, sizeof(prefix)}, {const_cast<char*>(payload.data()), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
  const Clock::time_point deadline = Clock::now() + options_.send_timeout;
  for (;;) {
    if (shut_down_.load()) return ClosedError("sending to");
    ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return Status::Ok();  // SEQPACKET: all or nothing
    int err = errno;
    if (err == EINTR) continue;
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) return ClosedError("sending to");
    if (err != EAGAIN) {
      return UnavailableError(fmt::format("sending to {}: {}", peer_name(), ErrnoText(err)));
    }
    if (Clock::now() >= deadline) {
      return TimeoutError(fmt::format(
          "sending to {}: a {}-byte frame not accepted within {} ms (the peer is not reading)",
          peer_name(), payload.size(), options_.send_timeout.count()));
    }
    pollfd p{fd_, POLLOUT, 0};
    (void)poll(&p, 1, PollTimeout(deadline));
  }
}

Status Channel::SendRawForTesting(std::string_view bytes) {
  ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (n < 0) return UnavailableError(fmt::format("raw send: {}", ErrnoText(errno)));
  return Status::Ok();
}

StatusOr<std::string> Channel::Receive(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    if (shut_down_.load()) return ClosedError("receiving from");
    iovec iov{rx_.data(), rx_.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    ssize_t n = recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n > 0) {
      if ((msg.msg_flags & MSG_TRUNC) != 0) {
        return DataLossError(fmt::format("a frame from {} exceeds the {}-byte limit (dropped)",
                                         peer_name(), options_.max_frame_bytes));
      }
      const auto got = static_cast<size_t>(n);
      if (got < kFramePrefixBytes || GetU32(rx_.data()) != kFrameMagic) {
        return DataLossError(
            fmt::format("a {}-byte packet from {} is not a bitpush frame (no 'BPL1' prefix)", got,
                        peer_name()));
      }
      const uint32_t stated = GetU32(rx_.data() + 4);
      if (stated != got - kFramePrefixBytes) {
        return DataLossError(fmt::format(
            "a frame from {} is truncated or padded: it states {} payload bytes but carries {}",
            peer_name(), stated, got - kFramePrefixBytes));
      }
      return std::string(rx_.data() + kFramePrefixBytes, got - kFramePrefixBytes);
    }
    if (n == 0) return ClosedError("receiving from");  // frames are never empty: end of stream
    int err = errno;
    if (err == EINTR) continue;
    if (err == ECONNRESET || err == ENOTCONN || err == EPIPE) return ClosedError("receiving from");
    if (err != EAGAIN) {
      return UnavailableError(fmt::format("receiving from {}: {}", peer_name(), ErrnoText(err)));
    }
    if (Clock::now() >= deadline) {
      return TimeoutError(
          fmt::format("no message from {} within {} ms", peer_name(), timeout.count()));
    }
    pollfd p{fd_, POLLIN, 0};
    (void)poll(&p, 1, PollTimeout(deadline));
  }
}

// ---- Listener ----

Listener::Listener(int fd, int wake_fd, std::string path, const ChannelOptions& options)
    : fd_(fd), wake_fd_(wake_fd), path_(std::move(path)), options_(options) {}

Listener::~Listener() {
  close(fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void Listener::Shutdown() {
  if (shut_down_.exchange(true)) return;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

StatusOr<std::unique_ptr<Listener>> Listener::Listen(const std::string& path,
                                                     const ChannelOptions& options) {
  BP_RETURN_IF_ERROR(options.Validate());
  BP_ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddress(path));
  BP_RETURN_IF_ERROR(CheckSocketDirectory(path, /*create=*/true));
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPreconditionError(
          fmt::format("cannot listen at {}: it exists and is not a socket", path));
    }
    // A live daemon accepts the probe; a leftover of a dead one refuses it.
    int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (probe < 0) return InternalError(fmt::format("socket(AF_UNIX): {}", ErrnoText(errno)));
    const bool live = connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 ||
                      errno == EAGAIN;
    std::string holder;
    if (live) {
      StatusOr<PeerCredentials> who = ReadPeerCredentials(probe);
      if (who.ok() && who->pid != 0) {
        holder = fmt::format(" (pid {}, {})", who->pid, DescribeUid(who->uid));
      }
    }
    close(probe);
    if (live) {
      return FailedPreconditionError(
          fmt::format("cannot listen at {}: another process is listening there{}", path, holder));
    }
    // Only our own leftover is ours to remove.
    if (st.st_uid != SocketUser()) {
      return FailedPreconditionError(fmt::format(
          "cannot listen at {}: a stale socket file of {} is there (nobody listens); it is not "
          "this process's ({}), so it is left alone: its owner or an administrator must "
          "remove it",
          path, DescribeUid(st.st_uid), DescribeUid(SocketUser())));
    }
    BP_LOG_INFO("replacing the stale socket {} (its daemon is gone)", path);
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return FailedPreconditionError(
          fmt::format("cannot remove the stale socket {}: {}", path, ErrnoText(errno)));
    }
  }
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return InternalError(fmt::format("socket(AF_UNIX): {}", ErrnoText(errno)));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    return UnavailableError(fmt::format("cannot bind {}: {}", path, ErrnoText(err)));
  }
  // Owner only; Accept also checks each peer's uid (the chmod comes after bind).
  if (chmod(path.c_str(), 0600) != 0 || listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    unlink(path.c_str());
    return UnavailableError(fmt::format("cannot listen at {}: {}", path, ErrnoText(err)));
  }
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    int err = errno;
    close(fd);
    unlink(path.c_str());
    return InternalError(fmt::format("eventfd: {}", ErrnoText(err)));
  }
  return std::unique_ptr<Listener>(new Listener(fd, wake, path, options));
}

StatusOr<std::unique_ptr<Channel>> Listener::Accept(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    if (shut_down_.load()) {
      return CancelledError(fmt::format("accepting at {}: the listener was shut down", path_));
    }
    int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      StatusOr<PeerCredentials> cred = ReadPeerCredentials(fd);
      if (!cred.ok()) {
        close(fd);
        return cred.status();
      }
      if (cred->uid != SocketUser()) {
        close(fd);
        refused_.fetch_add(1, std::memory_order_relaxed);
        return FailedPreconditionError(fmt::format(
            "refused a connection at {} from pid {}: it runs as {}, this daemon as {} (only "
            "processes of the daemon's user may connect)",
            path_, cred->pid, DescribeUid(cred->uid), DescribeUid(SocketUser())));
      }
      SizeBuffers(fd, options_);
      return std::unique_ptr<Channel>(
          new Channel(fd, *cred, fmt::format("pid {}", cred->pid), options_));
    }
    int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err != EAGAIN) {
      return UnavailableError(fmt::format("accepting at {}: {}", path_, ErrnoText(err)));
    }
    if (Clock::now() >= deadline) {
      return TimeoutError(
          fmt::format("no training process connected to {} within {} ms", path_, timeout.count()));
    }
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    (void)poll(p, 2, PollTimeout(deadline));
  }
}

}  // namespace bitpush::worker::ipc
