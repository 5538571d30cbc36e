// Channel and Listener: the framed message connection between a training process and its
// node's bitpush-worker daemon, over a Unix domain socket (docs/local-ipc.md).
//
// Framing: SOCK_SEQPACKET, so the kernel keeps message boundaries and delivers each message
// whole or not at all; one frame = one packet = an 8-byte prefix (magic "BPL1", then the
// payload length as little-endian u32) + the payload (a serialized bitpush.v1.LocalMessage,
// see local_protocol.h). The prefix makes an end-of-stream (a 0-byte read) unambiguous and
// lets the receiver reject a frame whose stated and actual lengths differ (DataLoss: a peer
// that is not a bitpush process, or a bug). Frames above ChannelOptions::max_frame_bytes are
// refused by Send (InvalidArgument) and by Receive (DataLoss). Bulk tensor bytes never go
// through the channel: they live in shared memory (shm_segment.h).
//
// Identity: both sides learn the other's pid/uid from the kernel (SO_PEERCRED), never from a
// message: the daemon names a dead training process by it, Accept refuses peers of another
// user, and Connect refuses a listener of another user before sending anything. Both check
// the socket's directory first (socket_dir.h). Errors name the peer (peer_name(): "pid N" until the
// daemon labels it, e.g. "local rank 2 (pid N)").
//
// Every wait is bounded: Connect retries a missing or busy daemon until its timeout, Receive
// takes a timeout, Send waits at most ChannelOptions::send_timeout for room. Failures:
// peer closed or died -> Unavailable naming the peer; a bound expired -> Timeout naming whom
// it waited for; bad frame -> DataLoss; Shutdown() -> Cancelled.
//
// Ownership: a Channel owns its socket (closed by the destructor); a Listener owns its
// socket and its path (unlinked by the destructor).
// Thread-safety: Send may be called from any thread (each frame is one atomic sendmsg);
// Receive / Accept by one thread at a time; Shutdown from any thread, also while another
// thread waits in Receive/Send/Accept (it wakes them). peer_name/set_peer_name are
// synchronised.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace bitpush::worker::ipc {

struct ChannelOptions {
  // Largest frame payload (bytes) sent or accepted. 1..kMaxFrameLimit; default 64 KiB
  // (control messages only: tensors go through shared memory).
  size_t max_frame_bytes = 64 * 1024;
  // How long Send waits for room in the socket buffer before Timeout.
  std::chrono::milliseconds send_timeout{5000};

  Status Validate() const;
};

// The largest max_frame_bytes (the socket buffers are sized for two such frames).
inline constexpr size_t kMaxFrameLimit = 1 << 20;
// The bytes each frame adds in front of its payload.
inline constexpr size_t kFramePrefixBytes = 8;
inline constexpr uint32_t kFrameMagic = 0x314C5042;  // "BPL1" little-endian

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class Channel {
 public:
  // Connects to the daemon listening at `path`, retrying (10 ms back-off doubling to 200 ms)
  // while nobody listens there yet, its directory does not exist yet, or its backlog is full.
  // Timeout after `timeout` naming the path, the attempts and the last error. Before any byte
  // is sent: the socket's directory must pass CheckSocketDirectory (socket_dir.h), and the
  // listening process must run as this process's user (SO_PEERCRED); otherwise
  // FailedPrecondition naming the path, the directory or both uids.
  static StatusOr<std::unique_ptr<Channel>> Connect(const std::string& path,
                                                    std::chrono::milliseconds timeout,
                                                    const ChannelOptions& options = {});

  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Sends one frame. InvalidArgument above max_frame_bytes; Unavailable when the peer is
  // gone; Timeout after send_timeout without room; Cancelled after Shutdown.
  Status Send(std::string_view payload);

  // Waits at most `timeout` for the next frame and returns its payload.
  StatusOr<std::string> Receive(std::chrono::milliseconds timeout);

  // Ends the connection in both directions and wakes waiting Send/Receive calls (they
  // return Cancelled). The peer sees the connection closed. Idempotent.
  void Shutdown();

  const PeerCredentials& peer() const { return peer_; }
  std::string peer_name() const;
  void set_peer_name(std::string name);
  // The socket, for a poll loop that waits on many channels (POLLIN = a frame or the end).
  int fd() const { return fd_; }

  // Tests: sends `bytes` as one raw packet, without the frame prefix or any check.
  Status SendRawForTesting(std::string_view bytes);

 private:
  friend class Listener;
  Channel(int fd, PeerCredentials peer, std::string peer_name, const ChannelOptions& options);
  Status ClosedError(std::string_view doing) const;

  const int fd_;
  const PeerCredentials peer_;
  const ChannelOptions options_;
  std::atomic<bool> shut_down_{false};
  mutable std::mutex name_mu_;
  std::string peer_name_;  // guarded by name_mu_
  std::vector<char> rx_;   // receive buffer: used by the one Receive caller
};

class Listener {
 public:
  // Binds a Unix socket at `path` (mode 0600) and listens. Its directory must pass
  // CheckSocketDirectory (socket_dir.h; the default directory is created 0700 when missing).
  // A stale socket file of this user (nobody accepting there) is replaced; a path where a live
  // process listens is FailedPrecondition naming it, as is a stale socket of another user and a
  // path that exists and is not a socket.
  static StatusOr<std::unique_ptr<Listener>> Listen(const std::string& path,
                                                    const ChannelOptions& options = {});

  ~Listener();  // closes and unlinks the path
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Waits at most `timeout` for a connection. A peer of another user is refused and counted
  // (FailedPrecondition naming the path, its pid and both uids; the listener stays usable).
  StatusOr<std::unique_ptr<Channel>> Accept(std::chrono::milliseconds timeout);

  // Connections refused so far because the peer runs as another user. Any thread.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

  // Wakes a pending Accept (Cancelled) and makes later ones fail. Idempotent.
  void Shutdown();

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  Listener(int fd, int wake_fd, std::string path, const ChannelOptions& options);

  const int fd_;
  const int wake_fd_;  // eventfd written by Shutdown
  const std::string path_;
  const ChannelOptions options_;
  std::atomic<bool> shut_down_{false};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace bitpush::worker::ipc
