// The raw TCP reference of the network benchmarks (`bitpush-bench transport`, `pushpull`): one
// blocking loopback socket between two processes, the least any transport has to do to move
// the same bytes.
//
// Protocol on the socket: the driver writes a RawHeader, then the payload; the peer (RawPeer)
// serves headers until mode 0 or the connection closes:
//   kRawStream   `count` messages of `bytes`, each read whole into one reused buffer of the
//                message's size, then a 1-byte acknowledgement;
//   kRawCeiling  the same bytes read 64 KiB at a time into a cache-resident buffer and dropped
//                (iperf-style ceiling), then the acknowledgement;
//   kRawPingPong `count` round trips of `bytes`;
//   kRawDuplex   both ways at once: the peer sends `count` messages of `bytes` from a sender
//                thread while it reads the driver's `count` messages of `bytes` (each whole
//                into one reused buffer), then, after its sender is done, the acknowledgement
//                (so the driver reads the peer's messages, then the acknowledgement);
//   kRawQuit     the peer returns.
//
// Thread-safety: plain functions on file descriptors; one thread per socket, except in
// kRawDuplex, where one thread writes and one reads the same socket (both ends).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bitpush::bench {

enum RawMode : uint64_t {
  kRawQuit = 0,
  kRawStream = 1,
  kRawPingPong = 2,
  kRawCeiling = 3,
  kRawDuplex = 4
};

struct RawHeader {
  uint64_t mode, count, bytes;
};

// Loops over write()/read() until all `n` bytes moved; false on error or EOF.
bool WriteAll(int fd, const void* p, size_t n);
bool ReadAll(int fd, void* p, size_t n);
void SetNoDelay(int fd);

// A listening socket on 127.0.0.1 at a port the kernel picks (*port); -1 with *error set on
// failure.
int ListenLoopback(int* port, std::string* error);
// A connected socket to 127.0.0.1:port (TCP_NODELAY); -1 with *error set on failure.
int ConnectLoopback(int port, std::string* error);
// The same on a given IPv4 address (ListenLoopback/ConnectLoopback = "127.0.0.1").
int ListenTcp(const std::string& ipv4, int* port, std::string* error);
int ConnectTcp(const std::string& ipv4, int port, std::string* error);

// The peer side: serves RawHeaders on `fd` until kRawQuit or the connection closes.
void RawPeer(int fd);

// Seconds to stream `count` messages of `src` (kRawStream or kRawCeiling) and get the
// acknowledgement; NaN if the peer went away.
double RawStream(int fd, uint64_t mode, const std::vector<uint8_t>& src, uint64_t count);

// Seconds of a kRawDuplex exchange: `count` messages of `src` sent to the peer while a second
// thread reads the peer's `count` messages of the same size, until the peer's messages and its
// acknowledgement (it received all of ours) are in; NaN if the peer went away. Each direction
// moved count x src.size() bytes in that time. `scratch` receives (resized and touched before
// the clock starts, so keep it across calls).
double RawDuplex(int fd, const std::vector<uint8_t>& src, uint64_t count,
                 std::vector<uint8_t>* scratch);

// Median round trip of `bytes`-byte messages in microseconds; NaN if the peer went away.
double RawRtt(int fd, int count, size_t bytes);

}  // namespace bitpush::bench
