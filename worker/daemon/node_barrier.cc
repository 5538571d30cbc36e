#include "worker/daemon/node_barrier.h"

#include <fmt/format.h>
#include <pthread.h>

#include <utility>

#include "common/logging.h"
#include "worker/ipc/local_protocol.h"

namespace bitpush::worker {

NodeBarrier::NodeBarrier(NodeBarrierOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
  pthread_setname_np(thread_.native_handle(), "bp-dbarrier");
}

NodeBarrier::~NodeBarrier() {
  Stop();
}

void NodeBarrier::Enter(const std::shared_ptr<ipc::Channel>& channel, const std::string& who,
                        uint64_t seq, uint32_t local_size) {
  if (seq != seq_) {
    // Another process is still in an earlier barrier: this one waits for the next gathering.
    // (Every process enters barriers in order, so seq is seq_ or seq_ + 1.)
    if (seq != seq_ + 1) {
      SendDone(*channel, seq,
               InvalidArgumentError(
                   fmt::format("{}: {} entered barrier {} while barrier {} is being gathered",
                               options_.label, who, seq, seq_)),
               options_.label);
      return;
    }
    next_.push_back(channel);
    return;
  }
  waiting_.push_back(channel);
  if (local_size == 0 || waiting_.size() < local_size) return;
  Job job;
  job.seq = seq_;
  job.channels = std::move(waiting_);
  waiting_ = std::move(next_);
  next_.clear();
  ++seq_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void NodeBarrier::FailWaiting(const Status& error, const ipc::Channel* skip) {
  for (auto* waiting : {&waiting_, &next_}) {
    for (const auto& ch : *waiting) {
      if (ch.get() != skip) {
        SendDone(*ch, waiting == &waiting_ ? seq_ : seq_ + 1, error, options_.label);
      }
    }
    waiting->clear();
  }
}

void NodeBarrier::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NodeBarrier::SendDone(ipc::Channel& channel, uint64_t seq, const Status& status,
                           const std::string& label) {
  v1::LocalMessage m;
  v1::LocalBarrierDone* d = m.mutable_barrier_done();
  d->set_seq(seq);
  d->set_status_code(static_cast<uint32_t>(status.code()));
  d->set_message(status.message());
  const Status sent = ipc::SendLocalMessage(channel, m);
  if (!sent.ok()) BP_LOG_DEBUG("{}: {}", label, sent.ToString());
}

void NodeBarrier::Loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const Status node_error = options_.node_error();
    // The cluster's worker barrier: one per node (bounded by the scheduler client's barrier
    // timeout; closing the engine ends it).
    Status s = node_error.ok() ? options_.cluster_barrier() : node_error;
    if (!s.ok() && s.code() == StatusCode::kCancelled) {
      const Status failed = options_.node_error();
      if (!failed.ok()) s = failed;
    }
    for (const auto& ch : job.channels) SendDone(*ch, job.seq, s, options_.label);
  }
}

}  // namespace bitpush::worker
