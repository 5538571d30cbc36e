#include "bench/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

namespace bitpush::bench {

using Clock = std::chrono::steady_clock;

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

namespace {

bool ParseIpv4(const std::string& ipv4, in_addr* out, std::string* error) {
  if (inet_pton(AF_INET, ipv4.c_str(), out) != 1) {
    *error = "not an IPv4 address: '" + ipv4 + "'";
    return false;
  }
  return true;
}

}  // namespace

int ListenTcp(const std::string& ipv4, int* port, std::string* error) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (!ParseIpv4(ipv4, &sa.sin_addr, error)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  socklen_t len = sizeof(sa);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd, 1) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    *error = "raw TCP listener on " + ipv4 + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(sa.sin_port);
  return fd;
}

int ConnectTcp(const std::string& ipv4, int port, std::string* error) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (!ParseIpv4(ipv4, &sa.sin_addr, error)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    *error = "connect to raw TCP port " + ipv4 + ":" + std::to_string(port) + ": " +
             std::strerror(errno);
    if (fd >= 0) close(fd);
    return -1;
  }
  SetNoDelay(fd);
  return fd;
}

int ListenLoopback(int* port, std::string* error) {
  return ListenTcp("127.0.0.1", port, error);
}

int ConnectLoopback(int port, std::string* error) {
  return ConnectTcp("127.0.0.1", port, error);
}

void RawPeer(int fd) {
  std::vector<uint8_t> buf;
  std::vector<uint8_t> out;  // kRawDuplex: what the peer sends
  std::vector<uint8_t> small(64 << 10);
  RawHeader h;
  while (ReadAll(fd, &h, sizeof(h)) && h.mode != kRawQuit) {
    buf.resize(std::max<size_t>(buf.size(), h.bytes));
    if (h.mode == kRawStream) {
      for (uint64_t i = 0; i < h.count; ++i) {
        if (!ReadAll(fd, buf.data(), h.bytes)) return;
      }
      const uint8_t ack = 1;
      if (!WriteAll(fd, &ack, 1)) return;
    } else if (h.mode == kRawCeiling) {
      uint64_t left = h.count * h.bytes;
      while (left > 0) {
        const ssize_t r = read(fd, small.data(), std::min<uint64_t>(left, small.size()));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return;
        left -= static_cast<uint64_t>(r);
      }
      const uint8_t ack = 1;
      if (!WriteAll(fd, &ack, 1)) return;
    } else if (h.mode == kRawDuplex) {
      if (out.size() != h.bytes) {
        out.resize(h.bytes);
        for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 151 + (i >> 11));
      }
      bool sent = true;
      std::thread sender([&] {
        for (uint64_t i = 0; i < h.count && sent; ++i) sent = WriteAll(fd, out.data(), h.bytes);
      });
      bool received = true;
      for (uint64_t i = 0; i < h.count && received; ++i) {
        received = ReadAll(fd, buf.data(), h.bytes);
      }
      if (!received) shutdown(fd, SHUT_RDWR);  // unblocks the sender
      sender.join();
      const uint8_t ack = 1;
      if (!received || !sent || !WriteAll(fd, &ack, 1)) return;
    } else {
      for (uint64_t i = 0; i < h.count; ++i) {
        if (!ReadAll(fd, buf.data(), h.bytes) || !WriteAll(fd, buf.data(), h.bytes)) return;
      }
    }
  }
}

double RawStream(int fd, uint64_t mode, const std::vector<uint8_t>& src, uint64_t count) {
  const RawHeader h{mode, count, src.size()};
  const auto t0 = Clock::now();
  if (!WriteAll(fd, &h, sizeof(h))) return NAN;
  for (uint64_t i = 0; i < count; ++i) {
    if (!WriteAll(fd, src.data(), src.size())) return NAN;
  }
  uint8_t ack;
  if (!ReadAll(fd, &ack, 1)) return NAN;
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double RawDuplex(int fd, const std::vector<uint8_t>& src, uint64_t count,
                 std::vector<uint8_t>* scratch) {
  const RawHeader h{kRawDuplex, count, src.size()};
  if (scratch->size() != src.size()) scratch->assign(src.size(), 0);
  std::vector<uint8_t>& in = *scratch;
  const auto t0 = Clock::now();
  if (!WriteAll(fd, &h, sizeof(h))) return NAN;
  bool received = true;
  std::thread receiver([&] {
    for (uint64_t i = 0; i < count && received; ++i) received = ReadAll(fd, in.data(), in.size());
    uint8_t ack = 0;
    received = received && ReadAll(fd, &ack, 1);
  });
  bool sent = true;
  for (uint64_t i = 0; i < count && sent; ++i) sent = WriteAll(fd, src.data(), src.size());
  if (!sent) shutdown(fd, SHUT_RDWR);  // unblocks the receiver
  receiver.join();
  const auto t1 = Clock::now();
  if (!sent || !received) return NAN;
  return std::chrono::duration<double>(t1 - t0).count();
}

double RawRtt(int fd, int count, size_t bytes) {
  const RawHeader h{kRawPingPong, static_cast<uint64_t>(count), bytes};
  if (!WriteAll(fd, &h, sizeof(h))) return NAN;
  std::vector<uint8_t> buf(bytes, 1);
  std::vector<double> us;
  for (int i = 0; i < count; ++i) {
    const auto t0 = Clock::now();
    if (!WriteAll(fd, buf.data(), buf.size()) || !ReadAll(fd, buf.data(), buf.size())) return NAN;
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace bitpush::bench
