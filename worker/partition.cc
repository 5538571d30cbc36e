#include "worker/partition.h"

#include <fmt/format.h>

#include <algorithm>

namespace bitpush::worker {

PartitionSizing PartitionSizingOf(const config::ClusterConfig& c) {
  PartitionSizing s;
  s.partition_bytes = c.compression.partition_bytes;
  s.raw_partition_bytes = c.compression.raw_partition_bytes;
  s.workers = c.workers.size();
  s.servers = c.servers.size();
  return s;
}

uint64_t PartitionBytesFor(uint64_t tensor_bytes, bool compressed, const PartitionSizing& s) {
  if (compressed) return s.partition_bytes;
  if (s.raw_partition_bytes != 0) return std::min(s.raw_partition_bytes, s.partition_bytes);
  const uint64_t nodes = std::max<uint64_t>(1, s.workers + s.servers);
  const uint64_t pipelined = tensor_bytes / (kRawPipelineDepth * nodes);
  return std::min(s.partition_bytes, std::max(kMinAutoRawPartitionBytes, pipelined));
}

size_t PartitionElements(DType dtype, uint64_t partition_bytes) {
  return std::max<size_t>(1, static_cast<size_t>(partition_bytes / DTypeSize(dtype)));
}

StatusOr<std::vector<PartitionRange>> PartitionTensor(uint32_t tensor_index, size_t elements,
                                                      DType dtype, uint64_t partition_bytes,
                                                      size_t align) {
  align = std::max<size_t>(1, align);
  // A multiple of the method's block (or one block where partitions are smaller).
  const size_t per = std::max(align, PartitionElements(dtype, partition_bytes) / align * align);
  const size_t count = elements == 0 ? 0 : (elements - 1) / per + 1;
  if (count > (uint64_t{1} << 32)) {
    return InvalidArgumentError(fmt::format(
        "a tensor of {} elements needs {} partitions of {} bytes; at most 2^32 are possible "
        "(raise compression.partition_bytes)",
        elements, count, partition_bytes));
  }
  std::vector<PartitionRange> out;
  out.reserve(count);
  for (size_t j = 0; j < count; ++j) {
    PartitionRange r;
    r.index = static_cast<uint32_t>(j);
    r.offset = j * per;
    r.elements = std::min(per, elements - r.offset);
    r.key = PartitionKey(tensor_index, r.index);
    out.push_back(r);
  }
  return out;
}

}  // namespace bitpush::worker
