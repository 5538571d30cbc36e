// The spec registry: the compression methods of compressors/methods.inc by id and by name,
// and spec strings <-> typed configs, without any kernel (library bitpush_compressor_specs;
// compressors/registry.h adds the compressor and error-feedback factories on top).
//
// Spec grammar (YAML and CLI):  name[:param=value[,param=value]...]
//   none | fp16 | bf16
//   onebit[:scaled=true|false]                                  default scaled=true
//   topk:ratio=R | topk:k=K                                     (one of them required)
//   randomk:ratio=R|k=K[,unbiased=true|false][,seed=S]          default unbiased=false, seed=0
//   dithering[:levels=S][,partition=linear|natural][,norm=max|l2][,seed=S]
//                                                               default 15, linear, max, 0
// (each method documents its parameters in its MethodSpec::params; docs/compressors.md holds
// the table). Unknown names, unknown parameters, malformed or out-of-range values return
// InvalidArgument naming the offender and listing what is valid.
//
// Canonical form: CompressorSpecString() prints every parameter with its effective value in a
// fixed order, so two configs are equal iff their canonical strings are equal (used for
// config agreement between nodes).
//
// Thread-safety: all functions are thread-safe (the registry is an immutable table).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/span.h"
#include "common/status.h"
#include "compressors/method.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

// Every method, in the order of compressors/methods.inc (id order).
Span<const MethodSpec* const> Methods();
// The method with this id or spec name; nullptr when there is none.
const MethodSpec* FindMethod(v1::CompressorId id);
const MethodSpec* FindMethod(std::string_view name);

// Parses and validates `spec`; the result has every optional parameter filled in.
StatusOr<v1::CompressorConfig> ParseCompressorSpec(std::string_view spec);

// Validates a config (e.g. one received over the wire) and returns it with defaults filled.
StatusOr<v1::CompressorConfig> CanonicalizeCompressorConfig(const v1::CompressorConfig& config);

// The canonical spec string of a config (which must be valid).
std::string CompressorSpecString(const v1::CompressorConfig& config);

// Names of all registered compressors, in id order ("none", "fp16", ...).
std::vector<std::string> CompressorNames();
// The registered name of an id ("" for an unknown id).
std::string_view CompressorName(v1::CompressorId id);

// Whether the method of `id` compresses (MethodSpec::compresses): false only for a method that
// sends the tensor as it is (none). An id this build does not know counts as compressing; the
// caller that meets one refuses it when it builds the compressor.
bool MethodCompresses(v1::CompressorId id);

// Error-feedback policy names: "none", "worker", "server", "both".
StatusOr<v1::ErrorFeedbackPolicy> ParseErrorFeedbackPolicy(std::string_view name);
std::string_view ErrorFeedbackPolicyName(v1::ErrorFeedbackPolicy policy);

// OK iff `policy` suits `config` (a valid, canonical config): InvalidArgument naming both
// otherwise, e.g. unbiased random-k with error feedback.
Status ValidateErrorFeedback(const v1::CompressorConfig& config, v1::ErrorFeedbackPolicy policy);

// The policy "auto" picks for `config`: error feedback on both sides where the method is
// biased (paper 001), none otherwise.
v1::ErrorFeedbackPolicy RecommendedErrorFeedback(const v1::CompressorConfig& config);

// OK where a raw-weight pull (compressors/mirror_pull.h) with this (canonical) config is sound:
// the method sends values as they are, or needs no error feedback (it is unbiased or lossless).
// InvalidArgument naming the method and the difference form otherwise.
Status CheckRawWeightPull(const v1::CompressorConfig& config);

// The element count partitions of a tensor compressed with `config` are cut at multiples of
// (MethodSpec::partition_align; 1 for a method without blocks or an unknown id).
size_t PartitionAlign(const v1::CompressorConfig& config);

// The smallest tensor `config` (canonical) compresses, and why (MethodSpec::min_elements;
// {0, ""} for a method without a minimum or an unknown id).
ElementMinimum MinimumElements(const v1::CompressorConfig& config);

}  // namespace bitpush::compressors
