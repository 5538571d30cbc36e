#include "worker/engine/round_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/logging.h"
#include "common/vector_ops.h"
#include "compressors/registry.h"

namespace bitpush::worker {

namespace {

using compressors::CompressContext;

// The saturation warning (RoundPipeline::WarnSaturationLocked): above 5 % of a push's 4-bit
// values clamped, in a tensor's first 3 rounds, for at most 4 tensors.
constexpr uint64_t kSaturationWarnPercent = 5;
constexpr uint64_t kSaturationWarnRounds = 3;
constexpr int kSaturationWarnTensors = 4;

// A scale as written in a spec, "2^19" where it is a power of two.
std::string ScaleText(double s) {
  int e = 0;
  if (std::frexp(s, &e) == 0.5 && e - 1 >= -126 && e - 1 <= 127) return fmt::format("2^{}", e - 1);
  return fmt::format("{:g}", s);
}

}  // namespace

RoundPipeline::RoundPipeline(EngineState& state, PartitionScheduler& scheduler)
    : state_(state), scheduler_(scheduler) {}

void RoundPipeline::Start(const std::vector<int>& cpus) {
  pool_ = std::make_unique<TaskPool>(ResolveCompressThreads(state_.cluster.worker.compress_threads),
                                     "bp-wpool", cpus);
}

void RoundPipeline::Stop() {
  if (pool_) pool_->Shutdown();
}

bool RoundPipeline::PostCompressLocked(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                                       uint64_t round) {
  return pool_->Post([this, t, j, op, round] { CompressAndPush(t, j, op, round); });
}

// ---------------------------------------------------------------------------------------------
// Pool jobs

bool RoundPipeline::DropJobIfFailed(Tensor& t, Partition& p, const std::shared_ptr<OpState>& op) {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (!op->failed) return false;
  scheduler_.SetIdleLocked(t, p);
  scheduler_.JobDoneLocked(t, op);
  return true;
}

void RoundPipeline::CompressAndPush(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                                    uint64_t round) {
  Partition& p = t->partitions[j];
  if (DropJobIfFailed(*t, p, op)) return;
  const size_t esz = DTypeSize(t->dtype);
  const ConstTensorView in(static_cast<const uint8_t*>(op->input.data()) + p.range.offset * esz,
                           p.range.elements, t->dtype);
  CompressContext ctx{p.range.key, round, state_.rank};
  ctx.residual_decay = op->residual_decay;
  const EngineClock::time_point t0 = EngineClock::now();
  // `none` (no residual): the payload is its header and the input's bytes, sent as one frame
  // from the input itself (glued), not compressed into a copy.
  uint8_t raw_header[compressors::kPayloadHeaderBytes];
  const bool raw = !p.residual && p.compressor->RawBodyHeader(in, ctx, raw_header);
  const size_t in_bytes = p.range.elements * esz;
  StatusOr<size_t> bytes = compressors::kPayloadHeaderBytes + in_bytes;
  if (!raw) {
    const size_t max_bytes = p.compressor->MaxCompressedBytes(p.range.elements, t->dtype);
    // The previous payload is reused once the transport (and the server) let go of it.
    if (!p.payload || p.payload.use_count() > 1) {
      p.payload = std::make_shared<std::vector<uint8_t>>(max_bytes);
    } else if (p.payload->size() < max_bytes) {
      p.payload->resize(max_bytes);
    }
    MutableByteSpan out(p.payload->data(), p.payload->size());
    bytes = p.residual ? p.residual->Compress(*p.compressor, in, ctx, out)
                       : p.compressor->Compress(in, ctx, out);
  }
  const EngineClock::time_point t1 = EngineClock::now();
  trace::Recorder* const tracer =
      state_.trace && state_.trace->Wants(round) ? state_.trace : nullptr;
  if (tracer && bytes.ok()) {
    tracer->Span(trace::SpanKind::kCompress, trace::ToNs(t0), trace::ToNs(t1), p.range.key, round,
                 *bytes, -1, static_cast<int32_t>(p.server));
  }
  compressors::CompressorTelemetry telemetry;  // quantisers (loco) and states (separate)
  p.compressor->TakeTelemetry(&telemetry);
  if (p.residual) p.residual->TakeTelemetry(&telemetry);
  // A NaN / inf in the input: the compressor saw it where its own pass reads every value
  // (onebit's scale), else one read pass here. The push still goes (flagged), so the round
  // completes everywhere and every worker fails it with the same origin (OnReply).
  const bool non_finite =
      bytes.ok() &&
      (telemetry.input_checked
           ? telemetry.input_non_finite
           : state_.check_non_finite && FirstNonFinite(in, p.compressor->isa()) < in.count());

  transport::Message msg;
  if (bytes.ok()) {
    v1::DataHeader h;
    h.set_op(v1::DataHeader::OP_PUSH);
    h.set_generation(state_.generation.load());
    h.set_key(p.range.key);
    h.set_round(round);
    h.set_sender(state_.rank);
    h.set_compressor(p.compressor->id());
    h.set_element_count(p.range.elements);
    h.set_dtype(static_cast<uint32_t>(t->dtype));
    h.set_byte_count(*bytes);
    if (op->lr) h.set_lr(*op->lr);
    if (non_finite) h.set_non_finite(true);
    h.SerializeToString(&msg.header);
    if (!raw) msg.frames.push_back(transport::Buffer::Borrow(p.payload->data(), *bytes, p.payload));
  }
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    state_.stats.compress_ns += Ns(t1 - t0);
    if (non_finite) {
      ++state_.stats.non_finite_pushes;
      BP_LOG_WARN(
          "{}: tensor '{}' partition {} (key {}, round {}): this worker's gradient has a "
          "NaN or inf; pushed flagged, the round fails on every worker",
          state_.label, t->name, j, p.range.key, round);
    }
    state_.stats.quantized_values += telemetry.values;
    state_.stats.quantized_saturated += telemetry.saturated;
    state_.stats.error_values += telemetry.error_values;
    state_.stats.error_saturated += telemetry.error_saturated;
    if (telemetry.saturated > 0) WarnSaturationLocked(*t, j, round, telemetry);
    if (telemetry.error_reported) {
      error_sq_ += telemetry.error_sq - p.error_sq;
      p.error_sq = telemetry.error_sq;
      state_.stats.error_norm = std::sqrt(std::max(0.0, error_sq_));
    }
    if (telemetry.gradient_reported) {
      gradient_sq_ += telemetry.gradient_sq - p.gradient_sq;
      p.gradient_sq = telemetry.gradient_sq;
      state_.stats.gradient_norm = std::sqrt(std::max(0.0, gradient_sq_));
    }
    if (op->failed || !bytes.ok()) {
      if (!op->failed) {
        scheduler_.FailOpLocked(*t, op,
                                bytes.status().WithContext(fmt::format(
                                    "{}: compressing tensor '{}' partition {} (key {}, round {})",
                                    state_.label, t->name, j, p.range.key, round)));
      }
      scheduler_.SetIdleLocked(*t, p);
      scheduler_.JobDoneLocked(*t, op);
      return;
    }
    p.stage = Stage::kOnWire;
    p.pushed_at = EngineClock::now();
    op->last_push = std::max(op->last_push, p.pushed_at);
    ++state_.stats.partitions_pushed;
    state_.stats.bytes_pushed += *bytes;
    op->bytes_pushed += *bytes;
    state_.stats.raw_bytes_pushed += p.range.elements * DTypeSize(t->dtype);
    if (raw) {
      ++op->active_jobs;  // until the transport lets go of the input (InputLease)
      msg.frames.push_back(transport::Buffer::Copy(raw_header, sizeof(raw_header)));
      msg.frames.push_back(transport::Buffer::Borrow(in.data(), in_bytes, InputLease(t, op)));
      msg.glue_next = {true, false};
    }
  }
  // Outside mu: the transport may drop the frames (and run InputLease's release) in Send.
  const int64_t send_start = tracer ? trace::NowNs() : 0;
  const Status sent = state_.endpoint->Send(p.peer, std::move(msg));
  if (tracer && sent.ok()) {
    tracer->Span(trace::SpanKind::kPush, send_start, trace::NowNs(), p.range.key, round,
                 bytes.ok() ? *bytes : 0, -1, static_cast<int32_t>(p.server));
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  if (!sent.ok()) {
    if (p.stage == Stage::kOnWire && p.round == round) scheduler_.SetIdleLocked(*t, p);
    scheduler_.FailOpLocked(
        *t, op,
        sent.WithContext(fmt::format("{}: pushing tensor '{}' partition {} (key {}, "
                                     "round {}) to server {}",
                                     state_.label, t->name, j, p.range.key, round, p.server)));
  }
  scheduler_.JobDoneLocked(*t, op);
}

std::shared_ptr<const void> RoundPipeline::InputLease(Tensor* t,
                                                      const std::shared_ptr<OpState>& op) {
  return std::shared_ptr<const void>(op.get(), [this, t, op](const void*) {
    std::lock_guard<std::mutex> lock(state_.mu);
    scheduler_.JobDoneLocked(*t, op);
  });
}

void RoundPipeline::WarnSaturationLocked(Tensor& t, uint32_t j, uint64_t round,
                                         const compressors::CompressorTelemetry& telemetry) {
  if (state_.rank != 0 || t.saturation_warned || t.rounds_done >= kSaturationWarnRounds ||
      saturation_warnings_ > kSaturationWarnTensors ||
      telemetry.saturated * 100 <= kSaturationWarnPercent * telemetry.values) {
    return;
  }
  t.saturation_warned = true;
  if (saturation_warnings_++ == kSaturationWarnTensors) {
    BP_LOG_WARN(
        "{}: more tensors saturate their 4-bit values; their warnings are not logged "
        "(bp.stats()'s quantized_saturated counts every tensor's)",
        state_.label);
    return;
  }
  const double percent =
      100.0 * static_cast<double>(telemetry.saturated) / static_cast<double>(telemetry.values);
  const std::string at = t.config.has_loco() && t.config.loco().block() == 0
                             ? " at scale=" + ScaleText(t.config.loco().scale())
                             : std::string();
  BP_LOG_WARN(
      "{}: {}: {:.0f}% of the 4-bit values of tensor '{}' saturate{} (partition {}, round {}); "
      "use loco:block=256 (the default) or a smaller scale (docs/compressors.md \"loco\")",
      state_.label, t.spec.substr(0, t.spec.find(':')), percent, t.name, at, j, round);
}

void RoundPipeline::DecompressAndComplete(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                                          const transport::Buffer& payload) {
  Partition& p = t->partitions[j];
  if (DropJobIfFailed(*t, p, op)) return;
  const size_t n = p.range.elements;
  void* dst = static_cast<uint8_t*>(op->output.data()) + p.range.offset * DTypeSize(t->dtype);
  const EngineClock::time_point t0 = EngineClock::now();
  Status s;
  if (!t->server_optimizer) {
    // The aggregate comes in the tensor's dtype (the server sums in fp32 and rounds once): it
    // decodes straight into the output.
    const TensorView out(dst, n, t->dtype);
    s = p.residual
            ? p.residual->DecompressReply(*p.compressor, payload.span(),
                                          CompressContext{p.range.key, p.round, state_.rank}, out)
            : p.compressor->Decompress(payload.span(), out);
  } else if (t->server_optimizer->difference()) {
    // The weights' change against this worker's copy, added the way the server's mirror adds it.
    s = compressors::ApplyMirrorPull(*p.pull_codec, payload.span(), {static_cast<float*>(dst), n});
  } else {
    s = p.pull->Decompress(payload.span(), TensorView(dst, n, DType::kFloat32));
  }
  const EngineClock::time_point t1 = EngineClock::now();
  if (state_.trace && state_.trace->Wants(p.round)) {
    state_.trace->Span(trace::SpanKind::kDecompress, trace::ToNs(t0), trace::ToNs(t1), p.range.key,
                       p.round, payload.size(), -1, static_cast<int32_t>(p.server));
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  state_.stats.decompress_ns += Ns(t1 - t0);
  if (s.ok()) state_.stats.raw_bytes_pulled += n * DTypeSize(t->dtype);
  if (!op->failed) {
    if (s.ok()) {
      --op->remaining;
    } else {
      scheduler_.FailOpLocked(
          *t, op,
          s.WithContext(fmt::format("{}: the aggregate of tensor '{}' partition {} (key "
                                    "{}, round {}) from server {}",
                                    state_.label, t->name, j, p.range.key, p.round, p.server)));
    }
  }
  scheduler_.CompleteLocked(*t, p, op);
}

void RoundPipeline::OnSendFailed(const std::string& peer, const Status& why) {
  // A push that never left: fail the ops waiting on that server.
  std::lock_guard<std::mutex> lock(state_.mu);
  for (const auto& tp : state_.tensors) {
    Tensor& t = *tp;
    if (!t.op || t.op->failed) continue;
    bool affected = false;
    for (Partition& p : t.partitions) {
      if (p.stage == Stage::kOnWire && p.peer == peer) affected = true;
    }
    if (affected) {
      std::shared_ptr<OpState> op = t.op;
      scheduler_.FailOpLocked(
          t, op,
          UnavailableError(fmt::format("{}: push_pull of tensor '{}': sending to {} "
                                       "failed: {}",
                                       state_.label, t.name, ServerLabel(peer), why.message())));
      scheduler_.MaybeFinishLocked(t, op);
    }
  }
}

void RoundPipeline::OnReply(const std::string& from, const v1::DataHeader& h,
                            transport::Message& msg) {
  std::lock_guard<std::mutex> lock(state_.mu);
  uint32_t j = 0;
  Tensor* t = state_.FindTensorLocked(h.key(), &j);
  if (t == nullptr) {
    BP_LOG_WARN("{}: dropped a reply from '{}' for unknown key {}", state_.label, from, h.key());
    return;
  }
  Partition& p = t->partitions[j];
  std::shared_ptr<OpState> op = t->op;
  if (!op || op->failed || p.stage != Stage::kOnWire || p.round != h.round() || p.peer != from) {
    // E.g. the reply to a push whose op already failed (timeout).
    BP_LOG_DEBUG("{}: dropped a stale reply from '{}' for key {} round {}", state_.label, from,
                 h.key(), h.round());
    return;
  }
  const EngineClock::time_point replied = EngineClock::now();
  state_.stats.network_ns += Ns(replied - p.pushed_at);
  if (state_.trace && state_.trace->Wants(p.round)) {
    state_.trace->Span(trace::SpanKind::kNetwork, trace::ToNs(p.pushed_at), trace::ToNs(replied),
                       p.range.key, p.round, msg.frames.empty() ? 0 : msg.frames[0].size(), -1,
                       static_cast<int32_t>(p.server));
  }
  if (op->first_reply == EngineClock::time_point{}) op->first_reply = replied;
  if (msg.frames.empty()) {
    scheduler_.SetIdleLocked(*t, p);
    scheduler_.FailOpLocked(*t, op,
                            DataLossError(fmt::format(
                                "{}: {} replied to key {} (tensor '{}' partition {}, "
                                "round {}) without a payload",
                                state_.label, ServerLabel(from), h.key(), t->name, j, h.round())));
    scheduler_.MaybeFinishLocked(*t, op);
    return;
  }
  if (!h.non_finite_origin().empty()) {
    // Every worker fails the round alike; the origin is the server's text (bounded there).
    ++state_.stats.non_finite_rounds;
    scheduler_.SetIdleLocked(*t, p);
    scheduler_.FailOpLocked(
        *t, op,
        OutOfRangeError(fmt::format(
            "{}: non-finite values (NaN or inf) in tensor '{}' partition {} (key {}, round {}): "
            "{} (compression.non_finite: error; docs/errors.md)",
            state_.label, t->name, j, h.key(), h.round(), h.non_finite_origin())));
    scheduler_.MaybeFinishLocked(*t, op);
    return;
  }
  transport::Buffer payload = std::move(msg.frames[0]);
  state_.stats.bytes_pulled += payload.size();
  op->bytes_pulled += payload.size();
  p.stage = Stage::kDecompressing;
  ++op->active_jobs;
  if (!pool_->Post([this, t, j, op,
                    payload = std::move(payload)] { DecompressAndComplete(t, j, op, payload); },
                   /*urgent=*/true)) {
    scheduler_.SetIdleLocked(*t, p);
    scheduler_.FailOpLocked(*t, op, CancelledError(state_.label + ": the engine is stopping"));
    scheduler_.JobDoneLocked(*t, op);
  }
}

void RoundPipeline::OnPushRefused(const std::string& from, const v1::DataHeader& h) {
  std::lock_guard<std::mutex> lock(state_.mu);
  uint32_t j = 0;
  Tensor* t = state_.FindTensorLocked(h.key(), &j);
  const bool push_match = t != nullptr && t->op && !t->op->failed &&
                          t->partitions[j].stage == Stage::kOnWire &&
                          t->partitions[j].round == h.round() && t->partitions[j].peer == from;
  if (!push_match) {
    BP_LOG_WARN("{}: {} reported an error for key {} round {} with no such push in flight: {}",
                state_.label, ServerLabel(from), h.key(), h.round(), h.error());
    return;
  }
  Partition& p = t->partitions[j];
  std::shared_ptr<OpState> op = t->op;
  scheduler_.SetIdleLocked(*t, p);
  scheduler_.FailOpLocked(
      *t, op,
      RemoteStatus(
          h.error_code(),
          fmt::format("{}: {} refused key {} (tensor '{}' partition {}, round "
                      "{}): {}",
                      state_.label, ServerLabel(from), h.key(), t->name, j, h.round(), h.error())));
  scheduler_.MaybeFinishLocked(*t, op);
}

}  // namespace bitpush::worker
