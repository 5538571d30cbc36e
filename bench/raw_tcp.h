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
//   kRawQuit     the peer returns.
//
// Thread-safety: plain functions on file descriptors; one thread per socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bitpush::bench {

enum RawMode : uint64_t { kRawQuit = 0, kRawStream = 1, kRawPingPong = 2, kRawCeiling = 3 };

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

// The peer side: serves RawHeaders on `fd` until kRawQuit or the connection closes.
void RawPeer(int fd);

// Seconds to stream `count` messages of `src` (kRawStream or kRawCeiling) and get the
// acknowledgement; NaN if the peer went away.
double RawStream(int fd, uint64_t mode, const std::vector<uint8_t>& src, uint64_t count);

// Median round trip of `bytes`-byte messages in microseconds; NaN if the peer went away.
double RawRtt(int fd, int count, size_t bytes);

}  // namespace bitpush::bench
