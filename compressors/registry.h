// The compressor registry: the spec registry (compressors/spec_registry.h: methods by id and
// name, spec strings <-> typed configs) plus what needs the kernels: compressor instances and
// the methods' error-feedback states, from the kernel halves of the descriptors listed in
// compressors/methods.inc (library bitpush_compressors).
//
// Code that only parses, validates or prints specs includes spec_registry.h and links
// bitpush_compressor_specs alone.
//
// Thread-safety: all functions are thread-safe (the registry is an immutable table); the
// objects they create are used by one thread at a time (compressor.h, error_feedback.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"
#include "compressors/spec_registry.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

// The kernel half of the method with this id; nullptr when there is none.
const MethodKernels* FindMethodKernels(v1::CompressorId id);

// Validates `config` (CanonicalizeCompressorConfig) and builds its compressor with the
// kernels of options.isa (FailedPrecondition where the CPU lacks it).
StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const v1::CompressorConfig& config,
                                                       const CompressorOptions& options = {});
StatusOr<std::unique_ptr<Compressor>> CreateCompressor(std::string_view spec,
                                                       const CompressorOptions& options = {});

// The error-feedback state the method of `config` keeps for one partition of `elements` on
// `side` (whether that side keeps one is the policy's call: WorkerKeepsResidual /
// ServerKeepsResidual).
StatusOr<std::unique_ptr<ErrorFeedback>> CreateErrorFeedback(const v1::CompressorConfig& config,
                                                             ErrorFeedbackSide side,
                                                             size_t elements);

}  // namespace bitpush::compressors
