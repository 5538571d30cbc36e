// bitpush-test-attacker: an unauthenticated process that attacks a running cluster the way
// docs/security.md's threat model says a network attacker can try (tests/python/test_attack.py
// runs each attack against a real cluster, under security.mode curve and none):
//
//   bitpush-test-attacker ATTACK --target tcp://HOST:PORT [--as NAME[,NAME...]] [--count N]
//                         [--hold-ms MS] [--key K] [--bytes B]
//
//   forged-done      as each NAME (default worker:0), a Done to the scheduler at --target
//   forged-shutdown  as NAME (default scheduler), a Shutdown to a node at --target
//   takeover         as NAME (default worker:0), connect to a server and hold the connection
//                    (and its name) for --hold-ms, sending a heartbeat-sized message each 50 ms
//   future-push      as NAME (default worker:0), an OP_PUSH of key --key for round 1000000
//   big-frame        one message of --bytes (default 256 MiB) to --target, no bitpush framing
//   malformed-loop   as NAME (default worker:0), --count (default 1000) data messages whose
//                    header is garbage
//
// It speaks ZeroMQ without CURVE (it holds no key) and sets the routing id it claims, so under
// security.mode none it is whoever it says; under curve its handshake is refused. Every send
// waits at most 1 s (a refused peer leaves nothing to send to). Exit status 0 when it is done
// (whether the target accepted anything is for the test to observe), 2 for a usage error.
#include <zmq.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/zmq/framing.h"
#include "proto/bitpush/v1/control.pb.h"

namespace {

using bitpush::transport::zmq_backend::EncodeEnvelope;
using bitpush::transport::zmq_backend::kEnvelopeFixedBytes;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void* Dealer(void* ctx, const std::string& name, const std::string& target) {
  void* d = zmq_socket(ctx, ZMQ_DEALER);
  if (!name.empty()) zmq_setsockopt(d, ZMQ_ROUTING_ID, name.data(), name.size());
  int linger = 3000;
  zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
  // A refused handshake leaves the socket without a peer, where a send would wait forever.
  int send_timeout_ms = 1000;
  zmq_setsockopt(d, ZMQ_SNDTIMEO, &send_timeout_ms, sizeof(send_timeout_ms));
  zmq_connect(d, target.c_str());
  return d;
}

// One bitpush message (envelope + header, optional frames).
// False when the socket took nothing within its send timeout (no peer to send to).
bool SendBitpush(void* d, const std::string& header, const std::vector<std::string>& frames = {}) {
  std::string env(kEnvelopeFixedBytes + header.size(), '\0');
  EncodeEnvelope(header, static_cast<uint32_t>(frames.size()),
                 reinterpret_cast<uint8_t*>(env.data()));
  if (zmq_send(d, env.data(), env.size(), frames.empty() ? 0 : ZMQ_SNDMORE) < 0) return false;
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq_send(d, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
  }
  return true;
}

int Usage(const char* problem) {
  std::fprintf(stderr, "bitpush-test-attacker: %s\n", problem);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("usage: bitpush-test-attacker ATTACK --target ADDR [options]");
  const std::string attack = argv[1];
  std::string target, as;
  long count = 1000, hold_ms = 3000;
  unsigned long long key = 0, bytes = 256ull << 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--target")
      target = value;
    else if (flag == "--as")
      as = value;
    else if (flag == "--count")
      count = std::atol(value.c_str());
    else if (flag == "--hold-ms")
      hold_ms = std::atol(value.c_str());
    else if (flag == "--key")
      key = std::strtoull(value.c_str(), nullptr, 10);
    else if (flag == "--bytes")
      bytes = std::strtoull(value.c_str(), nullptr, 10);
    else
      return Usage(("unknown flag " + flag).c_str());
  }
  if (target.empty()) return Usage("--target is required");
  void* ctx = zmq_ctx_new();
  std::vector<void*> sockets;
  if (attack == "forged-done") {
    for (const std::string& name : Split(as.empty() ? "worker:0" : as)) {
      void* d = Dealer(ctx, name, target);
      sockets.push_back(d);
      bitpush::v1::ControlMessage m;
      m.mutable_done();
      SendBitpush(d, m.SerializeAsString());
    }
  } else if (attack == "forged-shutdown") {
    void* d = Dealer(ctx, as.empty() ? "scheduler" : as, target);
    sockets.push_back(d);
    bitpush::v1::ControlMessage m;
    m.mutable_shutdown()->set_error("forged by bitpush-test-attacker");
    SendBitpush(d, m.SerializeAsString());
  } else if (attack == "takeover") {
    void* d = Dealer(ctx, as.empty() ? "worker:0" : as, target);
    sockets.push_back(d);
    bitpush::v1::DataHeader h;
    h.set_op(bitpush::v1::DataHeader::OP_PULL);
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(hold_ms);
    while (std::chrono::steady_clock::now() < end && SendBitpush(d, h.SerializeAsString())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } else if (attack == "future-push") {
    void* d = Dealer(ctx, as.empty() ? "worker:0" : as, target);
    sockets.push_back(d);
    bitpush::v1::DataHeader h;
    h.set_op(bitpush::v1::DataHeader::OP_PUSH);
    h.set_key(key);
    h.set_round(1000000);
    h.set_sender(0);
    SendBitpush(d, h.SerializeAsString(), {std::string(64, '\x01')});
  } else if (attack == "big-frame") {
    void* d = Dealer(ctx, as, target);
    sockets.push_back(d);
    std::string big(bytes, 'x');
    zmq_send(d, big.data(), big.size(), 0);
  } else if (attack == "malformed-loop") {
    void* d = Dealer(ctx, as.empty() ? "worker:0" : as, target);
    sockets.push_back(d);
    for (long i = 0; i < count && SendBitpush(d, std::string("\xff\xfe\xfd garbage", 12)); ++i) {
    }
  } else {
    return Usage(("unknown attack " + attack).c_str());
  }
  // Give ZeroMQ time to connect and flush (LINGER bounds it), then leave.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (void* s : sockets) zmq_close(s);
  zmq_ctx_term(ctx);
  std::printf("bitpush-test-attacker: %s sent to %s\n", attack.c_str(), target.c_str());
  return 0;
}
