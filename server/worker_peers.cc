#include "server/worker_peers.h"

#include <fmt/format.h>

#include <utility>

#include "common/logging.h"
#include "config/cluster_config.h"

namespace bitpush::server {

using transport::Buffer;
using v1::DataHeader;

Status WorkerPeers::Connect(const v1::Assignment& a) {
  count_.store(static_cast<uint32_t>(a.workers_size()), std::memory_order_release);
  for (int i = 0; i < a.workers_size(); ++i) {
    const std::string peer = node::NodePeerId(v1::ROLE_WORKER, static_cast<uint32_t>(i));
    // The worker's data plane: its data address when it has one (transport ucx).
    const v1::NodeInfo& w = a.workers(i);
    const std::string& address = w.data_address().empty() ? w.address() : w.data_address();
    BP_RETURN_IF_ERROR(endpoint_->Connect(peer, address)
                           .WithContext(fmt::format("server {}: connecting to worker {} at {}",
                                                    rank_, i, address)));
  }
  return Status::Ok();
}

bool WorkerPeers::MayLog(const std::string& key, std::string* suffix) {
  uint64_t suppressed = 0;
  bool ok;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    ok = log_limiter_.Allow(key, &suppressed);
  }
  *suffix = suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "";
  return ok;
}

void WorkerPeers::SendError(uint32_t worker, DataHeader::Op refused, uint64_t key, uint64_t round,
                            const Status& status) {
  ++counters_->pushes_rejected;
  if (std::string more; MayLog(fmt::format("worker:{}", worker), &more)) {
    BP_LOG_WARN("server {}: refused a request from worker {}: {}{}", rank_, worker,
                status.ToString(), more);
  }
  DataHeader h;
  h.set_op(DataHeader::OP_ERROR);
  h.set_key(key);
  h.set_round(round);
  h.set_error(status.message());
  h.set_error_code(static_cast<uint32_t>(status.code()));
  h.set_refused_op(refused);
  Send(worker, std::move(h), {});
}

void WorkerPeers::Send(uint32_t worker, DataHeader header, std::vector<Buffer> frames) {
  header.set_sender(rank_);
  const Status sent =
      endpoint_->SendData(node::NodePeerId(v1::ROLE_WORKER, worker), header, std::move(frames));
  if (!sent.ok()) {
    BP_LOG_WARN("server {}: cannot answer worker {}: {}", rank_, worker, sent.ToString());
  }
}

}  // namespace bitpush::server
