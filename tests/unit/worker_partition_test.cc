// worker/partition.h: how tensors are cut into keys — partition sizes per dtype, the last
// partial partition, keys, the compression threshold — exact values; worker/compression_plan.h:
// which tensors travel compressed, why, and the `compression:` line that says so.
#include <gtest/gtest.h>

#include "compressors/spec_registry.h"
#include "worker/compression_plan.h"
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

config::CompressionSettings Settings(const std::string& spec, uint64_t min_bytes) {
  config::CompressionSettings c;
  c.spec = spec;
  c.min_compress_bytes = min_bytes;
  return c;
}

TEST(CompressionPlan, DecidesBySpecAndSizeAndSaysWhy) {
  const config::CompressionSettings c = Settings("onebit", 4096);
  using Why = TensorCompression::Why;
  // 1024 fp32 = 4096 bytes: compressed with the cluster's spec.
  StatusOr<TensorCompression> t = DecideCompression(c, "w", 1024, DType::kFloat32, "");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->why, Why::kCompressed);
  EXPECT_EQ(t->bytes, 4096u);
  EXPECT_EQ(t->requested, "onebit:scaled=true");
  EXPECT_EQ(compressors::CompressorSpecString(t->config), "onebit:scaled=true");
  // One element less: raw, below the threshold.
  t = DecideCompression(c, "b", 1023, DType::kFloat32, "");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->why, Why::kBelowThreshold);
  EXPECT_EQ(compressors::CompressorSpecString(t->config), "none");
  // The declaration's own spec wins over the cluster's; "none" is raw whatever the size.
  t = DecideCompression(c, "w", 1 << 20, DType::kFloat32, "none");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->why, Why::kSpecNone);
  t = DecideCompression(c, "w", 1 << 20, DType::kFloat32, "topk:ratio=0.5");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->why, Why::kCompressed);
  EXPECT_EQ(t->requested.rfind("topk:", 0), 0u) << t->requested;
  // A bad spec is an error naming it.
  t = DecideCompression(c, "w", 1024, DType::kFloat32, "onebti");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("onebti"), std::string::npos) << t.status().ToString();
}

TEST(CompressionPlan, TheDefaultThresholdCompressesASmallModelsWeights) {
  // A 64x128 weight (32 KiB) is compressed at the default min_compress_bytes; a 128-element
  // bias (512 B) is not (docs/config.md has the measurement behind the default).
  config::CompressionSettings c;
  c.spec = "onebit";
  EXPECT_EQ(c.min_compress_bytes, 4096u);
  EXPECT_TRUE(DecideCompression(c, "fc.weight", 64 * 128, DType::kFloat32, "")->compressed());
  EXPECT_FALSE(DecideCompression(c, "fc.bias", 128, DType::kFloat32, "")->compressed());
}

TEST(CompressionPlan, TheLineCountsTensorsAndBytesBySpecAndReason) {
  const config::CompressionSettings c = Settings("onebit", 4096);
  std::vector<TensorCompression> ts;
  auto add = [&](const std::string& name, size_t elements, const std::string& spec) {
    StatusOr<TensorCompression> t = DecideCompression(c, name, elements, DType::kFloat32, spec);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ts.push_back(*t);
  };
  // The digits MLP: 64x128, 128, 128x128, 128, 128x10, 10.
  add("0.weight", 8192, "");
  add("0.bias", 128, "");
  add("2.weight", 16384, "");
  add("2.bias", 128, "");
  add("4.weight", 1280, "");
  add("4.bias", 10, "");
  EXPECT_EQ(DescribeCompression(ts, 4096),
            "compression: onebit:scaled=true on 3 of 6 tensors (101.0 KiB of 102.0 KiB, 99.0%); "
            "raw: 3 tensors (1.0 KiB) below compression.min_compress_bytes=4096");
  add("emb", 1 << 20, "none");
  add("head", 1 << 18, "fp16");
  EXPECT_EQ(DescribeCompression(ts, 4096),
            "compression: fp16 on 1, onebit:scaled=true on 3 of 8 tensors (1.1 MiB of 5.1 MiB, "
            "21.5%); raw: 3 tensors (1.0 KiB) below compression.min_compress_bytes=4096, "
            "1 tensor (4.0 MiB) with spec none");
  std::vector<TensorCompression> raw(ts.begin() + 6, ts.begin() + 7);
  EXPECT_EQ(DescribeCompression(raw, 4096),
            "compression: none of 1 tensor (4.0 MiB) compressed; raw: 1 tensor (4.0 MiB) with "
            "spec none");
  EXPECT_EQ(DescribeCompression({}, 4096), "compression: no tensors declared");
}

