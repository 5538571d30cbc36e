// KeyState: the server's state for one key (one partition of one tensor) — the heart of the
// aggregation of paper 001 Algorithms 3 and 4, without threads or networking.
//
// Per round r:
//   Push(worker, r, payload)   fused decompress-and-accumulate of that worker's compressed push
//                              into the round's fp32 accumulator (fp32 even for fp16 payloads),
//                              in worker-rank order: a push that arrives before a lower rank's
//                              is checked (header, sizes) and held (the received Buffer, no
//                              copy) until its turn, so the sum is bit-identical whatever the
//                              arrival order (reproducible results; bit-exact tests);
//   after the n-th push        the aggregate Δ = (1/n)·Σ δ_i (or the sum) is compressed once:
//                              Algorithm 4 (server_residual): p = C(Δ + ẽ), ẽ ← Δ + ẽ − p;
//                              Algorithm 3: p = C(Δ);
//                              the payload p is published, shared by every worker's pull;
//   Pull(worker, r)            returns p (the same bytes for all) or Unavailable while pushes
//                              are missing (the caller queues the pull);
//   after the n-th pull        the round's slot is released and reused.
//
// Rounds: each worker pushes its rounds in order (r, r+1, ...). A fast worker's push for r+1
// lands in its own slot, never on round r that a slow worker has not pulled yet. At most
// `max_rounds_in_flight` rounds are held (2 suffice for a synchronous worker: it pushes r+1
// only after pulling r); a push beyond that window is refused (FailedPrecondition), so memory
// stays bounded. Slots and accumulators are allocated once and reused.
//
// The published payload's dtype is the key's (the server aggregates in fp32 and stores the
// values rounded once to the key's dtype: CompressContext::store_as); compressors keep their
// own value width (fp16 casts stay 2 bytes per element). Randomized compressors draw from the
// server's own stream, CompressContext{key, round, kServerStream}.
//
// Zero-copy round (`none` on an fp32 key without a server residual, where C is the identity):
// the round's accumulator lives inside a payload buffer, after the 16-byte payload header, so
// publishing writes the header and shares the buffer — the aggregate is never copied into a
// payload. That buffer is the first push itself (rank 0's, as received) when nothing else
// holds it (Buffer::owner() use count 1): the later pushes are added into it and it goes back
// as the reply, no copy at all; otherwise the slot's own buffer, which the next round in the
// slot reuses once the transport has let go of it (a fresh one otherwise).
//
// Method: the key's compression method (compressors/method.h) says how servers aggregate it
// (its AggregationMode) and supplies the server's error-feedback state (compressors::
// ErrorFeedback, created where the key keeps a server residual). KeyState runs both modes:
//   kDecompressSumRecompress   as described above, pass by pass or fused (below);
//   kCompressedDomainSum       the pushes are never decompressed: each is validated at its
//                              turn and held, and Publish hands them all, in rank order, to
//                              the method's compressed-domain round (Compressor::
//                              AggregateCompress: separate sums projection vectors, binsgdm
//                              counts sign bits, adds the server residual and re-binarises).
//                              Create refuses such a key with a server-side optimizer (the
//                              server never holds the gradient) or where the compressor has
//                              no such round.
//
// Fused round: where the compressor fuses the server round (onebit; topk with a server
// residual), a push at its turn is only validated and held, and Publish hands every push to
// Compressor::AggregateCompress, which decodes, averages and compresses in one or two passes
// over the residual — the same bytes, without an accumulator (docs/compressors.md). The
// compressed-domain mode always takes this path.
//
// Validation: a push with a malformed payload, another compressor id, another element count
// or dtype, an unknown worker, a second push from the same worker in a round, or a round out
// of order is refused with a Status naming the problem; the round's accumulator is untouched
// (decoders validate before writing) and the key keeps serving everyone else. Refusals are
// counted in stats(). A held push whose body turns out malformed when its turn comes is
// refused then: TakeLateRejections() returns it (the worker may push that round again).
//
// Server-side optimizer (KeySpec::optimizer): the server owns the key's fp32 master weights and
// optimizer state (optimizers/param_state.h). InstallWeights() puts the starting weights in
// (the first worker's, or a checkpoint's) before the first push. Each push carries the round's
// learning rate (every worker's must agree); after the n-th push the average gradient updates
// the weights once, and the round publishes the weights instead of the aggregate: as C(w − w̃)
// against the workers' copy w̃ (difference form, compressors/mirror_pull.h; SDP4Bit's qWD
// with `sdp4bit:hadamard=off,group=2048`) or as C(w) (raw form, refused for biased C). Such a
// key sums pushes pass by pass (no fused round, no in-payload accumulator) and keeps no server
// residual. SaveOptimizerState / RestoreOptimizerState carry the weights, moments, step and
// mirror for checkpoints.
//
// Ownership and thread-safety: owned by the server engine thread the key sticks to; not
// thread-safe (one thread at a time), by design — no lock on key data.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/transport/message.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"
#include "compressors/mirror_pull.h"
#include "optimizers/param_state.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::server {

