// CompressionPlan: whether a declared tensor travels compressed, and why — the one rule the
// worker engine applies at Declare, and the one-line report of it (Client::DescribeCompression,
// the `compression:` line bitpush.torch prints at the start of training).
//
//  - The spec is the declaration's, or when it gives none the cluster's
//    (CompressionSettings::SpecForTensor: the first matching override, else compression.spec).
//  - The tensor travels with that spec when the spec compresses (not "none") and the tensor's
//    whole size is >= compression.min_compress_bytes (partition.h); otherwise with "none".
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "config/cluster_config.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::worker {

struct TensorCompression {
  enum class Why {
    kCompressed,      // the spec compresses and the tensor is large enough
    kSpecNone,        // the spec is "none"
    kBelowThreshold,  // smaller than compression.min_compress_bytes
  };
  std::string name;
  size_t elements = 0;
  DType dtype = DType::kFloat32;
  uint64_t bytes = 0;
  std::string requested;        // the spec asked for, canonical (CompressorSpecString)
  v1::CompressorConfig config;  // what the tensor travels with ("none" unless kCompressed)
  Why why = Why::kSpecNone;

  bool compressed() const { return why == Why::kCompressed; }
};

// The decision for a tensor declared as (name, elements, dtype) with `spec` ("" = the
// cluster's). InvalidArgument naming the spec when it does not parse.
StatusOr<TensorCompression> DecideCompression(const config::CompressionSettings& settings,
                                              const std::string& name, size_t elements, DType dtype,
                                              const std::string& spec);

// One line, beginning "compression: ", that counts the tensors (and their bytes) that travel
// compressed, by spec, and the raw ones, by reason:
//   compression: onebit:scaled=true on 3 of 6 tensors (26.0 KiB of 26.6 KiB, 97.6%);
//   raw: 3 tensors (0.6 KiB) below compression.min_compress_bytes=4096
std::string DescribeCompression(const std::vector<TensorCompression>& tensors,
                                uint64_t min_compress_bytes);

}  // namespace bitpush::worker
