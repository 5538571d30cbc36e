// A compression method, described once: its descriptor in two halves that live in the method's
// own folder (compressors/<folder>/) and are listed, one line per method, in
// compressors/methods.inc.
//
//   MethodSpec     (<folder>/<name>_spec.cc, library bitpush_compressor_specs)
//                  what a method is without its kernels: frozen id and spec name, documented
//                  parameters, spec parsing / validation / defaults / canonical formatting,
//                  which error-feedback policies suit it, whether it compresses at all, how
//                  servers aggregate it, and where its wire layout is documented. Anything
//                  that only parses or compares configurations (the scheduler, config
//                  agreement, the spec fuzzer) links this half alone.
//   MethodKernels  (<folder>/<name>.cc, library bitpush_compressors)
//                  what runs: the Compressor factory (SIMD kernels) and the factory of the
//                  method's error-feedback state (compressors/error_feedback.h).
//
// compressors/spec_registry.h and compressors/registry.h turn the table into lookups and the
// public spec / factory functions; docs/compressors.md "Adding a method" lists the files a new
// method touches.
//
// Descriptors are immutable constants with static storage, initialised at compile time (no
// static-initialisation order, no registration at run time): every function here is thread-
// safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/cpu_features.h"
#include "common/span.h"
#include "common/status.h"
#include "compressors/payload.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

class Compressor;
class ErrorFeedback;

// How servers aggregate a method's pushes (docs/compressors.md "Server aggregation modes");
// server::KeyState runs both.
enum class AggregationMode : uint8_t {
  // Decompress every push, sum in fp32 (times 1/n when averaging), add the server residual
  // where the key keeps one, re-compress the aggregate (paper 001 Algorithms 3 and 4).
  kDecompressSumRecompress,
  // Never decompress: the server validates each push and hands them all to the compressor's
  // compressed-domain round (Compressor::AggregateCompress), which combines the codes
  // themselves — separate sums projection vectors; binsgdm counts sign bits, adds the server
  // residual and re-binarises. Such a compressor must fuse the server round
  // (FusesServerRound) for every server-residual setting its method accepts; its Decompress
  // is the workers' alone.
  kCompressedDomainSum,
};
// (Servers that own the weights and run the optimizer are a key's option on top of the first
// mode, whatever the method: server::KeySpec::optimizer. The compressed-domain mode refuses
// it: the server never holds the gradient.)

// "decompress-sum-recompress", "compressed-domain-sum".
std::string_view AggregationModeName(AggregationMode mode);

// The side of the wire a partition's error-feedback state lives on.
enum class ErrorFeedbackSide : uint8_t { kWorker, kServer };

// One parameter of a method's spec string, as documented and as listed in error messages.
struct ParamDoc {
  const char* name;           // as written in a spec: "ratio"
  const char* values;         // the valid values, for docs: "0 < R <= 1", "linear | natural"
  const char* default_value;  // the canonical form's default; "" when there is none
  const char* example;        // a valid value of this parameter on its own (tests, docs)
  const char* doc;            // one line: what it does
};

// The smallest tensor a method compresses, and why (MethodSpec::min_elements).
struct ElementMinimum {
  size_t elements = 0;  // tensors of fewer elements travel raw; 0: no minimum
  std::string why;      // one line for the `compression:` report: "projection noise ..."
};

// The spec half of a method's descriptor. A method defines one constant
// `const MethodSpec k<Name>MethodSpec` in its <name>_spec.cc (see compressors/methods.inc).
struct MethodSpec {
  // The frozen wire id (proto/bitpush/v1/compression.proto) and the spec-string name.
  v1::CompressorId id = v1::COMPRESSOR_ID_UNSPECIFIED;
  const char* name = "";
  // The method's member of CompressorConfig's `params` oneof (its field number).
  v1::CompressorConfig::ParamsCase params_case = v1::CompressorConfig::PARAMS_NOT_SET;
  // Every parameter, in canonical order (the order of "valid parameters" messages).
  Span<const ParamDoc> params;

  // false for a method that sends the tensor's values as they are (none): such tensors keep no
  // error feedback and weigh as uncompressed keys in server placement.
  bool compresses = true;
  // Whether a NaN / inf in the input reaches the decoded output, so that AMP's overflow check
  // still sees it (docs/errors.md). false: the format has no non-finite value (binsgdm decodes
  // to exactly +-1); such a method restarts the state of the elements concerned instead.
  bool carries_non_finite = true;
  AggregationMode aggregation = AggregationMode::kDecompressSumRecompress;
  // The payload format version its compressor writes (the header's first byte), and the
  // section of docs/wire-format.md that lays out its body ("wire-format.md#<anchor>").
  uint8_t payload_format = kPayloadFormatVersion;
  const char* wire_format = "";

  // ---- spec hooks; nullptr where the method has no such step ----

  // Sets `param`, one of `params` (the registry refuses others), from its text `value`.
  // InvalidArgument naming the method, the parameter and what is valid on a bad value.
  Status (*set_param)(const MethodSpec& method, std::string_view param, std::string_view value,
                      v1::CompressorConfig* config) = nullptr;
  // Range-checks the parameters and fills every default. `config` carries this method's member
  // of the params oneof (possibly empty).
  Status (*canonicalize)(const MethodSpec& method, v1::CompressorConfig* config) = nullptr;
  // Appends the parameters of a canonical config in canonical form (":p=v,p=v").
  void (*format_params)(const v1::CompressorConfig& config, std::string* spec) = nullptr;
  // InvalidArgument when `policy` does not suit `config` (a canonical config of this method).
  // nullptr: every policy does.
  Status (*check_error_feedback)(const v1::CompressorConfig& config,
                                 v1::ErrorFeedbackPolicy policy) = nullptr;
  // The policy a tool picks for "auto" (bitpush-bench): error feedback where the method is
  // biased. nullptr: none.
  v1::ErrorFeedbackPolicy (*recommended_error_feedback)(const v1::CompressorConfig& config) =
      nullptr;
  // The element count every partition but a tensor's last is a multiple of (the method's block
  // or group size, so no block straddles two keys). nullptr: 1.
  size_t (*partition_align)(const v1::CompressorConfig& config) = nullptr;
  // The smallest tensor (in elements) the method compresses within the error it states for
  // large ones, and why; smaller tensors travel raw unless compression.method_minimum is false
  // (worker/compression_plan.h; docs/compressors.md "Smallest tensors"). nullptr: no minimum.
  ElementMinimum (*min_elements)(const v1::CompressorConfig& config) = nullptr;
};

// The kernel half of a method's descriptor: `const MethodKernels k<Name>MethodKernels`, defined
// beside the method's kernels. Factories receive canonical configs of the method (every
// parameter filled in), so they read fields directly.
struct MethodKernels {
  // The spec half of the same method.
  const MethodSpec* spec = nullptr;
  std::unique_ptr<Compressor> (*new_compressor)(const v1::CompressorConfig& config,
                                                IsaLevel isa) = nullptr;
  // The method's error-feedback state of one partition of `elements` on `side`.
  std::unique_ptr<ErrorFeedback> (*new_error_feedback)(const v1::CompressorConfig& config,
                                                       ErrorFeedbackSide side,
                                                       size_t elements) = nullptr;
};

// Declarations of every method's two halves, one pair per line of compressors/methods.inc.
#define BITPUSH_METHOD(Name)                   \
  extern const MethodSpec k##Name##MethodSpec; \
  extern const MethodKernels k##Name##MethodKernels;
#include "compressors/methods.inc"
#undef BITPUSH_METHOD

}  // namespace bitpush::compressors
