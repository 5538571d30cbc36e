// Partitioning: how a declared tensor is cut into keys (pure functions shared by the worker
// engine, the tests' reference computations and the benchmark).
//
//  - A tensor of `elements` values of `dtype` is cut into partitions of
//    max(1, partition_bytes / DTypeSize(dtype)) elements, rounded down to a multiple of
//    `align` (the compression method's block or group, compressors::PartitionAlign; at least
//    one block), so no block straddles two keys; the last partition holds the rest. A tensor
//    of 0 elements has no partition (its push_pull completes at once).
//  - Partition j of the tensor declared i-th (from 0, over the client's life) is the key
//    (i << 32) | j. Every worker declares the same tensors in the same order, so every worker
//    computes the same keys; the scheduler's mapping (config/key_mapping.h) gives the owner.
//  - A tensor is compressed when its whole size in bytes is >= min_compress_bytes (paper 001
//    §4.2.3; BytePS tests the whole tensor, not the partition) and its spec is not "none";
//    otherwise every partition goes with the "none" compressor.
//  - The partition size (PartitionBytesFor): partition_bytes for a compressed tensor (the
//    compression unit: a scale, a top-k, a residual are per partition, so it never depends on
//    the cluster's shape). A raw tensor's values do not depend on where it is cut, and on the
//    wire its partition is the pipeline's unit: a server replies to a partition only once all
//    W workers pushed all of it, so a round costs about partition x (W + S) / link more than
//    the link's line rate (the first partition's push before any reply, the last one's reply
//    after every push; docs/flow-control.md). raw_partition_bytes sets it; 0 ("auto") cuts
//    raw tensors into tensor_bytes / (kRawPipelineDepth x (W + S)), at least
//    kMinAutoRawPartitionBytes (per-partition costs) and at most partition_bytes.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "config/cluster_config.h"

namespace bitpush::worker {

struct PartitionRange {
  uint32_t index = 0;   // partition number within the tensor
  size_t offset = 0;    // first element
  size_t elements = 0;  // element count
  uint64_t key = 0;
};

inline uint64_t PartitionKey(uint32_t tensor_index, uint32_t partition) {
  return (static_cast<uint64_t>(tensor_index) << 32) | partition;
}

// compression.raw_partition_bytes = 0: partitions of a raw tensor per (W + S), and the floor.
inline constexpr uint64_t kRawPipelineDepth = 48;
inline constexpr uint64_t kMinAutoRawPartitionBytes = uint64_t{256} << 10;

// What PartitionBytesFor needs of the cluster.
struct PartitionSizing {
  uint64_t partition_bytes = 4096000;  // compression.partition_bytes
  uint64_t raw_partition_bytes = 0;    // compression.raw_partition_bytes (0 = auto)
  size_t workers = 1;                  // worker nodes (W)
  size_t servers = 1;                  // servers (S)
};

// The sizing of cluster `c`: its compression section and its counts of worker nodes and servers.
PartitionSizing PartitionSizingOf(const config::ClusterConfig& c);

// The partition size of a tensor of `tensor_bytes` that goes compressed or raw (above).
uint64_t PartitionBytesFor(uint64_t tensor_bytes, bool compressed, const PartitionSizing& s);

// Elements per partition for `dtype` (>= 1).
size_t PartitionElements(DType dtype, uint64_t partition_bytes);

// The partitions of a tensor; InvalidArgument if it would need more than 2^32 partitions.
StatusOr<std::vector<PartitionRange>> PartitionTensor(uint32_t tensor_index, size_t elements,
                                                      DType dtype, uint64_t partition_bytes,
                                                      size_t align = 1);

// Whether a tensor of this size goes compressed (before looking at the spec).
inline bool AboveCompressThreshold(size_t elements, DType dtype, uint64_t min_compress_bytes) {
  return static_cast<uint64_t>(elements) * DTypeSize(dtype) >= min_compress_bytes;
}

}  // namespace bitpush::worker
