#include "compressors/mirror_pull.h"

#include <algorithm>
#include <string>

#include "compressors/spec_registry.h"

namespace bitpush::compressors {

size_t CompressorPullCodec::MaxBytes(size_t n) const {
  return c_->MaxCompressedBytes(n, DType::kFloat32);
}

StatusOr<size_t> CompressorPullCodec::Encode(Span<const float> v, const CompressContext& ctx,
                                             MutableByteSpan out) {
  return c_->Compress(ConstTensorView(v), ctx, out);
}

Status CompressorPullCodec::DecodeAdd(ByteSpan payload, Span<float> acc) {
  // Compressor::DecompressAdd validates the whole payload before it touches acc.
  return c_->DecompressAdd(payload, acc);
}

MirrorPull::MirrorPull(PullCodec* codec, Span<const float> initial)
    : codec_(codec), mirror_(initial.begin(), initial.end()) {}

StatusOr<size_t> MirrorPull::Encode(Span<const float> w, const CompressContext& ctx,
                                    MutableByteSpan out) {
  const size_t n = mirror_.size();
  if (w.size() != n) {
    return InvalidArgumentError("mirror pull: weights of " + std::to_string(w.size()) +
                                " elements for a mirror of " + std::to_string(n));
  }
  diff_.resize(n);
  for (size_t i = 0; i < n; ++i) diff_[i] = w[i] - mirror_[i];
  auto bytes = codec_->Encode({diff_.data(), n}, ctx, out);
  if (!bytes.ok()) return bytes.status();
  // The receivers' operation on the mirror, the same call: mirror += D(payload) (DecodeAdd
  // validates the whole payload first, so a failing decode leaves the mirror as it was).
  BP_RETURN_IF_ERROR(codec_->DecodeAdd({out.data(), *bytes}, {mirror_.data(), n}));
  return *bytes;
}

Status MirrorPull::SetMirror(Span<const float> mirror) {
  if (mirror.size() != mirror_.size()) {
    return InvalidArgumentError("mirror pull: a mirror of " + std::to_string(mirror.size()) +
                                " elements for a tensor of " + std::to_string(mirror_.size()));
  }
  std::copy(mirror.begin(), mirror.end(), mirror_.begin());
  return Status::Ok();
}

Status ApplyMirrorPull(PullCodec& codec, ByteSpan payload, Span<float> w) {
  // The sender's mirror update, the same call on the same bits: the receiver's weights and the
  // mirror stay equal.
  return codec.DecodeAdd(payload, w);
}

}  // namespace bitpush::compressors
