// The daemon's round executor: the round thread (local reduce, or the GPU path, then
// Engine::PushPull) and the completion threads (wait for the handle, results out to every
// process, LocalPushPullDone).
// (Members of worker::Daemon, worker/daemon.h; the shared state is worker/daemon/daemon_state.h.)
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "common/logging.h"
#include "common/vector_ops.h"
#include "worker/daemon.h"
#include "worker/daemon/daemon_state.h"
#include "worker/ipc/local_protocol.h"

namespace bitpush::worker {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round thread: local reduce, then the engine.

void Daemon::RoundLoop() {
  for (;;) {
    std::unique_ptr<RoundJob> job;
    Status node_error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      round_cv_.wait(lock, [&] { return stop_threads_ || !round_queue_.empty(); });
      if (round_queue_.empty()) return;
      job = std::move(round_queue_.front());
      round_queue_.pop_front();
      node_error = node_error_;
    }
    TensorState& t = *job->tensor;
    if (job->declare) {
      if (node_error.ok()) {
        DeclareForNode(t);
      } else {
        t.verdict = node_error;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        declared_.push_back(&t);
      }
      const uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
      continue;
    }
    if (!node_error.ok()) {
      job->error = node_error;
    } else {
      // CUDA tensors take the GPU path (GpuReduce); everything else in the round is the same.
      std::vector<const void*> srcs;
      trace::Recorder* const tracer =
          engine_->trace() != nullptr && engine_->trace()->Wants(job->round) ? engine_->trace()
                                                                             : nullptr;
      const int64_t reduce_start = tracer ? trace::NowNs() : 0;
      if (t.cuda) job->error = GpuReduce(*job);
      for (const Slot& s : job->slots) {
        if (t.cuda) break;
        const Status size = s.in->CheckSize();
        if (!size.ok()) {
          job->error =
              DataLossError(fmt::format("{}: input of {}: {}", label_, s.who, size.message()));
          break;
        }
        srcs.push_back(static_cast<const uint8_t*>(s.in->data()) + s.in_offset);
      }
      if (job->error.ok() && !t.cuda) {
        job->error = reducer_->Reduce(t.dtype, srcs.data(), srcs.size(), t.buffer.data(),
                                      t.elements, t.scale);
      }
      if (tracer && job->error.ok()) {
        tracer->Span(trace::SpanKind::kLocalReduce, reduce_start, trace::NowNs(),
                     engine_->FirstKey(t.engine_id), job->round, t.elements * DTypeSize(t.dtype));
      }
      if (job->error.ok()) {
        job->handle =
            engine_->PushPull(t.engine_id, ConstTensorView(t.buffer.data(), t.elements, t.dtype),
                              TensorView(t.buffer.data(), t.elements, t.dtype));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_queue_.push_back(std::move(job));
    }
    done_cv_.notify_one();
  }
}

// ---------------------------------------------------------------------------------------------
// Completion threads: results out to every process.

void Daemon::DoneLoop() {
  for (;;) {
    std::unique_ptr<RoundJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return !done_queue_.empty() || stop_done_; });
      if (done_queue_.empty()) return;
      job = std::move(done_queue_.front());
      done_queue_.pop_front();
    }
    TensorState& t = *job->tensor;
    Status s = job->error.ok() ? job->handle.Wait() : job->error;
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!node_error_.ok() && s.code() == StatusCode::kCancelled) s = node_error_;
    }
    if (s.ok() && t.cuda) s = GpuBroadcast(*job);
    {
      // The engine is done with this round (its handle completed): error-feedback requests of
      // the processes that get their Done below may go ahead (RoundInEngine).
      std::lock_guard<std::mutex> lock(mu_);
      t.rounds_ended = job->round + 1;
    }
    for (const Slot& slot : job->slots) {
      Status mine = s;
      if (mine.ok() && !t.cuda) {
        const Status size = slot.out->CheckSize();
        if (size.ok()) {
          std::memcpy(static_cast<uint8_t*>(slot.out->data()) + slot.out_offset, t.buffer.data(),
                      t.bytes);
        } else {
          mine =
              DataLossError(fmt::format("{}: output of {}: {}", label_, slot.who, size.message()));
        }
      }
      SendDone(*slot.channel, t.index, job->round, mine, job->handle.bytes_pushed(),
               job->handle.bytes_pulled());
    }
    job.reset();  // drops the mappings a dead process's segments may still hold
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_.push_back(&t);
    }
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

// ---------------------------------------------------------------------------------------------
// The GPU path (CUDA tensors).

Status Daemon::GpuReduce(RoundJob& job) {
  TensorState& t = *job.tensor;
  std::vector<GpuContribution> inputs;
  inputs.reserve(job.slots.size());
  for (const Slot& s : job.slots) {
    inputs.push_back({static_cast<const float*>(s.gpu->data()), s.gpu->device(), s.who});
  }
  return gpu_->Reduce(inputs, t.first.name(), job.round, t.elements, &t.pinned,
                      reinterpret_cast<float*>(t.buffer.data()), t.scale);
}

Status Daemon::GpuBroadcast(RoundJob& job) {
  TensorState& t = *job.tensor;
  std::vector<float*> outs;
  outs.reserve(job.slots.size());
  for (const Slot& s : job.slots) outs.push_back(static_cast<float*>(s.gpu->data()));
  return gpu_->Broadcast(reinterpret_cast<const float*>(t.buffer.data()), t.elements, &t.pinned,
                         outs);
}

}  // namespace bitpush::worker
