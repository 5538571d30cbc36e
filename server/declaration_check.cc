#include "server/declaration_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/dtype.h"
#include "common/logging.h"

namespace bitpush::server {

using transport::Message;
using v1::DataHeader;

namespace {

std::string DescribeDeclaration(const v1::TensorDeclaration& t) {
  const std::string dtype = t.dtype() < static_cast<uint32_t>(kNumDTypes)
                                ? std::string(DTypeName(static_cast<DType>(t.dtype())))
                                : fmt::format("dtype#{}", t.dtype());
  return fmt::format("'{}' ({} x {}, {}, {}{}{})", t.name(), t.elements(), dtype, t.compression(),
                     t.sum() ? "sum" : "average", t.optimizer().empty() ? "" : ", ", t.optimizer());
}

bool SameDeclaration(const v1::TensorDeclaration& a, const v1::TensorDeclaration& b) {
  return a.index() == b.index() && a.name() == b.name() && a.elements() == b.elements() &&
         a.dtype() == b.dtype() && a.compression() == b.compression() && a.sum() == b.sum() &&
         a.optimizer() == b.optimizer();
}

}  // namespace

void DeclarationCheck::Declare(uint32_t worker, const DataHeader& header, const Message& message) {
  if (rank_ != 0) {
    workers_->SendError(
        worker, DataHeader::OP_DECLARE, 0, header.round(),
        FailedPreconditionError(
            fmt::format("tensor declarations go to server 0, but worker {} sent them to server {}",
                        worker, rank_)));
    return;
  }
  v1::TensorManifest manifest;
  if (message.frames.size() != 1 ||
      !manifest.ParseFromArray(message.frames[0].data(),
                               static_cast<int>(message.frames[0].size()))) {
    workers_->SendError(
        worker, DataHeader::OP_DECLARE, 0, header.round(),
        DataLossError(fmt::format("malformed tensor manifest from worker {} (epoch {})", worker,
                                  header.round())));
    return;
  }
  Epoch& epoch = epochs_[header.round()];
  if (epoch.manifests.empty()) epoch.manifests.resize(workers_->count());
  if (epoch.manifests[worker]) {
    workers_->SendError(worker, DataHeader::OP_DECLARE, 0, header.round(),
                        InvalidArgumentError(fmt::format("worker {} declared epoch {} twice",
                                                         worker, header.round())));
    return;
  }
  epoch.manifests[worker] = std::move(manifest);
  if (++epoch.received < workers_->count()) return;

  // Every worker's manifest is here (one per worker, each counted once): compare them tensor by
  // tensor.
  std::vector<const v1::TensorManifest*> manifests;
  manifests.reserve(epoch.manifests.size());
  int longest = 0;
  for (const auto& m : epoch.manifests) {
    if (!m) return;  // unreachable: received counts distinct workers
    manifests.push_back(&*m);
    longest = std::max(longest, m->tensors_size());
  }
  std::string difference;
  const v1::TensorManifest& ref = *manifests[0];
  for (int i = 0; i < longest && difference.empty(); ++i) {
    for (uint32_t w = 1; w < workers_->count() && difference.empty(); ++w) {
      const v1::TensorManifest& other = *manifests[w];
      const bool have_ref = i < ref.tensors_size();
      const bool have_other = i < other.tensors_size();
      if (have_ref && have_other && SameDeclaration(ref.tensors(i), other.tensors(i))) continue;
      const uint32_t index = have_ref ? ref.tensors(i).index() : other.tensors(i).index();
      difference = fmt::format(
          "tensor declarations differ between workers: tensor #{}: worker 0 declared {} but "
          "worker {} declared {}",
          index, have_ref ? DescribeDeclaration(ref.tensors(i)) : "nothing", w,
          have_other ? DescribeDeclaration(other.tensors(i)) : "nothing");
    }
  }
  const uint64_t epoch_id = header.round();
  epochs_.erase(epoch_id);
  for (uint32_t w = 0; w < workers_->count(); ++w) {
    if (!difference.empty()) {
      workers_->SendError(w, DataHeader::OP_DECLARE, 0, epoch_id, InvalidArgumentError(difference));
      continue;
    }
    DataHeader reply;
    reply.set_op(DataHeader::OP_DECLARE_REPLY);
    reply.set_round(epoch_id);
    workers_->Send(w, std::move(reply), {});
  }
  if (!difference.empty()) BP_LOG_ERROR("server 0: {}", difference);
}

}  // namespace bitpush::server
