#include "tests/harness/reference_model.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "common/counter_rng.h"
#include "common/cpu_features.h"
#include "common/vector_ops.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "tests/unit/test_util.h"
#include "worker/local_reduce.h"
#include "worker/partition.h"

namespace bitpush::testing {

using compressors::CompressContext;
using compressors::Compressor;
using compressors::ErrorFeedback;

struct ReferenceTensor::State {
  struct Part {
    worker::PartitionRange range;
    std::vector<std::unique_ptr<Compressor>> worker;
    std::vector<std::unique_ptr<ErrorFeedback>> worker_residual;
    std::unique_ptr<Compressor> server;
    std::unique_ptr<ErrorFeedback> server_residual;
  };
  ReferenceTensorOptions options;
  bool compressed = false;
  uint64_t round = 0;
  std::vector<Part> parts;
};

ReferenceTensor::ReferenceTensor(std::unique_ptr<State> state) : state_(std::move(state)) {}
ReferenceTensor::ReferenceTensor(ReferenceTensor&&) noexcept = default;
ReferenceTensor& ReferenceTensor::operator=(ReferenceTensor&&) noexcept = default;
ReferenceTensor::~ReferenceTensor() = default;

StatusOr<ReferenceTensor> ReferenceTensor::Create(const ReferenceTensorOptions& o) {
  auto state = std::make_unique<State>();
  state->options = o;
  BP_ASSIGN_OR_RETURN(v1::CompressorConfig config, compressors::ParseCompressorSpec(o.spec));
  state->compressed =
      config.id() != v1::COMPRESSOR_ID_NONE &&
      worker::AboveCompressThreshold(o.elements, o.dtype, o.min_compress_bytes) &&
      (!o.method_minimum || o.elements >= compressors::MinimumElements(config).elements);
  if (!state->compressed) {
    BP_ASSIGN_OR_RETURN(config, compressors::ParseCompressorSpec("none"));
  }
  BP_ASSIGN_OR_RETURN(const v1::ErrorFeedbackPolicy policy,
                      compressors::ParseErrorFeedbackPolicy(o.error_feedback));
  BP_ASSIGN_OR_RETURN(
      const std::vector<worker::PartitionRange> ranges,
      worker::PartitionTensor(o.index, o.elements, o.dtype, o.partition_bytes,
                              state->compressed ? compressors::PartitionAlign(config) : 1));
  for (const worker::PartitionRange& r : ranges) {
    State::Part p;
    p.range = r;
    for (uint32_t w = 0; w < o.nodes; ++w) {
      BP_ASSIGN_OR_RETURN(std::unique_ptr<Compressor> c, compressors::CreateCompressor(config));
      p.worker.push_back(std::move(c));
      std::unique_ptr<ErrorFeedback> residual;
      if (state->compressed && compressors::WorkerKeepsResidual(policy)) {
        // The method's own worker state (vanilla residual, or loco's error), as the engine.
        BP_ASSIGN_OR_RETURN(residual,
                            compressors::CreateErrorFeedback(
                                config, compressors::ErrorFeedbackSide::kWorker, r.elements));
      }
      p.worker_residual.push_back(std::move(residual));
    }
    BP_ASSIGN_OR_RETURN(p.server, compressors::CreateCompressor(config));
    if (state->compressed && compressors::ServerKeepsResidual(policy)) {
      BP_ASSIGN_OR_RETURN(p.server_residual,
                          compressors::CreateErrorFeedback(
                              config, compressors::ErrorFeedbackSide::kServer, r.elements));
    }
    state->parts.push_back(std::move(p));
  }
  return ReferenceTensor(std::move(state));
}

bool ReferenceTensor::compressed() const {
  return state_->compressed;
}
size_t ReferenceTensor::partitions() const {
  return state_->parts.size();
}

StatusOr<std::vector<uint8_t>> ReferenceTensor::Round(
    const std::vector<std::vector<std::vector<uint8_t>>>& inputs) {
  const ReferenceTensorOptions& o = state_->options;
  const size_t esz = DTypeSize(o.dtype);
  const size_t bytes = o.elements * esz;
  if (inputs.size() != o.nodes) {
    return InvalidArgumentError(
        fmt::format("reference: {} nodes' inputs for {} nodes", inputs.size(), o.nodes));
  }
  // The node's local reduce (the daemon's), or its one process's input as it is.
  std::vector<std::vector<uint8_t>> node(o.nodes);
  const float scale = o.local_size == 1 ? 1.0f : 1.0f / static_cast<float>(o.local_size);
  for (uint32_t w = 0; w < o.nodes; ++w) {
    if (inputs[w].size() != o.local_size) {
      return InvalidArgumentError(fmt::format("reference: node {} has {} inputs for local size {}",
                                              w, inputs[w].size(), o.local_size));
    }
    for (const std::vector<uint8_t>& in : inputs[w]) {
      if (in.size() != bytes) {
        return InvalidArgumentError(
            fmt::format("reference: an input of node {} has {} bytes, "
                        "not {}",
                        w, in.size(), bytes));
      }
    }
    if (o.local_size == 1) {
      node[w] = inputs[w][0];
      continue;
    }
    node[w].resize(bytes);
    std::vector<const void*> srcs;
    for (const std::vector<uint8_t>& in : inputs[w]) srcs.push_back(in.data());
    worker::LocalReduceKernel(o.dtype, srcs.data(), srcs.size(), node[w].data(), o.elements, scale,
                              BestIsaLevel());
  }
  std::vector<uint8_t> out(bytes);
  for (State::Part& p : state_->parts) {
    const size_t n = p.range.elements;
    std::vector<float> acc(n, 0.0f);
    // The server's round as KeyState runs it: fused (Compressor::AggregateCompress over the
    // pushes in rank order) where the compressor fuses it, else decompress-add into fp32.
    const bool fused = n > 0 && (p.server_residual ? p.server_residual->FusesServerRound(*p.server)
                                                   : p.server->FusesServerRound(false));
    std::vector<std::vector<uint8_t>> pushes;
    for (uint32_t w = 0; w < o.nodes; ++w) {
      const CompressContext ctx{p.range.key, state_->round, w};  // worker w's random stream
      std::vector<uint8_t> push(p.worker[w]->MaxCompressedBytes(n, o.dtype));
      const ConstTensorView in(node[w].data() + p.range.offset * esz, n, o.dtype);
      BP_ASSIGN_OR_RETURN(const size_t pushed,
                          p.worker_residual[w]
                              ? p.worker_residual[w]->Compress(*p.worker[w], in, ctx, push)
                              : p.worker[w]->Compress(in, ctx, push));
      push.resize(pushed);
      if (!fused) BP_RETURN_IF_ERROR(p.server->DecompressAdd(push, Span<float>(acc.data(), n)));
      pushes.push_back(std::move(push));
    }
    const float inv = o.average && o.nodes > 1 ? 1.0f / static_cast<float>(o.nodes) : 1.0f;
    if (!fused && inv != 1.0f) {
      for (float& v : acc) v *= inv;
    }
    CompressContext ctx{p.range.key, state_->round, kServerStream};
    if (o.dtype != DType::kFloat32) ctx.store_as = o.dtype;  // replied in the tensor's dtype
    std::vector<uint8_t> agg(p.server->MaxCompressedBytes(n, DType::kFloat32));
    const ConstTensorView delta(acc.data(), n);
    std::vector<ByteSpan> spans;
    spans.reserve(pushes.size());
    for (const std::vector<uint8_t>& b : pushes) spans.emplace_back(b.data(), b.size());
    BP_ASSIGN_OR_RETURN(
        const size_t aggregated,
        fused               ? (p.server_residual
                                   ? p.server_residual->AggregateCompress(*p.server, spans, inv, ctx, agg)
                                   : p.server->AggregateCompress(spans, n, inv, nullptr, ctx, agg))
        : p.server_residual ? p.server_residual->Compress(*p.server, delta, ctx, agg)
                            : p.server->Compress(delta, ctx, agg));
    agg.resize(aggregated);
    const TensorView dst(out.data() + p.range.offset * esz, n, o.dtype);
    if (p.worker_residual.empty() || !p.worker_residual[0]) {
      BP_RETURN_IF_ERROR(p.server->Decompress(agg, dst));
      continue;
    }
    // Every worker decodes the reply through its state, as the engine (a state may complete
    // its round there: separate's residual against the reconstruction); the outputs agree,
    // worker 0's is the reference's.
    std::vector<uint8_t> other(n * esz);
    for (uint32_t w = 0; w < o.nodes; ++w) {
      const CompressContext wctx{p.range.key, state_->round, w};
      BP_RETURN_IF_ERROR(p.worker_residual[w]->DecompressReply(
          *p.worker[w], agg, wctx, w == 0 ? dst : TensorView(other.data(), n, o.dtype)));
    }
  }
  ++state_->round;
  return out;
}

StatusOr<std::vector<uint8_t>> ReferenceTensor::Round(
    const std::vector<std::vector<uint8_t>>& inputs) {
  std::vector<std::vector<std::vector<uint8_t>>> per_node;
  per_node.reserve(inputs.size());
  for (const std::vector<uint8_t>& in : inputs) per_node.push_back({in});
  return Round(per_node);
}

std::vector<float> ReferenceTensor::WorkerResidual(uint32_t w) const {
  std::vector<float> out;
  for (const State::Part& p : state_->parts) {
    if (!p.worker_residual[w]) return {};
    const Span<const float> r = p.worker_residual[w]->residual();
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

Status ReferenceTensor::RestoreWorkerResidual(uint32_t w, const std::vector<float>& saved) {
  size_t at = 0;
  for (State::Part& p : state_->parts) {
    if (!p.worker_residual[w]) return Status::Ok();
    const size_t n = p.worker_residual[w]->size();
    if (at + n > saved.size()) {
      return InvalidArgumentError(
          fmt::format("reference: {} residual values for a larger tensor", saved.size()));
    }
    BP_RETURN_IF_ERROR(p.worker_residual[w]->Restore(Span<const float>(saved.data() + at, n)));
    at += n;
  }
  return Status::Ok();
}

std::vector<uint8_t> ReferenceInput(uint64_t stream, size_t t, uint64_t r, size_t n, DType dtype) {
  const std::vector<float> f = RandomFloats(n, 1000003ull * stream + 7919 * t + 104729 * r);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  if (dtype == DType::kFloat32) {
    if (!f.empty()) std::memcpy(out.data(), f.data(), out.size());
  } else {
    ConvertFromFloat(f.data(), TensorView(out.data(), n, dtype), IsaLevel::kScalar);
  }
  return out;
}

}  // namespace bitpush::testing
