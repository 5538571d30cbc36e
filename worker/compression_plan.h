// CompressionPlan: whether a declared tensor travels compressed, and why — the one rule the
// worker engine applies at Declare, and the one-line report of it (Client::DescribeCompression,
// the `compression:` line bitpush.torch prints at the start of training).
//
//  - The spec is the declaration's, or when it gives none the cluster's
//    (CompressionSettings::SpecForTensor: the first matching override, else compression.spec).
//  - The tensor travels with that spec when the spec compresses (not "none"), the tensor's
//    whole size is >= compression.min_compress_bytes (partition.h), and it has at least the
//    method's minimum of elements (compressors::MinimumElements: the smallest tensor the method
//    compresses within the error it states; docs/compressors.md "Smallest tensors") unless
//    compression.method_minimum is false; otherwise with "none". The minimum applies whichever
//    spec the tensor has: its declaration's, an override's or the cluster's.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "compressors/method.h"
#include "config/cluster_config.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::worker {

struct TensorCompression {
  enum class Why {
    kCompressed,          // the spec compresses and the tensor is large enough
    kSpecNone,            // the spec is "none"
    kBelowThreshold,      // smaller than compression.min_compress_bytes
    kBelowMethodMinimum,  // fewer elements than its method's minimum (compressors::MinimumElements)
  };
  std::string name;
  size_t elements = 0;
  DType dtype = DType::kFloat32;
  uint64_t bytes = 0;
  std::string requested;        // the spec asked for, canonical (CompressorSpecString)
  v1::CompressorConfig config;  // what the tensor travels with ("none" unless kCompressed)
  Why why = Why::kSpecNone;
  // The requested method's minimum (compressors::MinimumElements; {0, ""} for none).
  compressors::ElementMinimum minimum;

  bool compressed() const { return why == Why::kCompressed; }
};

// The decision for a tensor declared as (name, elements, dtype) with `spec` ("" = the
// cluster's). InvalidArgument naming the spec when it does not parse.
StatusOr<TensorCompression> DecideCompression(const config::CompressionSettings& settings,
                                              const std::string& name, size_t elements, DType dtype,
                                              const std::string& spec);

// "compressed", "spec none", "below min_compress_bytes", "below the method's minimum".
std::string_view WhyName(TensorCompression::Why why);

// One line, beginning "compression: ", that counts the tensors (and their bytes) that travel
// compressed, by spec, and the raw ones, by reason; those below a method's minimum by method,
// minimum and why, naming the first three (in declaration order):
//   compression: separate:... on 3 of 6 tensors (26.0 KiB of 26.6 KiB, 97.6%);
//   raw: 3 tensors (0.6 KiB) below compression.min_compress_bytes=4096,
//   2 tensors (0.6 KiB: conv1.weight, conv1.bias) below separate's minimum of 1024 elements
//   (why)
std::string DescribeCompression(const std::vector<TensorCompression>& tensors,
                                uint64_t min_compress_bytes);

}  // namespace bitpush::worker
