// OpState: the shared state of one push_pull, referenced by the worker engine (its queues,
// pool jobs and I/O handlers) and by every copy of its handle (PushPullHandle, client.h), so
// a handle may outlive the engine. The daemon-mode client (daemon_client.h) completes its own.
//
// Thread-safety: the fields set at creation are read-only afterwards; the progress fields are
// guarded by the engine's mu (EngineState::mu, worker/engine/engine_state.h); the completion
// fields by the OpState's own mu, which nests inside the engine's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "common/status.h"
#include "worker/client.h"

namespace bitpush::worker {

using EngineClock = std::chrono::steady_clock;

// The shared state of one push_pull, referenced by the engine and by every copy of its
// handle.
struct OpState {
  // Set at creation, then read-only.
  std::string tensor;  // name, for messages
  uint32_t tensor_index = 0;
  ConstTensorView input;
  TensorView output;
  // Server-side optimizer tensors: the round's learning rate, sent with every push.
  std::optional<float> lr;
  // The worker residual's decay for this round's compressions (the tensor's
  // SetErrorFeedbackDecay when the op was queued; CompressContext::residual_decay).
  float residual_decay = 1.0f;
  EngineClock::time_point deadline;
  EngineClock::time_point started = EngineClock::now();

  // Progress: guarded by the engine's mu (EngineState::mu).
  size_t remaining = 0;  // partitions not yet complete
  // Pool jobs that may touch input/output, and pushes whose frames borrow the input (`none`:
  // sent from the input itself) until the transport lets go of them: the op completes, even
  // when it failed, only once none is left.
  uint32_t active_jobs = 0;
  bool failed = false;
  bool finished = false;                  // completion signalled (or about to be)
  EngineClock::time_point last_push{};    // the latest partition push sent
  EngineClock::time_point first_reply{};  // the first reply received (epoch: none yet)
  Status error;
  // Compressed payload bytes this op sent to and received from the servers (the daemon reports
  // them to its processes with the round's result).
  std::atomic<uint64_t> bytes_pushed{0};
  std::atomic<uint64_t> bytes_pulled{0};

  // Completion: guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  // Completes the op now (for ops that never reach the engine's queues).
  void Complete(Status s);
};

}  // namespace bitpush::worker