// The server-side optimizer of a key (see above).
struct ServerOptimizerSpec {
  optimizers::UpdateOptions update;
  // How the weights travel back to the workers.
  v1::CompressorConfig pull;
  // The difference against the workers' copy (true) or the weights themselves.
  bool difference = true;
};

struct KeySpec {
  uint64_t key = 0;
  // Elements of this partition.
  size_t elements = 0;
  // dtype the workers push (their payload header dtype).
  DType dtype = DType::kFloat32;
  // The key's compressor (the same on every worker and here).
  v1::CompressorConfig compressor;
  // Algorithm 4: keep the server residual ẽ. Algorithm 3 when false.
  bool server_residual = false;
  // Workers that push every round (n).
  uint32_t num_workers = 1;
  // Publish the average (true, the default) or the sum of the pushes.
  bool average = true;
  // Rounds held at once (>= 2).
  uint32_t max_rounds_in_flight = 2;
  // Set: the server owns the weights and runs the update (fp32 keys, no server_residual).
  std::optional<ServerOptimizerSpec> optimizer;
};

struct KeyStats {
  uint64_t pushes_accepted = 0;
  uint64_t pushes_rejected = 0;
  uint64_t pulls_served = 0;
  uint64_t rounds_published = 0;
  uint64_t bytes_pushed = 0;
  uint64_t bytes_published = 0;
  // The latest round's publication (the aggregate's server error feedback and compression, or
  // the server-side optimizer's step): when it started and how long it took (steady clock,
  // ns; the timeline's `compress` / `optimizer` span, docs/observability.md). Only when the
  // key is timed (set_timed); 0 otherwise.
  int64_t last_publish_start_ns = 0;
  int64_t last_publish_ns = 0;
};

// OK iff KeyState aggregates a key of `spec` by `method`'s aggregation mode: InvalidArgument
// for a compressed-domain method under a server-side optimizer; Unimplemented for a mode this
// server does not know.
Status CheckAggregationMode(const compressors::MethodSpec& method, const KeySpec& spec);

class KeyState {
 public:
  static StatusOr<std::unique_ptr<KeyState>> Create(
      const KeySpec& spec, const compressors::CompressorOptions& options = {});

  // Accumulates (or holds, see above) `payload` as worker `worker`'s push for `round`.
  Status Push(uint32_t worker, uint64_t round, transport::Buffer payload);
  // The same for a key with a server-side optimizer: `lr` is the round's learning rate
  // (finite, >= 0, the same from every worker). Refused before InstallWeights.
  Status Push(uint32_t worker, uint64_t round, transport::Buffer payload, float lr);
  // Same, copying the bytes (for callers that do not own a Buffer).
  Status Push(uint32_t worker, uint64_t round, ByteSpan payload) {
    return Push(worker, round, transport::Buffer::Copy(payload.data(), payload.size()));
  }

  struct LateRejection {
    uint32_t worker;
    uint64_t round;
    Status status;
  };
  // Held pushes refused when their turn came, since the last call.
  std::vector<LateRejection> TakeLateRejections() { return std::move(late_rejections_); }