TEST(CompressionPlan, TensorsBelowTheMethodsMinimumGoRawWhateverChoseTheSpec) {
  using Why = TensorCompression::Why;
  // separate's minimum is 64 x CR elements (1024 at its default CR 16); min_compress_bytes 0
  // does not lift it.
  config::CompressionSettings c = Settings("separate", 0);
  StatusOr<TensorCompression> t = DecideCompression(c, "conv1.weight", 1023, DType::kFloat32, "");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->why, Why::kBelowMethodMinimum);
  EXPECT_EQ(t->minimum.elements, 1024u);
  EXPECT_EQ(compressors::CompressorSpecString(t->config), "none");
  EXPECT_EQ(WhyName(t->why), "below the method's minimum");
  EXPECT_EQ(DecideCompression(c, "w", 1024, DType::kFloat32, "")->why, Why::kCompressed);
  // The minimum follows the spec's own ratio.
  EXPECT_EQ(DecideCompression(c, "w", 255, DType::kFloat32, "separate:ratio=4")->why,
            Why::kBelowMethodMinimum);
  EXPECT_EQ(DecideCompression(c, "w", 256, DType::kFloat32, "separate:ratio=4")->why,
            Why::kCompressed);
  // min_compress_bytes is checked first and named when both apply.
  EXPECT_EQ(DecideCompression(Settings("separate", 4096), "b", 16, DType::kFloat32, "")->why,
            Why::kBelowThreshold);
  // A method without a minimum compresses any size.
  EXPECT_EQ(DecideCompression(Settings("onebit", 0), "b", 1, DType::kFloat32, "")->why,
            Why::kCompressed);
  // The same rule for a spec from an override and from the declaration.
  config::CompressionSettings o = Settings("onebit", 0);
  o.overrides.push_back({"*.bias", "separate"});
  EXPECT_EQ(DecideCompression(o, "fc.bias", 10, DType::kFloat32, "")->why,
            Why::kBelowMethodMinimum);
  EXPECT_EQ(DecideCompression(o, "fc.weight", 10, DType::kFloat32, "")->why, Why::kCompressed);
  EXPECT_EQ(DecideCompression(o, "fc.weight", 10, DType::kFloat32, "separate")->why,
            Why::kBelowMethodMinimum);
  // compression.method_minimum: false compresses them all.
  c.method_minimum = false;
  o.method_minimum = false;
  EXPECT_EQ(DecideCompression(c, "conv1.weight", 1023, DType::kFloat32, "")->why, Why::kCompressed);
  EXPECT_EQ(DecideCompression(o, "fc.bias", 10, DType::kFloat32, "")->why, Why::kCompressed);
  EXPECT_EQ(DecideCompression(c, "b", 1, DType::kFloat32, "")->why, Why::kCompressed);
}

