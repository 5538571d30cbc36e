// The daemon's declarations: gathering every local process's LocalDeclare of a tensor,
// checking they agree, declaring it once in the engine for the node (round thread) and
// answering the verdict (poll loop).
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

void Daemon::OnDeclare(Conn& c, const v1::LocalDeclare& d) {
  auto reply = [&](ipc::Channel& ch, const Status& s) {
    v1::LocalMessage m;
    v1::LocalDeclareReply* r = m.mutable_declare_reply();
    r->set_index(d.index());
    r->set_status_code(static_cast<uint32_t>(s.code()));
    r->set_message(s.message());
    (void)ipc::SendLocalMessage(ch, m);
  };
  if (d.index() == tensors_.size()) {
    auto t = std::make_unique<TensorState>();
    t->index = d.index();
    t->first = d;
    t->first_who = c.who;
    tensors_.push_back(std::move(t));
  }
  TensorState& t = *tensors_[d.index()];
  if (t.decided) {
    reply(*c.channel, t.verdict);
    return;
  }
  if (t.declared > 0) {
    if (std::optional<std::string> diff =
            ipc::DeclarationDifference(t.first, t.first_who, d, c.who)) {
      t.decided = true;
      t.verdict = InvalidArgumentError(*diff);
      if (decl_error_.ok()) {
        decl_error_ = t.verdict;
        decl_error_deadline_ = Clock::now() + gather_timeout_;
      }
      BP_LOG_ERROR("{}: {}", label_, *diff);
      for (const auto& ch : t.waiting) reply(*ch, t.verdict);
      t.waiting.clear();
      reply(*c.channel, t.verdict);
      return;
    }
  }
  t.waiting.push_back(c.channel);
  if (++t.declared < local_size_) return;
  // Every local process declared the same: declare it once for the node — on the round
  // thread, in order with the rounds already dispatched. The engine announces the tensors
  // declared since its last check with the next push_pull, and that push_pull runs on the round
  // thread: declaring there too makes what is announced with which round the same on every
  // node (each process declares and pushes in the same order), never a race between this loop
  // and the round thread. The verdict comes back through FinishDeclaration.
  auto job = std::make_unique<RoundJob>();
  job->tensor = &t;
  job->declare = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_queue_.push_back(std::move(job));
  }
  round_cv_.notify_one();
}

void Daemon::DeclareForNode(TensorState& t) {
  const v1::LocalDeclare& d = t.first;
  if (d.dtype() > static_cast<uint32_t>(DType::kBFloat16)) {
    t.verdict = InvalidArgumentError(
        fmt::format("tensor #{} '{}': unknown dtype {}", d.index(), d.name(), d.dtype()));
    return;
  }
  TensorOptions o;
  o.priority = d.priority();
  o.compression = d.compression();
  o.op = d.sum() ? ReduceOp::kSum : ReduceOp::kAverage;
  t.dtype = static_cast<DType>(d.dtype());
  t.elements = d.elements();
  t.bytes = t.elements * DTypeSize(t.dtype);
  t.cuda = d.cuda();
  t.verdict = Status::Ok();
  if (t.cuda) {
    // The GPU path needs CUDA + NCCL here and a usable GPU; fp32 only (the cast kernels).
    t.verdict = gpu::GpuViability();
    if (t.verdict.ok() && t.dtype != DType::kFloat32) {
      t.verdict = InvalidArgumentError("a CUDA tensor must be float32");
    }
    if (t.verdict.ok()) {
      StatusOr<gpu::PinnedBuffer> pinned = gpu::PinnedBuffer::Allocate(t.elements * 2);
      t.verdict = pinned.status();
      if (pinned.ok()) t.pinned = std::move(pinned).value();
    }
    if (!t.verdict.ok()) {
      t.verdict = t.verdict.WithContext(
          fmt::format("{}: tensor #{} '{}' is on a GPU but this daemon cannot run the GPU path",
                      label_, d.index(), d.name()));
    }
  }
  StatusOr<TensorId> id =
      t.verdict.ok() ? engine_->Declare(d.name(), t.elements, t.dtype, o) : t.verdict;
  t.verdict = id.status();
  if (id.ok()) {
    t.engine_id = *id;
    t.scale = d.sum()                  ? 1.0f
              : average_scale_ != 0.0f ? average_scale_
              : local_size_ == 1       ? 1.0f
                                       : 1.0f / static_cast<float>(local_size_);
    t.buffer.resize(t.bytes);
  }
}

void Daemon::FinishDeclaration(TensorState& t) {
  t.decided = true;
  if (t.verdict.ok()) {
    t.present.assign(local_size_, false);
    t.slots.resize(local_size_);
  } else if (decl_error_.ok()) {
    // A refused tensor (bad spec, GPU path not viable, ...) ends the node like a declaration
    // difference: every process is told, and may leave without being a failure.
    decl_error_ = t.verdict;
    decl_error_deadline_ = Clock::now() + gather_timeout_;
    BP_LOG_ERROR("{}: {}", label_, t.verdict.message());
  }
  for (const auto& ch : t.waiting) {
    v1::LocalMessage m;
    v1::LocalDeclareReply* r = m.mutable_declare_reply();
    r->set_index(t.index);
    r->set_status_code(static_cast<uint32_t>(t.verdict.code()));
    r->set_message(t.verdict.message());
    (void)ipc::SendLocalMessage(*ch, m);
  }
  t.waiting.clear();
}

}  // namespace bitpush::worker
