// The reference model of one tensor's push_pull across a cluster: what every training process
// must get back, computed in the test from the same functions the system runs, in the same
// order, so a test can compare the system's output BIT FOR BIT.
//
// One round, per node (worker) w: the node's local reduce (LocalReduceKernel over its P
// processes' inputs in local-rank order, scale 1/P; skipped when P = 1); then per partition
// (key, round): the worker compressor with node w's worker residual and w's random stream,
// the server's fp32 DecompressAdd in node-rank order, x 1/W for an average (paper 001
// Algorithms 3 and 4), the server compressor (the server's stream) with the server residual,
// stored in the tensor's dtype (CompressContext::store_as), decompressed into the tensor.
// Compression applies only above min_compress_bytes (worker/partition.h) and the method's
// minimum of elements (compressors::MinimumElements), like the engine.
//
// ReferenceInput is the one deterministic input generator the reference tests share
// (`stream` names the process: e.g. worker + 1, or node * 16 + local rank + 1).
//
// Used by pushpull_e2e_test (threads as nodes) and bitpush-test-trainer (real processes, via
// daemon_test). Owned by its test; not thread-safe (one test thread drives it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace bitpush::testing {

struct ReferenceTensorOptions {
  std::string spec = "none";            // the tensor's compression spec
  std::string error_feedback = "none";  // the cluster's error-feedback policy
  uint64_t min_compress_bytes = 0;
  // compression.method_minimum: tensors below their method's minimum of elements stay raw.
  bool method_minimum = true;
  uint64_t partition_bytes = 4096;
  uint32_t index = 0;  // the tensor's declaration index (its keys)
  size_t elements = 0;
  DType dtype = DType::kFloat32;
  uint32_t nodes = 1;       // worker nodes W
  uint32_t local_size = 1;  // training processes per node P
  bool average = true;      // ReduceOp::kAverage (x 1/W) or kSum
};

class ReferenceTensor {
 public:
  // InvalidArgument naming the spec or policy that does not parse.
  static StatusOr<ReferenceTensor> Create(const ReferenceTensorOptions& options);

  ReferenceTensor(ReferenceTensor&&) noexcept;
  ReferenceTensor& operator=(ReferenceTensor&&) noexcept;
  ~ReferenceTensor();

  // Whether the tensor is compressed (a compressing spec and above min_compress_bytes).
  bool compressed() const;
  size_t partitions() const;

  // The output of the next round (raw bytes of the dtype). inputs[w][p]: raw bytes of process
  // p of node w.
  StatusOr<std::vector<uint8_t>> Round(
      const std::vector<std::vector<std::vector<uint8_t>>>& inputs);
  // The same with one process per node: inputs[w].
  StatusOr<std::vector<uint8_t>> Round(const std::vector<std::vector<uint8_t>>& inputs);

  // Node w's worker residual, partitions in element order (empty: the tensor keeps none).
  std::vector<float> WorkerResidual(uint32_t w) const;
  // Replaces node w's worker residual (`saved` as WorkerResidual returns it).
  Status RestoreWorkerResidual(uint32_t w, const std::vector<float>& saved);

 private:
  struct State;
  explicit ReferenceTensor(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Deterministic input of process `stream`, tensor t, round r: n values of `dtype` as raw bytes
// (fp32 normals from RandomFloats, cast with the scalar kernel for fp16/bf16).
std::vector<uint8_t> ReferenceInput(uint64_t stream, size_t t, uint64_t r, size_t n, DType dtype);

}  // namespace bitpush::testing
