// worker/partition.h: how tensors are cut into keys — partition sizes per dtype, the last
// partial partition, keys, the compression threshold — exact values.
#include <gtest/gtest.h>

#include "worker/partition.h"

namespace bitpush::worker {
namespace {

TEST(WorkerPartition, ElementsPerPartitionFollowTheDtype) {
  EXPECT_EQ(PartitionElements(DType::kFloat32, 4096000), 1024000u);
  EXPECT_EQ(PartitionElements(DType::kFloat16, 4096000), 2048000u);
  EXPECT_EQ(PartitionElements(DType::kBFloat16, 4096), 2048u);
  // Rounds down; never 0.
  EXPECT_EQ(PartitionElements(DType::kFloat32, 4099), 1024u);
  EXPECT_EQ(PartitionElements(DType::kFloat32, 3), 1u);
  EXPECT_EQ(PartitionElements(DType::kFloat32, 1), 1u);
}

TEST(WorkerPartition, KeysAreTensorIndexAndPartition) {
  EXPECT_EQ(PartitionKey(0, 0), 0u);
  EXPECT_EQ(PartitionKey(0, 7), 7u);
  EXPECT_EQ(PartitionKey(3, 2), (uint64_t{3} << 32) | 2);
  EXPECT_EQ(PartitionKey(0xffffffffu, 0xffffffffu), ~uint64_t{0});
}

TEST(WorkerPartition, LastPartitionHoldsTheRest) {
  // 2500 fp32 with 4096-byte partitions (1024 elements): 1024, 1024, 452.
  auto parts = PartitionTensor(5, 2500, DType::kFloat32, 4096);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 3u);
  const size_t offsets[] = {0, 1024, 2048};
  const size_t counts[] = {1024, 1024, 452};
  for (uint32_t j = 0; j < 3; ++j) {
    EXPECT_EQ((*parts)[j].index, j);
    EXPECT_EQ((*parts)[j].offset, offsets[j]);
    EXPECT_EQ((*parts)[j].elements, counts[j]);
    EXPECT_EQ((*parts)[j].key, PartitionKey(5, j));
  }
}

TEST(WorkerPartition, ExactMultipleHasNoEmptyTail) {
  auto parts = PartitionTensor(0, 4096, DType::kFloat16, 4096);  // 2048 per partition
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[1].offset, 2048u);
  EXPECT_EQ((*parts)[1].elements, 2048u);
}

TEST(WorkerPartition, SmallAndEmptyTensors) {
  auto one = PartitionTensor(1, 1, DType::kFloat32, 4096000);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].elements, 1u);
  EXPECT_EQ((*one)[0].key, PartitionKey(1, 0));

  auto none = PartitionTensor(2, 0, DType::kFloat32, 4096000);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(WorkerPartition, TooManyPartitionsIsRefused) {
  // 1-byte partitions of fp32 hold one element each: 2^32 + 1 elements need 2^32 + 1 keys.
  const size_t elements = (size_t{1} << 32) + 1;
  auto parts = PartitionTensor(0, elements, DType::kFloat32, 1);
  ASSERT_FALSE(parts.ok());
  EXPECT_EQ(parts.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parts.status().message().find("partitions"), std::string::npos);
}

TEST(WorkerPartition, CompressionThresholdTestsTheWholeTensor) {
  // min_compress_bytes = 1 MiB: 262144 fp32 are exactly 1 MiB (compressed), one less is not.
  EXPECT_TRUE(AboveCompressThreshold(262144, DType::kFloat32, 1048576));
  EXPECT_FALSE(AboveCompressThreshold(262143, DType::kFloat32, 1048576));
  // fp16 needs twice the elements.
  EXPECT_FALSE(AboveCompressThreshold(262144, DType::kFloat16, 1048576));
  EXPECT_TRUE(AboveCompressThreshold(524288, DType::kFloat16, 1048576));
  // The whole tensor counts, not the partition: 3 partitions of 4 KiB, threshold 8 KiB.
  EXPECT_TRUE(AboveCompressThreshold(2500, DType::kFloat32, 8192));
  EXPECT_TRUE(AboveCompressThreshold(0, DType::kFloat32, 0));
  EXPECT_FALSE(AboveCompressThreshold(0, DType::kFloat32, 1));
}

}  // namespace
}  // namespace bitpush::worker
