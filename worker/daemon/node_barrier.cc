#include "worker/daemon/node_barrier.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
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

namespace {

std::string KindName(const std::optional<std::chrono::milliseconds>& wait_for_servers) {
  return wait_for_servers ? "wait_for_servers" : "barrier";
}

}  // namespace

bool NodeBarrier::Join(Kind& kind, bool empty, const std::string& who,
                       std::optional<std::chrono::milliseconds> wait_for_servers, uint64_t seq,
                       Status* error) const {
  if (empty) {
    kind.wait_for_servers = wait_for_servers;
    kind.first = who;
    return true;
  }
  if (kind.wait_for_servers.has_value() != wait_for_servers.has_value()) {
    *error = FailedPreconditionError(fmt::format(
        "{}: {} entered {} as its node collective {} while {} entered {}: every training process "
        "of the node must make the same calls in the same order",
        options_.label, who, KindName(wait_for_servers), seq, kind.first,
        KindName(kind.wait_for_servers)));
    return false;
  }
  if (wait_for_servers) kind.wait_for_servers = std::min(*kind.wait_for_servers, *wait_for_servers);
  return true;
}

void NodeBarrier::Enter(const std::shared_ptr<ipc::Channel>& channel, const std::string& who,
                        uint64_t seq, uint32_t local_size,
                        std::optional<std::chrono::milliseconds> wait_for_servers) {
  Status mixed;
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
    if (!Join(next_kind_, next_.empty(), who, wait_for_servers, seq, &mixed)) {
      SendDone(*channel, seq, mixed, options_.label);
      return;
    }
    next_.push_back(channel);
    return;
  }
  if (!Join(kind_, waiting_.empty(), who, wait_for_servers, seq, &mixed)) {
    // A mix: the whole gathering fails, naming both, and the next one starts.
    SendDone(*channel, seq, mixed, options_.label);
    for (const auto& ch : waiting_) SendDone(*ch, seq, mixed, options_.label);
    waiting_ = std::move(next_);
    next_.clear();
    kind_ = std::move(next_kind_);
    next_kind_ = Kind();
    ++seq_;
    return;
  }
  waiting_.push_back(channel);
  if (local_size == 0 || waiting_.size() < local_size) return;
  Job job;
  job.seq = seq_;
  job.channels = std::move(waiting_);
  job.wait_for_servers = kind_.wait_for_servers;
  waiting_ = std::move(next_);
  next_.clear();
  kind_ = std::move(next_kind_);
  next_kind_ = Kind();
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
    // The cluster's worker barrier, or the wait for the servers: one per node (bounded by the
    // scheduler client's barrier timeout, or the processes' wait; closing the engine ends both).
    Status s = !node_error.ok()       ? node_error
               : job.wait_for_servers ? options_.wait_for_servers(*job.wait_for_servers)
                                      : options_.cluster_barrier();
    if (!s.ok() && s.code() == StatusCode::kCancelled) {
      const Status failed = options_.node_error();
      if (!failed.ok()) s = failed;
    }
    for (const auto& ch : job.channels) SendDone(*ch, job.seq, s, options_.label);
  }
}

}  // namespace bitpush::worker
