// DeclarationCheck: server 0's check that every worker declared the same tensors
// (docs/data-plane.md "Declaration check"). Each OP_DECLARE carries one worker's manifest for a
// declaration epoch; once every worker's manifest of the epoch is here they are compared tensor
// by tensor in index order, and every worker gets OP_DECLARE_REPLY, or OP_ERROR naming the
// first differing tensor. Another server refuses OP_DECLARE.
//
// Owned by the dispatcher; runs on the endpoint's loop (manifests are small).
//
// Thread-safety: not thread-safe (the dispatcher's handlers run one at a time).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "common/transport/message.h"
#include "proto/bitpush/v1/control.pb.h"
#include "server/worker_peers.h"

namespace bitpush::server {

class DeclarationCheck {
 public:
  DeclarationCheck(uint32_t rank, WorkerPeers* workers) : rank_(rank), workers_(workers) {}

  // Worker `worker`'s OP_DECLARE (`header.round()` is the epoch).
  void Declare(uint32_t worker, const v1::DataHeader& header, const transport::Message& message);
  // Forgets every epoch being collected (a new data-plane generation).
  void Clear() { epochs_.clear(); }

 private:
  // A declaration epoch being collected.
  struct Epoch {
    std::vector<std::optional<v1::TensorManifest>> manifests;
    uint32_t received = 0;
  };

  const uint32_t rank_;
  WorkerPeers* const workers_;
  std::map<uint64_t, Epoch> epochs_;
};

}  // namespace bitpush::server
