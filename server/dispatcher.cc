#include "server/dispatcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "common/logging.h"
#include "compressors/spec_registry.h"
#include "config/cluster_config.h"

namespace bitpush::server {

using transport::Message;
using v1::DataHeader;

Dispatcher::Dispatcher(uint32_t rank, const scheduler::SchedulerClient* client,
                       const std::vector<std::unique_ptr<EngineThread>>& engines,
                       WorkerPeers* workers, ServerCounters* counters, trace::Recorder* trace)
    : rank_(rank),
      client_(client),
      engines_(engines),
      workers_(workers),
      counters_(counters),
      trace_(trace),
      declarations_(rank, workers) {}

void Dispatcher::OnServerLost(uint64_t generation, const Status& why) {
  if (generation > generation_) ResetGeneration(generation, why.message());
}

void Dispatcher::OnServerRejoined(uint32_t server, uint64_t generation) {
  if (generation > generation_) {
    ResetGeneration(generation, fmt::format("server {} rejoined", server));
  }
}

void Dispatcher::Register(node::NodeEndpoint* endpoint) {
  using node::Plane;
  using node::Sender;
  endpoint->OnData(DataHeader::OP_DECLARE, [this](const Sender& from, DataHeader& h, Message& m) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) {
      declarations_.Declare(*w, h, m);
    }
  });
  endpoint->OnData(DataHeader::OP_INIT_KEY, [this](const Sender& from, DataHeader& h, Message& m) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) PlaceInit(*w, h, m);
  });
  endpoint->OnData(DataHeader::OP_PUSH, [this](const Sender& from, DataHeader& h, Message& m) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) QueuePush(*w, h, m);
  });
  for (DataHeader::Op op : {DataHeader::OP_STATE_READ, DataHeader::OP_STATE_WRITE}) {
    endpoint->OnData(op, [this](const Sender& from, DataHeader& h, Message& m) {
      if (std::optional<uint32_t> w = CheckedWorker(from, h)) QueuePush(*w, h, m);
    });
  }
  endpoint->OnUnhandledData([this](const Sender& from, DataHeader& h, Message&) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) {
      Refuse(*w, fmt::format("a message with data op {}, which no handler serves",
                             DataHeader::Op_Name(h.op())));
    }
  });
  endpoint->OnRejected(Plane::kData, [this](const Sender& from, const Message& m,
                                            node::NodeEndpoint::Rejection why, std::string_view) {
    const std::optional<uint32_t> worker = WorkerOf(from);
    if (!worker || why != node::NodeEndpoint::Rejection::kMalformed) return;
    Refuse(*worker, fmt::format("a malformed data header ({} bytes)", m.header.size()));
  });
  endpoint->OnEvent(Plane::kData, [this](const Sender& from, const transport::TransportEvent& ev) {
    // A lost connection is not a verdict (workers close theirs at a clean shutdown): the
    // scheduler's heartbeats decide, and tell this server when a worker died. A failed send
    // is: the worker misses that reply.
    if (ev.kind == transport::TransportEvent::Kind::kSendFailed) {
      BP_LOG_WARN("server {}: {}: {}", rank_, from.peer, ev.status.ToString());
    } else {
      BP_LOG_DEBUG("server {}: transport event about {}: {}", rank_, from.peer,
                   ev.status.ok() ? std::string("connected") : ev.status.ToString());
    }
  });
}

std::optional<uint32_t> Dispatcher::WorkerOf(const node::Sender& sender) {
  if (!sender.node || !sender.Is(v1::ROLE_WORKER) || sender.node->rank >= workers_->count()) {
    ++counters_->pushes_rejected;
    if (std::string more; workers_->MayLog("peer:" + sender.peer, &more)) {
      BP_LOG_WARN(
          "server {}: dropped a data message from '{}', which is not a worker of the "
          "cluster{}",
          rank_, sender.peer, more);
    }
    return std::nullopt;
  }
  return sender.node->rank;
}

std::optional<uint32_t> Dispatcher::CheckedWorker(const node::Sender& sender,
                                                  const DataHeader& header) {
  const std::optional<uint32_t> worker = WorkerOf(sender);
  if (!worker) return std::nullopt;
  if (header.sender() != *worker) {
    Refuse(*worker, fmt::format("a message ({}) whose header names worker {}",
                                DataHeader::Op_Name(header.op()), header.sender()));
    return std::nullopt;
  }
  if (header.generation() < generation_) {  // sent before a server failed: its job rolled back
    BP_LOG_DEBUG("server {}: dropped a {} of generation {} from worker {} (now {})", rank_,
                 DataHeader::Op_Name(header.op()), header.generation(), *worker, generation_);
    return std::nullopt;
  }
  if (header.generation() > generation_) {  // the worker heard of the failure first
    ResetGeneration(header.generation(), fmt::format("worker {} is in it", *worker));
  }
  return worker;
}

void Dispatcher::Refuse(uint32_t worker, const std::string& what) {
  ++counters_->pushes_rejected;
  if (std::string more; workers_->MayLog(fmt::format("refused:worker:{}", worker), &more)) {
    BP_LOG_WARN("server {}: refused {} from worker {}; not answered{}", rank_, what, worker, more);
  }
}

void Dispatcher::ResetGeneration(uint64_t generation, const std::string& why) {
  BP_LOG_WARN("server {}: data-plane generation {} -> {} ({}): dropping {} keys", rank_,
              generation_, generation, why, placement_.size());
  generation_ = generation;
  placement_.clear();
  declarations_.Clear();
  counters_->keys = 0;
  for (const std::unique_ptr<EngineThread>& e : engines_) e->DropKeys();
}

void Dispatcher::PlaceInit(uint32_t worker, DataHeader& header, Message& msg) {
  auto it = placement_.find(header.key());
  if (it == placement_.end()) {
    const uint32_t owner = client_->ServerForKey(header.key());
    if (owner != rank_) {
      workers_->SendError(
          worker, header.op(), header.key(), 0,
          InvalidArgumentError(
              fmt::format("key {} belongs to server {} under the cluster's key mapping, but worker "
                          "{} declared it to server {}",
                          header.key(), owner, worker, rank_)));
      return;
    }
    // Least weighted load wins; compressed keys weigh more (paper 001 §4.2.4).
    uint32_t best = 0;
    for (uint32_t i = 1; i < engines_.size(); ++i) {
      if (engines_[i]->load() < engines_[best]->load()) best = i;
    }
    const bool compressed = compressors::MethodCompresses(header.compressor_config().id());
    const uint64_t weight =
        std::max<uint64_t>(1, header.element_count() * 4) * (compressed ? kCompressedKeyWeight : 1);
    engines_[best]->AddKey(weight);
    ++counters_->keys;
    it = placement_.emplace(header.key(), best).first;
  }
  engines_[it->second]->Enqueue(DataTask{std::move(header), std::move(msg), worker});
}

void Dispatcher::QueuePush(uint32_t worker, DataHeader& header, Message& msg) {
  auto it = placement_.find(header.key());
  if (it == placement_.end()) {
    workers_->SendError(
        worker, header.op(), header.key(), header.round(),
        NotFoundError(fmt::format("key {} is unknown here: no OP_INIT_KEY declared it "
                                  "({} from worker {}, round {})",
                                  header.key(), DataHeader::Op_Name(header.op()), worker,
                                  header.round())));
    return;
  }
  const int64_t received = trace_ != nullptr ? trace::NowNs() : 0;
  engines_[it->second]->Enqueue(DataTask{std::move(header), std::move(msg), worker, received});
}

}  // namespace bitpush::server
