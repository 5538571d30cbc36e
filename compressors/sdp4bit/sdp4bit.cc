// Placeholder kernel half of sdp4bit, replaced by the SDP4Bit kernels.
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"

namespace bitpush::compressors {
namespace {
std::unique_ptr<Compressor> NewSdp4bit(const v1::CompressorConfig&, IsaLevel) { return nullptr; }
}  // namespace
const MethodKernels kSdp4bitMethodKernels = {&kSdp4bitMethodSpec, &NewSdp4bit, &NewResidualState};
}  // namespace bitpush::compressors