TEST(CompressionPlan, TheLineNamesTheTensorsBelowAMethodsMinimumAndWhy) {
  const config::CompressionSettings c = Settings("separate", 0);
  std::vector<TensorCompression> ts;
  auto add = [&](const std::string& name, size_t elements, const std::string& spec) {
    StatusOr<TensorCompression> t = DecideCompression(c, name, elements, DType::kFloat32, spec);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ts.push_back(*t);
  };
  // A small CNN on 8x8 digits: conv 1->16 3x3, conv 16->32 3x3, a 512x10 classifier.
  add("conv1.weight", 144, "");
  add("conv1.bias", 16, "");
  add("conv2.weight", 4608, "");
  add("conv2.bias", 32, "");
  const std::string separate = "separate:ratio=16,block=32,beta=0.95,reset=128,ema=stable,seed=0";
  const std::string why =
      "below separate's minimum of 1024 elements (projection noise (B+1)/m = 16.5x the "
      "gradient's energy; SGD diverged on smaller tensors)";
  EXPECT_EQ(DescribeCompression(ts, 0), "compression: " + separate +
                                            " on 1 of 4 tensors (18.0 KiB of 18.8 KiB, 96.0%); "
                                            "raw: 3 tensors (768 B: conv1.weight, conv1.bias and "
                                            "conv2.bias) " +
                                            why);
  add("fc.weight", 5120, "");
  add("fc.bias", 10, "");
  add("emb", 100, "none");
  add("head.bias", 64, "separate:ratio=4");
  EXPECT_EQ(DescribeCompression(ts, 0),
            "compression: " + separate +
                " on 2 of 8 tensors (38.0 KiB of 39.4 KiB, 96.4%); raw: 4 tensors (808 B: "
                "conv1.weight, conv1.bias, conv2.bias and 1 more) " +
                why +
                ", 1 tensor (256 B: head.bias) below separate's minimum of 256 elements "
                "(projection noise (B+1)/m = 4.125x the gradient's energy; SGD diverged on "
                "smaller tensors), 1 tensor (400 B) with spec none");
}

// PartitionBytesFor: compressed tensors keep partition_bytes; raw ones are cut into
// tensor / (48 (W + S)), at least 256 KiB, at most partition_bytes; an explicit
// raw_partition_bytes is used as it is (capped by partition_bytes).
TEST(Partition, RawTensorsAreCutForThePipeline) {
  PartitionSizing s;
  s.partition_bytes = 4096000;
  s.workers = 2;
  s.servers = 2;
  const uint64_t mib100 = 100ull << 20;
  EXPECT_EQ(PartitionBytesFor(mib100, /*compressed=*/true, s), 4096000u);
  EXPECT_EQ(PartitionBytesFor(mib100, false, s), mib100 / (48 * 4));  // 546133
  s.workers = 4;
  s.servers = 4;
  EXPECT_EQ(PartitionBytesFor(mib100, false, s), mib100 / (48 * 8));  // 273066
  s.workers = 8;
  s.servers = 8;
  EXPECT_EQ(PartitionBytesFor(mib100, false, s), 256u << 10);  // the floor
  EXPECT_EQ(PartitionBytesFor(4 << 20, false, s), 256u << 10);
  s.workers = 1;
  s.servers = 1;
  EXPECT_EQ(PartitionBytesFor(4ull << 30, false, s), 4096000u);  // the cap
  s.partition_bytes = 4096;
  EXPECT_EQ(PartitionBytesFor(mib100, false, s), 4096u);  // never above partition_bytes
  s.raw_partition_bytes = 1000;
  EXPECT_EQ(PartitionBytesFor(mib100, false, s), 1000u);
  s.raw_partition_bytes = 1 << 20;
  EXPECT_EQ(PartitionBytesFor(mib100, false, s), 4096u);
  EXPECT_EQ(PartitionBytesFor(mib100, true, s), 4096u);
  s.workers = 0;  // no division by zero on an empty cluster
  s.servers = 0;
  s.raw_partition_bytes = 0;
  s.partition_bytes = 4096000;
  EXPECT_EQ(PartitionBytesFor(mib100, false, s), 2184533u);  // mib100 / 48
}

TEST(Partition, SizingOfAClusterConfig) {
  config::ClusterConfig c;
  c.servers = {"tcp://a:1", "tcp://b:1", "tcp://c:1"};
  c.workers = {"tcp://d:1"};
  c.compression.partition_bytes = 8192;
  c.compression.raw_partition_bytes = 2048;
  const PartitionSizing s = PartitionSizingOf(c);
  EXPECT_EQ(s.servers, 3u);
  EXPECT_EQ(s.workers, 1u);
  EXPECT_EQ(s.partition_bytes, 8192u);
  EXPECT_EQ(s.raw_partition_bytes, 2048u);
}

}  // namespace
}  // namespace bitpush::worker