  // The published aggregate of `round` for `worker`; Unavailable (naming the workers still
  // missing) before the round is complete. Each worker pulls each round once.
  StatusOr<transport::Buffer> Pull(uint32_t worker, uint64_t round);

  bool RoundPublished(uint64_t round) const;
  // The oldest round not yet pulled by every worker (rounds below it are released).
  uint64_t oldest_round() const { return oldest_round_; }
  const KeySpec& spec() const { return spec_; }
  const KeyStats& stats() const { return stats_; }
  // Whether Publish times itself into stats() (the server's timeline is on); off by default:
  // no clock is read.
  void set_timed(bool timed) { timed_ = timed; }
  // The server residual ẽ (empty without server_residual); for checkpoints and tests.
  Span<const float> server_residual() const;
  Status RestoreServerResidual(Span<const float> saved);
  // Moves the key to round `next` for every worker (OP_STATE_WRITE `rounds`: a checkpoint's
  // restore). FailedPrecondition while a round is open and on a key with a server-side
  // optimizer (RestoreOptimizerState moves those).
  Status RestoreRounds(uint64_t next);
  // A round of the key has pushes not yet pulled by every worker (its residual is in use).
  bool RoundOpen() const;
  // Server-side optimizer: installs the master weights (and the workers' copy: they start
  // from the same weights), with fresh moments at step 0. FailedPrecondition for a key without
  // one, while a round is open, or once weights are installed or restored (they are installed
  // once; a checkpoint's RestoreOptimizerState replaces them); InvalidArgument for another
  // size.
  Status InstallWeights(Span<const float> weights);
  bool weights_installed() const { return param_.has_value(); }
  // The master weights (empty before InstallWeights or without a server-side optimizer).
  Span<const float> weights() const;
  // The workers' copy as the server tracks it (difference form; empty otherwise).
  Span<const float> mirror() const;
  // What every worker holds after the last published round (OP_STATE_READ `weights`: a worker
  // that starts or resumes copies it): the mirror in the difference form; in the raw form the
  // master weights before the first round since the install or restore, else D(C(w)) of the
  // last round (deterministic in (key, round)). FailedPrecondition before any weights.
  StatusOr<std::vector<float>> WorkersWeights();
  // The whole optimizer state as bytes (weights, moments, step, mirror), and its restore
  // (refused while a round is open, or for a blob of another rule, size or format; unchanged
  // then).
  // A restore moves the key to the saved step's round (each round is one step, from round 0):
  // a resumed job's rounds, and the random streams of (key, round), continue where they were.
  StatusOr<std::string> SaveOptimizerState() const;
  Status RestoreOptimizerState(std::string_view blob);
  // The round `worker` pushes next.
  uint64_t next_round(uint32_t worker) const { return next_round_[worker]; }

  // Notes that non-finite values entered open round `round` at `origin` (a text the server
  // composes: "worker 1's gradient"); the first note of a round wins, later ones are ignored,
  // as is a round that is not open. NonFiniteOrigin: the round's note, "" when none.
  void NoteNonFinite(uint64_t round, std::string origin);
  std::string NonFiniteOrigin(uint64_t round) const;

  // The reply compressor's telemetry since the last call (Compressor::TakeTelemetry).
  void TakeTelemetry(compressors::CompressorTelemetry* into) { compressor_->TakeTelemetry(into); }

 private:
  struct Round {
    bool active = false;
    uint64_t round = 0;
    uint32_t pushes = 0;       // accepted (added or held)
    uint32_t next_to_add = 0;  // the rank whose push is added next
    uint32_t pulls = 0;
    std::vector<uint8_t> pushed;          // per worker
    std::vector<uint8_t> pulled;          // per worker
    std::vector<transport::Buffer> held;  // per worker: pushes waiting for their turn
    AlignedBuffer<float> accumulator;     // unused when the accumulator is in the payload
    float* acc = nullptr;                 // the round's fp32 accumulator (n floats)
    transport::Buffer adopted;            // rank 0's push, when it is the accumulator
    transport::Buffer published;
    bool is_published = false;
    bool averaged = false;  // the last add already applied the average (AddPush)
    // Bytes behind `published`, reused by the next round in this slot when nobody else holds
    // them any more.
    std::shared_ptr<std::vector<uint8_t>> payload_storage;
    float lr = 0.0f;  // server-side optimizer: the round's learning rate (its first push's)
    // Where non-finite values entered the round (the first place noted); empty: nowhere.
    std::string non_finite_origin;
  };

