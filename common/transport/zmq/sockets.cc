#include "common/transport/zmq/sockets.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/transport/zmq/framing.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {
namespace {

// ThreadSanitizer cannot see the synchronisation inside libzmq (not built with it); these mark
// the hand-over of a zero-copy Buffer from the I/O thread to ZeroMQ's thread that releases it.
#if defined(__SANITIZE_THREAD__)
#define BP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BP_TSAN 1
#endif
#endif
#ifdef BP_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void HandOver(void* p) {
  __tsan_release(p);
}
void TakeOver(void* p) {
  __tsan_acquire(p);
}
#else
void HandOver(void*) {}
void TakeOver(void*) {}
#endif

// ZeroMQ calls this (from its I/O thread) when it no longer needs a zero-copy part.
void ReleaseBuffer(void* /*data*/, void* hint) {
  TakeOver(hint);
  delete static_cast<Buffer*>(hint);
}

}  // namespace

std::string ZmqError() {
  return zmq_strerror(zmq_errno());
}

bool HasScheme(const std::string& address) {
  return address.rfind("tcp://", 0) == 0 || address.rfind("ipc://", 0) == 0;
}

void SetInt(void* socket, int option, int value) {
  zmq_setsockopt(socket, option, &value, sizeof(value));
}

// Refuses an ipc:// path that a live process listens on (ZeroMQ would silently unlink it and
// steal the address); a stale socket file is fine.
Status CheckIpcPathFree(const std::string& address) {
  const std::string path = address.substr(6);
  if (path.empty() || path[0] == '@') return Status::Ok();
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Status::Ok();
  sockaddr_un sa{};
  if (path.size() >= sizeof(sa.sun_path)) return Status::Ok();  // ZeroMQ reports it
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Ok();
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  close(fd);
  if (live) return UnavailableError(fmt::format("address {} is in use", address));
  return Status::Ok();
}

// A Z85 key (40 characters) as its 32 bytes; "" when it is not one.
std::string DecodeZ85Key(const std::string& z85) {
  if (z85.size() != 40) return "";
  std::string out(32, '\0');
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(out.data()), z85.c_str()) == nullptr) return "";
  return out;
}

// ZeroMQ binds "tcp://NAME:port" to the network interface called NAME, not to the host NAME:
// a YAML that names its machines (ps0:9000) would fail with "No such device". A tcp address
// whose host is neither an IP literal nor "*" is therefore resolved first (its first IPv4
// address, else its first IPv6 one); one that does not resolve is left to ZeroMQ (an
// interface name).
StatusOr<std::string> BindableAddress(const std::string& listen) {
  if (listen.rfind("tcp://", 0) != 0) return listen;
  const std::string rest = listen.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return listen;
  const std::string host = rest.substr(0, colon);
  if (host.empty() || host == "*" || host[0] == '[') return listen;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return listen;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return listen;
  std::string v4_text, v6_text;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET && v4_text.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
      v4_text = text;
    } else if (a->ai_family == AF_INET6 && v6_text.empty()) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      v6_text = fmt::format("[{}]", text);
    }
  }
  freeaddrinfo(found);
  const std::string& ip = v4_text.empty() ? v6_text : v4_text;
  if (ip.empty()) return listen;
  return "tcp://" + ip + rest.substr(colon);
}

int SendMessage(void* dealer, const Message& m) {
  const size_t n = m.frames.size();
  zmq_msg_t part;
  zmq_msg_init_size(&part, kEnvelopeFixedBytes + m.header.size());
  EncodeEnvelope(m.header, static_cast<uint32_t>(n), static_cast<uint8_t*>(zmq_msg_data(&part)));
  if (zmq_msg_send(&part, dealer, ZMQ_DONTWAIT | (n ? ZMQ_SNDMORE : 0)) < 0) {
    const int err = zmq_errno();
    zmq_msg_close(&part);
    return err;
  }
  return SendFrames(dealer, m.frames, /*first_taken=*/true);
}

int SendFrames(void* socket, const std::vector<Buffer>& frames, bool first_taken) {
  // Once the first part is accepted the rest are too, unless the connection died meanwhile;
  // then every remaining part must still be offered so that ZeroMQ drops the whole message.
  int first_error = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const Buffer& f = frames[i];
    zmq_msg_t part;
    if (f.empty()) {
      zmq_msg_init(&part);
    } else if (f.size() < kCopyBelowBytes) {
      zmq_msg_init_size(&part, f.size());
      std::memcpy(zmq_msg_data(&part), f.data(), f.size());
    } else {
      auto* owner = new Buffer(f);
      HandOver(owner);
      zmq_msg_init_data(&part, const_cast<uint8_t*>(f.data()), f.size(), ReleaseBuffer, owner);
    }
    if (zmq_msg_send(&part, socket, ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0)) < 0) {
      const int err = zmq_errno();
      zmq_msg_close(&part);
      if (i == 0 && !first_taken) return err;  // nothing taken (EAGAIN: retry later)
      if (!first_error) first_error = err;
    }
  }
  return first_error == EAGAIN ? EPIPE : first_error;
}

// A monitor event: a 6-byte part (u16 event, u32 value) and a part with the endpoint address.
bool ReadMonitorEvent(void* monitor, uint16_t* event, std::string* endpoint, uint32_t* value) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, monitor, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  *event = 0;
  if (zmq_msg_size(&m) >= 2) std::memcpy(event, zmq_msg_data(&m), sizeof(*event));
  if (value != nullptr) {
    *value = 0;
    if (zmq_msg_size(&m) >= 6)
      std::memcpy(value, static_cast<const char*>(zmq_msg_data(&m)) + 2, 4);
  }
  bool more = zmq_msg_more(&m);
  endpoint->clear();
  while (more) {
    zmq_msg_close(&m);
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, monitor, ZMQ_DONTWAIT) < 0) break;
    endpoint->assign(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    more = zmq_msg_more(&m);
  }
  zmq_msg_close(&m);
  return true;
}

}  // namespace bitpush::transport::zmq_backend
