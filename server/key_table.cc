#include "server/key_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "optimizers/param_state.h"

namespace bitpush::server {

using transport::Buffer;
using v1::DataHeader;

namespace {

// The key's server-side optimizer from its OP_INIT_KEY (DataHeader::server_optimizer).
StatusOr<ServerOptimizerSpec> OptimizerFromWire(const v1::ServerOptimizer& w) {
  ServerOptimizerSpec o;
  BP_ASSIGN_OR_RETURN(o.update,
                      optimizers::MakeUpdateOptions(w.rule(), w.weight_decay(), w.momentum(),
                                                    w.nesterov(), w.beta1(), w.beta2(), w.eps()));
  BP_ASSIGN_OR_RETURN(o.pull, compressors::CanonicalizeCompressorConfig(w.pull()));
  o.difference = w.difference();
  return o;
}

}  // namespace

void KeyTable::Init(const DataTask& task) {
  const DataHeader& h = task.header;
  auto it = keys_.find(h.key());
  if (it != keys_.end()) {
    const DataHeader& first = it->second.init;
    if (first.element_count() != h.element_count() || first.dtype() != h.dtype() ||
        first.compressor_config().SerializeAsString() !=
            h.compressor_config().SerializeAsString() ||
        first.server_residual() != h.server_residual() || first.sum() != h.sum() ||
        first.server_optimizer().SerializeAsString() != h.server_optimizer().SerializeAsString()) {
      workers_->SendError(
          task.worker, DataHeader::OP_INIT_KEY, h.key(), 0,
          InvalidArgumentError(fmt::format(
              "key {} (tensor '{}'): worker {} declared {} elements of dtype {} with {} "
              "but another worker declared {} elements of dtype {} with {}",
              h.key(), h.tensor(), task.worker, h.element_count(), h.dtype(),
              compressors::CompressorSpecString(h.compressor_config()), first.element_count(),
              first.dtype(), compressors::CompressorSpecString(first.compressor_config()))));
    }
    return;
  }
  if (h.dtype() >= static_cast<uint32_t>(kNumDTypes)) {
    workers_->SendError(
        task.worker, DataHeader::OP_INIT_KEY, h.key(), 0,
        InvalidArgumentError(fmt::format("key {}: unknown dtype {}", h.key(), h.dtype())));
    return;
  }
  KeySpec spec;
  spec.key = h.key();
  spec.elements = h.element_count();
  spec.dtype = static_cast<DType>(h.dtype());
  spec.compressor = h.compressor_config();
  spec.server_residual = h.server_residual();
  spec.num_workers = workers_->count();
  spec.average = !h.sum();
  const std::string where = fmt::format("key {} (tensor '{}')", h.key(), h.tensor());
  if (h.has_server_optimizer()) {
    StatusOr<ServerOptimizerSpec> optimizer = OptimizerFromWire(h.server_optimizer());
    if (!optimizer.ok()) {
      workers_->SendError(task.worker, DataHeader::OP_INIT_KEY, h.key(), 0,
                          optimizer.status().WithContext(where + ": server-side optimizer"));
      return;
    }
    spec.optimizer = std::move(optimizer).value();
  }
  // Created on this (pinned) thread: first touch puts the key's buffers on its NUMA node. A key
  // with a server-side optimizer has no weights yet: OP_STATE_WRITE `weights` installs them.
  StatusOr<std::unique_ptr<KeyState>> state = KeyState::Create(spec);
  if (!state.ok()) {
    workers_->SendError(task.worker, DataHeader::OP_INIT_KEY, h.key(), 0,
                        state.status().WithContext(where));
    return;
  }
  KeyEntry entry;
  entry.state = std::move(state).value();
  entry.state->set_timed(trace_ != nullptr);  // the timeline's compress / optimizer spans
  entry.init = h;
  keys_.emplace(h.key(), std::move(entry));
}

void KeyTable::Push(DataTask& task) {
  const DataHeader& h = task.header;
  auto it = keys_.find(h.key());
  if (it == keys_.end()) {
    workers_->SendError(
        task.worker, DataHeader::OP_PUSH, h.key(), h.round(),
        NotFoundError(fmt::format("key {} is unknown here: its OP_INIT_KEY was refused "
                                  "(push from worker {}, round {})",
                                  h.key(), task.worker, h.round())));
    return;
  }
  KeyEntry& entry = it->second;
  std::vector<Buffer>& frames = task.message.frames;
  if (frames.size() != 1 || frames[0].size() != h.byte_count()) {
    workers_->SendError(
        task.worker, DataHeader::OP_PUSH, h.key(), h.round(),
        DataLossError(fmt::format(
            "key {}: push from worker {} in round {} has {} frame(s) of {} bytes, but its "
            "header announces one frame of {} bytes",
            h.key(), task.worker, h.round(), frames.size(), frames.empty() ? 0 : frames[0].size(),
            h.byte_count())));
    return;
  }
  const v1::CompressorId key_compressor = entry.state->spec().compressor.id();
  if (h.compressor() != key_compressor || h.element_count() != entry.state->spec().elements) {
    workers_->SendError(
        task.worker, DataHeader::OP_PUSH, h.key(), h.round(),
        InvalidArgumentError(fmt::format(
            "key {}: worker {} pushed {} elements compressed with {} but the key holds {} "
            "elements compressed with {}",
            h.key(), task.worker, h.element_count(), compressors::CompressorName(h.compressor()),
            entry.state->spec().elements,
            compressors::CompressorSpecString(entry.state->spec().compressor))));
    return;
  }
  const uint64_t published_before = entry.state->stats().rounds_published;
  const size_t push_bytes = frames[0].size();
  const bool traced = trace_ != nullptr && trace_->Wants(h.round());
  const int64_t push_start = traced ? trace::NowNs() : 0;
  // Moved, not copied: a buffer nobody else holds may become the round's accumulator.
  const Status pushed =
      h.has_lr() ? entry.state->Push(task.worker, h.round(), std::move(frames[0]), h.lr())
                 : entry.state->Push(task.worker, h.round(), std::move(frames[0]));
  if (!pushed.ok()) {
    workers_->SendError(task.worker, DataHeader::OP_PUSH, h.key(), h.round(), pushed);
    return;
  }
  if (traced) TracePush(task, push_start, push_bytes, *entry.state, published_before);
  if (h.non_finite()) {
    entry.state->NoteNonFinite(h.round(), fmt::format("worker {}'s gradient", task.worker));
  }
  ++counters_->pushes_accepted;
  counters_->bytes_received += push_bytes;
  counters_->raw_bytes_received += h.element_count() * DTypeSize(static_cast<DType>(h.dtype()));
  entry.waiting.emplace_back(task.worker, h.round());
  for (const KeyState::LateRejection& late : entry.state->TakeLateRejections()) {
    --counters_->pushes_accepted;
    auto w = std::find(entry.waiting.begin(), entry.waiting.end(),
                       std::make_pair(late.worker, late.round));
    if (w != entry.waiting.end()) entry.waiting.erase(w);
    workers_->SendError(late.worker, DataHeader::OP_PUSH, h.key(), late.round, late.status);
  }
  counters_->rounds_published += entry.state->stats().rounds_published - published_before;
  compressors::CompressorTelemetry telemetry;  // the reply's quantiser (loco two-hop)
  entry.state->TakeTelemetry(&telemetry);
  if (entry.state->stats().rounds_published != published_before) {
    // This push completed round h.round(): the aggregate's compression saw it whole (onebit's
    // scale), so a NaN / inf there that no worker flagged is the aggregate's own (an overflow).
    if (telemetry.input_checked && telemetry.input_non_finite) {
      entry.state->NoteNonFinite(h.round(), fmt::format("server {}'s aggregate", rank_));
    }
    if (!entry.state->NonFiniteOrigin(h.round()).empty()) ++counters_->non_finite_rounds;
  }
  if (telemetry.values != 0) {
    counters_->quantized_values += telemetry.values;
    counters_->quantized_saturated += telemetry.saturated;
    counters_->error_values += telemetry.error_values;
    counters_->error_saturated += telemetry.error_saturated;
  }
  ServeWaiting(entry);
}

void KeyTable::State(const DataTask& task) {
  const DataHeader& h = task.header;
  auto it = keys_.find(h.key());
  if (it == keys_.end()) {
    workers_->SendError(
        task.worker, h.op(), h.key(), 0,
        NotFoundError(fmt::format("key {} is unknown here: its OP_INIT_KEY was refused", h.key())));
    return;
  }
  KeyState& state = *it->second.state;
  DataHeader reply;
  reply.set_op(DataHeader::OP_STATE_REPLY);
  reply.set_key(h.key());
  reply.set_refused_op(h.op());  // which request this answers
  if (h.weights()) {
    Weights(it->second, task, std::move(reply));
    return;
  }
  if (h.optimizer_state()) {
    reply.set_optimizer_state(true);
    const std::string context = fmt::format("server {}: key {}'s optimizer state", rank_, h.key());
    if (h.op() == DataHeader::OP_STATE_READ) {
      StatusOr<std::string> saved = state.SaveOptimizerState();
      if (!saved.ok()) {
        workers_->SendError(task.worker, h.op(), h.key(), 0, saved.status().WithContext(context));
        return;
      }
      reply.set_byte_count(saved->size());
      workers_->Send(task.worker, std::move(reply), {Buffer::Copy(saved->data(), saved->size())});
      return;
    }
    const std::vector<Buffer>& frames = task.message.frames;
    const Status restored =
        frames.size() != 1
            ? DataLossError(
                  fmt::format("an optimizer state to restore is one frame, got {}", frames.size()))
            : state.RestoreOptimizerState(std::string_view(
                  reinterpret_cast<const char*>(frames[0].data()), frames[0].size()));
    if (!restored.ok()) {
      workers_->SendError(task.worker, h.op(), h.key(), 0, restored.WithContext(context));
      return;
    }
    workers_->Send(task.worker, std::move(reply), {});
    AnswerWeightReaders(it->second);
    return;
  }
  if (h.rounds() && h.op() == DataHeader::OP_STATE_WRITE) {
    reply.set_rounds(true);
    if (const Status s = state.RestoreRounds(h.round()); !s.ok()) {
      workers_->SendError(
          task.worker, h.op(), h.key(), 0,
          s.WithContext(fmt::format("server {}: restoring key {}'s rounds", rank_, h.key())));
      return;
    }
    workers_->Send(task.worker, std::move(reply), {});
    return;
  }
  if (h.op() == DataHeader::OP_STATE_READ) {
    const Span<const float> residual = state.server_residual();
    const size_t bytes = residual.size() * sizeof(float);
    reply.set_element_count(residual.size());
    reply.set_byte_count(bytes);
    workers_->Send(task.worker, std::move(reply), {Buffer::Copy(residual.data(), bytes)});
    return;
  }
  const std::vector<Buffer>& frames = task.message.frames;
  Status s;
  if (frames.size() != 1 || frames[0].size() % sizeof(float) != 0) {
    s =
        DataLossError(fmt::format("key {}: a residual to restore is one frame of float32, got {} "
                                  "frame(s) of {} bytes",
                                  h.key(), frames.size(), frames.empty() ? 0 : frames[0].size()));
  } else if (state.RoundOpen()) {
    s = FailedPreconditionError(fmt::format(
        "key {}: a round is open (pushed, not yet pulled by every worker); restore the server "
        "residual before the first push_pull",
        h.key()));
  } else if (!(frames[0].size() == 0 && state.server_residual().size() == 0)) {
    std::vector<float> values(frames[0].size() / sizeof(float));
    if (!values.empty()) std::memcpy(values.data(), frames[0].data(), frames[0].size());
    s = state.RestoreServerResidual(values);
  }
  if (!s.ok()) {
    workers_->SendError(task.worker, h.op(), h.key(), 0,
                        s.WithContext(fmt::format("server {}: restoring key {}", rank_, h.key())));
    return;
  }
  workers_->Send(task.worker, std::move(reply), {});
}

void KeyTable::TracePush(const DataTask& task, int64_t start_ns, size_t bytes,
                         const KeyState& state, uint64_t published_before) {
  const DataHeader& h = task.header;
  const auto worker = static_cast<int32_t>(task.worker);
  const int64_t end_ns = trace::NowNs();
  const int64_t received = task.received_ns != 0 ? task.received_ns : start_ns;
  trace_->Span(trace::SpanKind::kPushReceived, received, received, h.key(), h.round(), bytes,
               worker);
  trace_->Span(trace::SpanKind::kQueued, received, start_ns, h.key(), h.round(), bytes, worker);
  const KeyStats& s = state.stats();
  if (s.rounds_published == published_before || s.last_publish_start_ns < start_ns) {
    trace_->Span(trace::SpanKind::kSum, start_ns, end_ns, h.key(), h.round(), bytes, worker);
    return;
  }
  // This push completed the round: the sum, then the publication (compress or optimizer).
  const int64_t publish_end = s.last_publish_start_ns + s.last_publish_ns;
  trace_->Span(trace::SpanKind::kSum, start_ns, s.last_publish_start_ns, h.key(), h.round(), bytes,
               worker);
  trace_->Span(state.spec().optimizer ? trace::SpanKind::kOptimizer : trace::SpanKind::kCompress,
               s.last_publish_start_ns, publish_end, h.key(), h.round(), s.bytes_published);
}

void KeyTable::ServeWaiting(KeyEntry& entry) {
  KeyState& state = *entry.state;
  for (size_t i = 0; i < entry.waiting.size();) {
    const auto [worker, round] = entry.waiting[i];
    if (!state.RoundPublished(round)) {
      ++i;
      continue;
    }
    std::string non_finite_origin = state.NonFiniteOrigin(round);  // before Pull frees the slot
    StatusOr<Buffer> payload = state.Pull(worker, round);
    entry.waiting.erase(entry.waiting.begin() + static_cast<std::ptrdiff_t>(i));
    if (!payload.ok()) {
      workers_->SendError(worker, DataHeader::OP_PUSH, state.spec().key, round, payload.status());
      continue;
    }
    DataHeader reply;
    reply.set_op(DataHeader::OP_PULL_REPLY);
    reply.set_key(state.spec().key);
    reply.set_round(round);
    reply.set_compressor(state.spec().compressor.id());
    reply.set_element_count(state.spec().elements);
    reply.set_dtype(static_cast<uint32_t>(state.spec().dtype));  // the aggregate's payload dtype
    reply.set_byte_count(payload->size());
    if (!non_finite_origin.empty()) reply.set_non_finite_origin(std::move(non_finite_origin));
    counters_->bytes_sent += payload->size();
    counters_->raw_bytes_sent += state.spec().elements * DTypeSize(state.spec().dtype);
    ++counters_->replies_sent;
    const size_t reply_bytes = payload->size();
    const bool traced = trace_ != nullptr && trace_->Wants(round);
    const int64_t send_start = traced ? trace::NowNs() : 0;
    workers_->Send(worker, std::move(reply), {std::move(payload).value()});
    if (traced) {
      trace_->Span(trace::SpanKind::kReplySent, send_start, trace::NowNs(), state.spec().key, round,
                   reply_bytes, static_cast<int32_t>(worker));
    }
  }
}

void KeyTable::Weights(KeyEntry& entry, const DataTask& task, DataHeader reply) {
  const DataHeader& h = task.header;
  KeyState& state = *entry.state;
  const std::string context =
      fmt::format("server {}: key {} (tensor '{}')", rank_, h.key(), entry.init.tensor());
  if (!state.spec().optimizer) {
    workers_->SendError(
        task.worker, h.op(), h.key(), 0,
        FailedPreconditionError(context + ": its optimizer does not run on the server (no weights "
                                          "here)"));
    return;
  }
  if (h.op() == DataHeader::OP_STATE_READ) {
    if (state.weights_installed()) {
      SendWorkersWeights(entry, task.worker);
    } else if (std::find(entry.weight_readers.begin(), entry.weight_readers.end(), task.worker) ==
               entry.weight_readers.end()) {
      entry.weight_readers.push_back(task.worker);  // answered at the install
    }
    return;
  }
  const std::vector<Buffer>& frames = task.message.frames;
  const size_t n = state.spec().elements;
  if (frames.size() != 1 || frames[0].size() != n * sizeof(float)) {
    workers_->SendError(
        task.worker, h.op(), h.key(), 0,
        DataLossError(fmt::format(
            "{}: starting weights are one frame of {} float32 ({} bytes); got {} frame(s) "
            "of {} bytes",
            context, n, n * sizeof(float), frames.size(), frames.empty() ? 0 : frames[0].size())));
    return;
  }
  std::vector<float> weights(n);
  if (n > 0) std::memcpy(weights.data(), frames[0].data(), frames[0].size());
  if (Status st = state.InstallWeights({weights.data(), weights.size()}); !st.ok()) {
    workers_->SendError(task.worker, h.op(), h.key(), 0, st.WithContext(context));
    return;
  }
  reply.set_weights(true);
  workers_->Send(task.worker, std::move(reply), {});
  AnswerWeightReaders(entry);
}

void KeyTable::AnswerWeightReaders(KeyEntry& entry) {
  if (!entry.state->weights_installed()) return;
  std::vector<uint32_t> readers = std::move(entry.weight_readers);
  entry.weight_readers.clear();
  for (uint32_t worker : readers) SendWorkersWeights(entry, worker);
}

void KeyTable::SendWorkersWeights(KeyEntry& entry, uint32_t worker) {
  const uint64_t key = entry.state->spec().key;
  StatusOr<std::vector<float>> w = entry.state->WorkersWeights();
  if (!w.ok()) {
    workers_->SendError(
        worker, DataHeader::OP_STATE_READ, key, 0,
        w.status().WithContext(fmt::format("server {}: key {}'s weights", rank_, key)));
    return;
  }
  DataHeader reply;
  reply.set_op(DataHeader::OP_STATE_REPLY);
  reply.set_key(key);
  reply.set_refused_op(DataHeader::OP_STATE_READ);
  reply.set_weights(true);
  reply.set_round(entry.state->next_round(worker));  // where the worker's rounds continue
  reply.set_element_count(w->size());
  reply.set_byte_count(w->size() * sizeof(float));
  workers_->Send(worker, std::move(reply), {Buffer::Copy(w->data(), w->size() * sizeof(float))});
}

}  // namespace bitpush::server
