// Checkpoints for C++ clients: bitpush's share of a training checkpoint (the model and
// optimizer state are the caller's). bitpush.torch.save_checkpoint is the Python equivalent.
//
// SaveCheckpoint: every worker of the job calls it after the same push_pulls, with the same
// tensors in the same order. Each writes `path` + ".node<rank>" (v1::WorkerCheckpoint,
// proto/bitpush/v1/checkpoint.proto): the tensors' declarations and the spec each travels
// with, the cluster's error_feedback, its worker residuals, and on node 0 the servers'
// residuals (Client::ServerErrorFeedbackState). The file appears whole (written aside, then
// renamed). Then the worker barrier, so every file exists when any call returns.
//
// LoadCheckpoint: every worker of the new job calls it with its own declarations before their
// first push_pull. It checks its node's file against the job — the number of workers,
// compression.error_feedback, and each tensor's name, elements, dtype and spec — and refuses
// a difference with InvalidArgument naming the file and the field; then it restores the worker
// residuals, moves every tensor to its saved round here and at its servers
// (Client::RestoreTensorRounds, so per-round random streams continue), node 0 restores the
// servers' residuals (after committing the declarations, a collective step), and it waits at
// the worker barrier. A job resumed this way continues bit for bit, random compressors too.
//
// Daemon mode: every local process would write the node's file; call it from local rank 0
// only (the daemon applies local rank 0's restores). The daemon relays the servers' residuals and
// the rounds (local protocol 1.5); an older one cannot: node 0's file then has no servers'
// residuals (logged) and the rounds are 0.
//
// Thread-safety: call from one thread per client, with no push_pull of `tensors` in flight.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "worker/client.h"

namespace bitpush::worker {

// `path` + ".node<rank>".
std::string CheckpointNodePath(const std::string& path, uint32_t rank);

Status SaveCheckpoint(Client& client, const std::vector<TensorId>& tensors,
                      const std::string& path);
Status LoadCheckpoint(Client& client, const std::vector<TensorId>& tensors,
                      const std::string& path);

}  // namespace bitpush::worker
