#include "compressors/error_feedback.h"

#include <cstring>
#include <string>

namespace bitpush::compressors {

Status ResidualState::Restore(Span<const float> saved) {
  if (saved.size() != residual_.size()) {
    return InvalidArgumentError("saved residual has " + std::to_string(saved.size()) +
                                " elements; this partition has " +
                                std::to_string(residual_.size()));
  }
  if (!saved.empty()) std::memcpy(residual_.data(), saved.data(), saved.size() * sizeof(float));
  return Status::Ok();
}

std::unique_ptr<ErrorFeedback> NewResidualState(const v1::CompressorConfig&, ErrorFeedbackSide,
                                                size_t elements) {
  return std::make_unique<ResidualState>(elements);
}

}  // namespace bitpush::compressors