  KeyState(const KeySpec& spec, std::unique_ptr<compressors::Compressor> compressor,
           std::unique_ptr<compressors::ErrorFeedback> residual,
           std::unique_ptr<compressors::Compressor> pull);
  Status PushImpl(uint32_t worker, uint64_t round, transport::Buffer buffer,
                  std::optional<float> lr);
  // Server-side optimizer: the round's update and the weights' payload into dst.
  StatusOr<size_t> StepAndEncodeWeights(Round& r, MutableByteSpan dst);
  Round* Find(uint64_t round);
  const Round* Find(uint64_t round) const;
  Status Reject(Status s);
  Status Publish(Round& r);  // timed into stats_; the work is PublishRound's
  Status PublishRound(Round& r);
  // Points r.acc at the round's accumulator: the slot's own, or (accumulate_in_payload_) the
  // body of a payload buffer that no one else holds.
  void PrepareAccumulator(Round& r);
  // The first push of a round (rank 0's) into the accumulator: adopted as the accumulator
  // itself where possible (accumulate_in_payload_, see above), else decoded into it.
  Status AddFirst(Round& r, transport::Buffer& buffer);
  // Makes `payload` the round's published aggregate (and counts it).
  Status PublishPayload(Round& r, transport::Buffer payload);
  // Payload bytes of the in-payload accumulator: the header and n floats.
  size_t InPayloadBytes() const {
    return compressors::kPayloadHeaderBytes + spec_.elements * sizeof(float);
  }
  // 1 / num_workers when the key publishes the average of several workers, else 1.
  float AverageScale() const;
  // Adds worker's push (worker >= 1) into r.acc; the round's last push of fp32 `none` is
  // added and averaged in one pass (sets r.averaged).
  Status AddPush(Round& r, uint32_t worker, ByteSpan payload);
  // Adds held pushes from r.next_to_add on while they are present; publishes when all are in.
  Status AddInOrder(Round& r);
  std::string Missing(const std::vector<uint8_t>& flags) const;

  KeySpec spec_;
  std::unique_ptr<compressors::Compressor> compressor_;
  // The server's error-feedback state (ẽ); null without server_residual.
  std::unique_ptr<compressors::ErrorFeedback> residual_;
  // The compressor fuses the round (Compressor::FusesServerRound, with the residual's consent
  // where there is one: ErrorFeedback::FusesServerRound), or the method aggregates in the
  // compressed domain: pushes are validated on
  // their turn and held, and Publish aggregates and compresses them in one call; no
  // accumulator is allocated.
  bool fused_ = false;
  // The aggregate is its own payload body (`none`, fp32, no residual): see above.
  bool accumulate_in_payload_ = false;
  std::vector<ByteSpan> push_spans_;  // Publish's scratch
  // Server-side optimizer: the weights' pull compressor, the weights and state, the mirror.
  std::unique_ptr<compressors::Compressor> pull_;
  std::unique_ptr<compressors::CompressorPullCodec> pull_codec_;
  std::optional<optimizers::ParamState> param_;
  std::optional<compressors::MirrorPull> mirror_;
  // Raw form: a round updated the weights since the install / restore, and the last one's
  // number (the context of the payload the workers decoded).
  bool stepped_ = false;
  uint64_t last_stepped_round_ = 0;
  std::vector<Round> slots_;
  std::vector<uint64_t> next_round_;  // per worker: the round it must push next
  std::vector<LateRejection> late_rejections_;
  uint64_t oldest_round_ = 0;
  KeyStats stats_;
  bool timed_ = false;  // set_timed
};

}  // namespace bitpush::server
