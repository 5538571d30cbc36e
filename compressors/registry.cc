#include "compressors/registry.h"

#include <string>

namespace bitpush::compressors {
namespace {

constexpr const MethodKernels* kKernels[] = {
#define BITPUSH_METHOD(Name) &k##Name##MethodKernels,
#include "compressors/methods.inc"
#undef BITPUSH_METHOD
};

}  // namespace

const MethodKernels* FindMethodKernels(v1::CompressorId id) {
  for (const MethodKernels* k : kKernels) {
    if (k->spec->id == id) return k;
  }
  return nullptr;
}

StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const v1::CompressorConfig& config,
                                                       const CompressorOptions& options) {
  BP_RETURN_IF_ERROR(CheckIsaSupported(options.isa));
  BP_ASSIGN_OR_RETURN(const v1::CompressorConfig c, CanonicalizeCompressorConfig(config));
  const MethodKernels* k = FindMethodKernels(c.id());
  std::unique_ptr<Compressor> made;
  if (k != nullptr && k->new_compressor != nullptr) made = k->new_compressor(c, options.isa);
  if (made == nullptr) {
    return InternalError("compressor " + CompressorSpecString(c) + " has no factory");
  }
  return made;
}

StatusOr<std::unique_ptr<Compressor>> CreateCompressor(std::string_view spec,
                                                       const CompressorOptions& options) {
  BP_ASSIGN_OR_RETURN(const v1::CompressorConfig c, ParseCompressorSpec(spec));
  return CreateCompressor(c, options);
}

StatusOr<std::unique_ptr<ErrorFeedback>> CreateErrorFeedback(const v1::CompressorConfig& config,
                                                             ErrorFeedbackSide side,
                                                             size_t elements) {
  BP_ASSIGN_OR_RETURN(const v1::CompressorConfig c, CanonicalizeCompressorConfig(config));
  const MethodKernels* k = FindMethodKernels(c.id());
  std::unique_ptr<ErrorFeedback> made;
  if (k != nullptr && k->new_error_feedback != nullptr) {
    made = k->new_error_feedback(c, side, elements);
  }
  if (made == nullptr) {
    // A method that keeps no state on this side (separate's servers) refuses the policy that
    // would ask for one; say so rather than "no factory".
    const Status refused =
        ValidateErrorFeedback(c, side == ErrorFeedbackSide::kWorker ? v1::ERROR_FEEDBACK_WORKER
                                                                    : v1::ERROR_FEEDBACK_SERVER);
    if (!refused.ok()) return refused;
    return InternalError("compressor " + CompressorSpecString(c) +
                         " has no error-feedback factory");
  }
  return made;
}

}  // namespace bitpush::compressors
