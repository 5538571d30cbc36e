// RoundPipeline: one partition's round on the data plane — compress (with the worker's error
// feedback) -> push -> the server's reply -> decompress -> complete (docs/data-plane.md, paper
// 001 Algorithms 3 and 4) — and the compression pool that runs it. Owned by the Engine
// (worker/engine.h); PartitionScheduler (partition_scheduler.h) decides when a partition
// starts (PostCompressLocked) and takes it back when the round ends (its *Locked methods).
//
// Threads (docs/threading.md, "worker"):
//  - the compression pool (worker.compress_threads; auto = CPUs this process may use, 1..8)
//    runs compress + push jobs and decompress + complete jobs (the latter first: they return
//    credit);
//  - the endpoint's I/O thread delivers OP_PULL_REPLY (OnReply), a refused push's OP_ERROR
//    (OnPushRefused) and failed sends (OnSendFailed): it matches a reply to the partition's
//    in-flight round and queues the decompress job (never decompressing there);
//  - the transport's threads let go of a `none` push's frames (InputLease).
// A partition's compressor, residual and payload belong to the job that moved it into
// compressing / decompressing (engine_state.h, "Partition ownership"); the telemetry sums
// below are guarded by EngineState::mu.
//
// Thread-safety: every method may be called from any thread; PostCompressLocked with
// EngineState::mu held, the others without it. Sends happen outside mu.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/node/endpoint.h"
#include "common/status.h"
#include "worker/engine/engine_state.h"
#include "worker/engine/partition_scheduler.h"
#include "worker/task_pool.h"

namespace bitpush::worker {

class RoundPipeline {
 public:
  RoundPipeline(EngineState& state, PartitionScheduler& scheduler);
  RoundPipeline(const RoundPipeline&) = delete;
  RoundPipeline& operator=(const RoundPipeline&) = delete;

  // Starts the compression pool (thread i on cpus[i % size]; empty: not pinned). Stop runs
  // what is queued (every job of a failed op only cleans up) and joins it.
  void Start(const std::vector<int>& cpus);
  void Stop();
  uint32_t threads() const { return pool_ ? pool_->size() : 0; }

  // PartitionScheduler::StartJob (mu held): posts the compress + push job of partition `j`.
  bool PostCompressLocked(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                          uint64_t round);

  // The endpoint's handlers (its I/O thread).
  void OnReply(const std::string& from, const v1::DataHeader& h, transport::Message& msg);
  // An OP_ERROR that refused a push.
  void OnPushRefused(const std::string& from, const v1::DataHeader& h);
  // A push that never left: fails the ops waiting on that server.
  void OnSendFailed(const std::string& peer, const Status& why);

 private:
  // A pool job's first step: if its op already failed, give the partition back and end the
  // job (true).
  bool DropJobIfFailed(Tensor& t, Partition& p, const std::shared_ptr<OpState>& op);
  // Pool jobs. `t` stays valid (tensors are never removed); the job owns partition `j`.
  void CompressAndPush(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op, uint64_t round);
  // The owner of a push frame that borrows op's input: one of op's active jobs (the caller
  // counted it, under mu), done when the transport drops the frame's last reference, on
  // whichever thread that is (Send's caller when the transport copies or refuses the frames,
  // its I/O thread after the send). That thread takes mu, so the engine never lets a Message
  // go, nor calls the transport, while holding mu; the transport lets every frame go by the
  // end of Close (and, ucx, within send_complete_timeout of the send).
  std::shared_ptr<const void> InputLease(Tensor* t, const std::shared_ptr<OpState>& op);
  void DecompressAndComplete(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                             const transport::Buffer& payload);
  // Rank 0, mu held: one warning line per tensor whose quantiser (loco) saturates more than
  // kSaturationWarnPercent of a push's values in its first kSaturationWarnRounds rounds, for
  // at most kSaturationWarnTensors tensors (then one line saying the rest go unlogged).
  void WarnSaturationLocked(Tensor& t, uint32_t j, uint64_t round,
                            const compressors::CompressorTelemetry& telemetry);

  EngineState& state_;
  PartitionScheduler& scheduler_;
  std::unique_ptr<TaskPool> pool_;
  double error_sq_ = 0;          // sum of Partition::error_sq; guarded by mu
  double gradient_sq_ = 0;       // sum of Partition::gradient_sq; guarded by mu
  int saturation_warnings_ = 0;  // tensors warned about (WarnSaturationLocked); guarded by mu
};

}  // namespace bitpush::worker
