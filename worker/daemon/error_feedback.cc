// The daemon's error-feedback state: reads and restores of the node's worker residual, the
// servers' residual and the tensors' rounds for the local processes (LocalErrorFeedback and its
// `state`; "Error-feedback state" in worker/daemon.h). Poll loop; the servers' residual is a
// round trip to the servers (bounded by op_timeout) during which the loop waits.
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

bool Daemon::RoundInEngine(const TensorState& t) {
  if (!t.in_flight) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return t.rounds_ended <= t.flight_round;
}

void Daemon::OnErrorFeedback(Conn& c, const v1::LocalErrorFeedback& e) {
  const v1::LocalErrorFeedback::State state = e.state();
  const bool server = state == v1::LocalErrorFeedback::STATE_SERVER_RESIDUAL;
  const bool rounds = state == v1::LocalErrorFeedback::STATE_ROUNDS;
  const char* what = rounds        ? (e.restore() ? "restoring the rounds" : "rounds")
                     : server      ? (e.restore() ? "restoring the servers' error-feedback state"
                                                  : "the servers' error-feedback state")
                     : e.restore() ? "restoring the error-feedback state"
                                   : "error-feedback state";
  auto answer = [&](const Status& s, uint64_t values, bool applied) {
    v1::LocalMessage m;
    v1::LocalErrorFeedbackDone* d = m.mutable_error_feedback_done();
    d->set_seq(e.seq());
    d->set_tensor(e.tensor());
    d->set_status_code(static_cast<uint32_t>(s.code()));
    d->set_message(s.message());
    d->set_values(values);
    d->set_applied(applied);
    const Status sent = ipc::SendLocalMessage(*c.channel, m);
    if (!sent.ok()) BP_LOG_DEBUG("{}: {}", label_, sent.ToString());
  };
  auto refuse = [&](const Status& s) { answer(s, 0, false); };
  if (e.tensor() >= tensors_.size() || !tensors_[e.tensor()]->decided) {
    return refuse(NotFoundError(
        fmt::format("{}: {} of tensor #{} asked by {}: no such tensor declared by every local "
                    "process",
                    label_, what, e.tensor(), c.who)));
  }
  TensorState& t = *tensors_[e.tensor()];
  const std::string name = t.first.name();
  if (!t.verdict.ok()) return refuse(t.verdict);
  if (!t.error.ok()) return refuse(t.error);
  if (c.local_rank < t.present.size() && t.present[c.local_rank]) {
    return refuse(FailedPreconditionError(
        fmt::format("{}: {} of tensor '{}' asked by {}: its push_pull of round {} is in flight "
                    "(handed in, waiting for the other local processes)",
                    label_, what, name, c.who, t.round)));
  }
  if (RoundInEngine(t)) {
    return refuse(FailedPreconditionError(
        fmt::format("{}: {} of tensor '{}' asked by {}: round {} of it is in flight", label_, what,
                    name, c.who, t.flight_round)));
  }
  if (rounds) {
    // No slice: the count travels in `values` both ways. Applied from local rank 0 of the node;
    // the others' are acknowledged (every local process restores, as every worker does).
    if (!e.restore()) {
      StatusOr<uint64_t> done = engine_->TensorRounds(t.engine_id);
      if (!done.ok()) return refuse(done.status().WithContext(label_));
      return answer(Status::Ok(), *done, false);
    }
    if (c.local_rank != 0) return answer(Status::Ok(), e.values(), false);
    const Status s = engine_->RestoreTensorRounds(t.engine_id, e.values());
    return s.ok() ? answer(s, e.values(), true) : refuse(s.WithContext(label_));
  }
  if (state != v1::LocalErrorFeedback::STATE_WORKER_RESIDUAL && !server) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: state {} of tensor '{}' asked by {}: no such state (a newer client?)",
                    label_, static_cast<int>(state), name, c.who)));
  }
  const std::string slice_what = fmt::format("{}: {} of tensor '{}' ({} x float32) asked by {}",
                                             label_, what, name, t.elements, c.who);
  StatusOr<std::shared_ptr<ipc::ShmSegment>> seg =
      MapSlice(c, e.slice(), t.elements * sizeof(float), slice_what);
  if (!seg.ok()) return refuse(seg.status());
  float* values =
      reinterpret_cast<float*>(static_cast<uint8_t*>((*seg)->data()) + e.slice().offset());
  if (!e.restore()) {
    StatusOr<std::vector<float>> state = server ? engine_->ServerErrorFeedbackState(t.engine_id)
                                                : engine_->ErrorFeedbackState(t.engine_id);
    if (!state.ok()) return refuse(state.status().WithContext(label_));
    if (state->size() > t.elements) {
      // The slice carries one value per element; a method whose state keeps more (binsgdm's
      // m, b and e) is read and restored in embedded mode.
      return refuse(UnimplementedError(
          fmt::format("{}: tensor '{}' keeps {} state values for {} elements (its method's "
                      "worker state holds more than one value per element); daemon mode "
                      "carries one per element: read and restore it in embedded mode",
                      label_, name, state->size(), t.elements)));
    }
    if (!state->empty()) std::memcpy(values, state->data(), state->size() * sizeof(float));
    return answer(Status::Ok(), state->size(), false);
  }
  if (e.values() > t.elements) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} values given, the tensor has {}", slice_what, e.values(), t.elements)));
  }
  const Span<const float> saved(values, e.values());
  if (c.local_rank == 0) {
    const Status s = server ? engine_->RestoreServerErrorFeedbackState(t.engine_id, saved)
                            : engine_->RestoreErrorFeedbackState(t.engine_id, saved);
    return s.ok() ? answer(s, e.values(), true) : refuse(s.WithContext(label_));
  }
  // The servers' residual is restored by one process of the job (bitpush.torch's rank 0): a
  // restore from another local rank is acknowledged, not applied (reading the servers' size to
  // check it would cost a round trip to every server).
  if (server) return answer(Status::Ok(), e.values(), false);
  // Not local rank 0: checked like rank 0's (the size the tensor keeps), not applied.
  StatusOr<std::vector<float>> kept = engine_->ErrorFeedbackState(t.engine_id);
  if (!kept.ok()) return refuse(kept.status().WithContext(label_));
  if (kept->empty() && !saved.empty()) {
    return refuse(InvalidArgumentError(fmt::format(
        "{}: it keeps no worker residual (uncompressed, or compression.error_feedback keeps none "
        "on workers) but {} values were given",
        slice_what, saved.size())));
  }
  if (!kept->empty() && saved.size() != kept->size()) {
    return refuse(InvalidArgumentError(fmt::format("{}: {} values given, the tensor has {}",
                                                   slice_what, saved.size(), t.elements)));
  }
  answer(Status::Ok(), e.values(), false);
}

}  // namespace bitpush::worker
