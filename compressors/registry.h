// The compressor registry: spec strings <-> typed configs <-> compressor instances.
//
// Spec grammar (YAML and CLI):  name[:param=value[,param=value]...]
//   none | fp16 | bf16
//   onebit[:scaled=true|false]                                  default scaled=true
//   topk:ratio=R | topk:k=K                                     (one of them required)
//   randomk:ratio=R|k=K[,unbiased=true|false][,seed=S]          default unbiased=false, seed=0
//   dithering[:levels=S][,partition=linear|natural][,norm=max|l2][,seed=S]
//                                                               default 15, linear, max, 0
// Unknown names, unknown parameters, malformed or out-of-range values return
// InvalidArgument naming the offender and listing what is valid.
//
// Canonical form: CompressorSpecString() prints every parameter with its effective value in a
// fixed order, so two configs are equal iff their canonical strings are equal (used for
// config agreement between nodes).
//
// Thread-safety: all functions are thread-safe (the registry is an immutable table).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compressors/compressor.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

// Parses and validates `spec`; the result has every optional parameter filled in.
StatusOr<v1::CompressorConfig> ParseCompressorSpec(std::string_view spec);

// Validates a config (e.g. one received over the wire) and returns it with defaults filled.
StatusOr<v1::CompressorConfig> CanonicalizeCompressorConfig(const v1::CompressorConfig& config);

// The canonical spec string of a config (which must be valid).
std::string CompressorSpecString(const v1::CompressorConfig& config);

StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const v1::CompressorConfig& config,
                                                       const CompressorOptions& options = {});
StatusOr<std::unique_ptr<Compressor>> CreateCompressor(std::string_view spec,
                                                       const CompressorOptions& options = {});

// Names of all registered compressors, in id order ("none", "fp16", ...).
std::vector<std::string> CompressorNames();
// The registered name of an id ("" for an unknown id).
std::string_view CompressorName(v1::CompressorId id);

// Error-feedback policy names: "none", "worker", "server", "both".
StatusOr<v1::ErrorFeedbackPolicy> ParseErrorFeedbackPolicy(std::string_view name);
std::string_view ErrorFeedbackPolicyName(v1::ErrorFeedbackPolicy policy);

}  // namespace bitpush::compressors
