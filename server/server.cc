#include "server/server.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/cpu_topology.h"
#include "common/log_limiter.h"
#include "common/logging.h"
#include "common/node/endpoint.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "config/node_security.h"
#include "optimizers/param_state.h"
#include "proto/bitpush/v1/control.pb.h"
#include "scheduler/scheduler_client.h"
#include "server/key_state.h"

namespace bitpush::server {

namespace {

using Clock = std::chrono::steady_clock;
using transport::Buffer;
using transport::Message;
using v1::DataHeader;

// The calling thread's CPU time (ns).
uint64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// One data message for an engine thread.
struct Task {
  DataHeader header;
  Message message;
  uint32_t worker = 0;
};

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

namespace {

// The key's server-side optimizer from its OP_INIT_KEY (DataHeader::server_optimizer).
StatusOr<ServerOptimizerSpec> OptimizerFromWire(const v1::ServerOptimizer& w) {
  ServerOptimizerSpec o;
  BP_ASSIGN_OR_RETURN(o.update,
                      optimizers::MakeUpdateOptions(w.rule(), w.weight_decay(), w.momentum(),
                                                    w.nesterov(), w.beta1(), w.beta2(), w.eps()));
  BP_ASSIGN_OR_RETURN(o.pull, compressors::CanonicalizeCompressorConfig(w.pull()));
  o.difference = w.difference();
  return o;
}

}  // namespace

class Server::Impl {
 public:
  explicit Impl(ServerOptions options) : options_(std::move(options)) {}
  ~Impl() { Close(); }

  Status Start();
  Status Wait(std::chrono::milliseconds timeout) { return client_->WaitForShutdown(timeout); }
  void Close();

  uint32_t Rank() const { return options_.rank; }
  ServerStats Stats() const;
  std::vector<EngineThreadInfo> EngineThreads() const;
  node::EndpointStats EndpointStats() const { return endpoint_->stats(); }

 private:
  struct KeyEntry {
    std::unique_ptr<KeyState> state;
    DataHeader init;  // the first OP_INIT_KEY (later ones must match it)
    // Workers whose OP_STATE_READ `weights` waits for the key's weights to be installed (at
    // most one entry per worker).
    std::vector<uint32_t> weight_readers;
    // Pushes accepted whose round is not published yet: (worker, round) to answer.
    std::vector<std::pair<uint32_t, uint64_t>> waiting;
  };

  struct Engine {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> queue;  // guarded by mu
    bool stop = false;       // guarded by mu
    CpuSlot slot;
    bool pin = false;
    std::atomic<uint64_t> keys{0};
    std::atomic<uint64_t> load{0};
    // Owned by the engine thread alone (no lock on key data).
    std::unordered_map<uint64_t, KeyEntry> key_states;
  };

  // A declaration epoch being collected (server 0, I/O thread).
  struct DeclareEpoch {
    std::vector<std::optional<v1::TensorManifest>> manifests;
    uint32_t received = 0;
  };

  // The endpoint's handlers (its I/O thread, or Start's thread while it releases what arrived
  // before the assignment).
  void RegisterHandlers();
  // The rank of `sender` if it is a worker of the cluster; otherwise counts and logs the drop.
  std::optional<uint32_t> WorkerOf(const node::Sender& sender);
  // WorkerOf, plus the header's sender field must name the same worker (answered otherwise).
  std::optional<uint32_t> CheckedWorker(const node::Sender& sender, const DataHeader& header);
  void PlaceInit(uint32_t worker, DataHeader& header, Message& message);
  void QueuePush(uint32_t worker, DataHeader& header, Message& message);
  void HandleDeclare(uint32_t worker, const DataHeader& header, const Message& message);

  // Engine threads.
  void EngineLoop(Engine& engine);
  void HandleInit(Engine& engine, const Task& task);
  void HandlePush(Engine& engine, Task& task);
  // OP_STATE_READ / OP_STATE_WRITE: the key's server residual out of / into a checkpoint.
  void HandleState(Engine& engine, const Task& task);
  // OP_STATE_READ / OP_STATE_WRITE with `weights`: a server-side optimizer key's starting
  // weights in, the workers' copy out (a read before the install waits in weight_readers).
  void HandleWeights(KeyEntry& entry, const Task& task, DataHeader reply);
  void AnswerWeightReaders(KeyEntry& entry);
  void SendWorkersWeights(KeyEntry& entry, uint32_t worker);
  void ServeWaiting(KeyEntry& entry);

  // Any thread.
  void SendError(uint32_t worker, DataHeader::Op refused, uint64_t key, uint64_t round,
                 const Status& status);
  void SendToWorker(uint32_t worker, DataHeader header, std::vector<Buffer> frames);

  const ServerOptions options_;
  std::unique_ptr<node::NodeEndpoint> endpoint_;
  std::unique_ptr<scheduler::SchedulerClient> client_;
  std::vector<std::unique_ptr<Engine>> engines_;
  uint32_t num_workers_ = 0;  // set before the data plane is released

  // Dispatch state: touched by the endpoint's handlers only (one at a time).
  std::unordered_map<uint64_t, uint32_t> placement_;
  std::map<uint64_t, DeclareEpoch> declare_epochs_;
  // The data plane's generation (cluster.server_rejoin_timeout_s): a server that died and
  // rejoined starts the next one; every key and declaration of an older one is dropped.
  uint64_t generation_ = 0;
  // Drops the job's data-plane state (every key, on its engine thread; the placements and
  // declaration epochs here) and moves to `generation`.
  void ResetGeneration(uint64_t generation, const std::string& why);

  std::atomic<uint64_t> pushes_accepted_{0};
  std::atomic<uint64_t> pushes_rejected_{0};
  // Refusals are logged at most once per interval per peer (LogLimiter): a peer that sends
  // garbage in a loop cannot grow the log. Engine threads and the loop share it.
  std::mutex log_mu_;
  LogLimiter log_limiter_;
  // True when a line about `key` may be logged; *suffix then says how many were suppressed.
  bool MayLog(const std::string& key, std::string* suffix) {
    uint64_t suppressed = 0;
    bool ok;
    {
      std::lock_guard<std::mutex> lock(log_mu_);
      ok = log_limiter_.Allow(key, &suppressed);
    }
    *suffix = suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "";
    return ok;
  }
  std::atomic<uint64_t> replies_sent_{0};
  std::atomic<uint64_t> rounds_published_{0};
  std::atomic<uint64_t> quantized_values_{0};
  std::atomic<uint64_t> quantized_saturated_{0};
  std::atomic<uint64_t> error_values_{0};
  std::atomic<uint64_t> error_saturated_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> raw_bytes_received_{0};
  std::atomic<uint64_t> raw_bytes_sent_{0};
  std::atomic<uint64_t> engine_busy_ns_{0};
  std::atomic<uint64_t> engine_cpu_ns_{0};
  std::atomic<uint64_t> keys_{0};
  std::atomic<bool> closed_{false};
};

Status Server::Impl::Start() {
  const config::ClusterConfig& cluster = options_.cluster;
  if (options_.rank >= cluster.servers.size()) {
    return InvalidArgumentError(fmt::format("server rank {} is not in the config ({} servers)",
                                            options_.rank, cluster.servers.size()));
  }
  const config::ServerSettings& settings = cluster.server;
  size_t threads = settings.engine_threads;
  if (threads == 0) threads = std::clamp<size_t>(AllowedCpuCount() - 1, 1, 8);

  std::vector<CpuSlot> plan;
  if (settings.numa != config::NumaMode::kOff) {
    StatusOr<std::vector<CpuSlot>> cores = ProcessCores();
    if (cores.ok()) {
      plan = PlanEngineThreads(*cores, threads, options_.rank);
    } else if (settings.numa == config::NumaMode::kOn) {
      return cores.status().WithContext("server.numa is on");
    } else {
      BP_LOG_WARN("server {}: engine threads not pinned: {}", options_.rank,
                  cores.status().ToString());
    }
  }
  for (size_t i = 0; i < threads; ++i) {
    auto e = std::make_unique<Engine>();
    if (!plan.empty()) {
      e->slot = plan[i];
      e->pin = true;
    }
    engines_.push_back(std::move(e));
  }
  for (auto& e : engines_) {
    Engine* engine = e.get();
    engine->thread = std::thread([this, engine] { EngineLoop(*engine); });
  }

  node::NodeEndpointOptions eo;
  eo.self = node::NodeIdentity{v1::ROLE_SERVER, options_.rank};
  eo.listen_address = cluster.servers[options_.rank];
  eo.backend = cluster.transport;
  eo.inproc_hub = options_.inproc_hub;
  BP_RETURN_IF_ERROR(config::ConfigureNodeEndpoint(cluster, &eo));
  StatusOr<std::unique_ptr<node::NodeEndpoint>> endpoint = node::NodeEndpoint::Create(eo);
  if (!endpoint.ok()) {
    return endpoint.status().WithContext(
        fmt::format("server {}: cannot listen at {}", options_.rank, eo.listen_address));
  }
  endpoint_ = std::move(endpoint).value();

  scheduler::SchedulerClientOptions co;
  co.cluster = cluster;
  co.role = v1::ROLE_SERVER;
  co.rank = options_.rank;
  co.capabilities = {"data:v1"};
  co.on_error = [rank = options_.rank](const Status& s) {
    BP_LOG_ERROR("server {}: {}", rank, s.ToString());
  };
  // Another server died and may rejoin: the job rolls back to its checkpoint, so this server
  // drops its keys (the endpoint's thread, like the data handlers).
  co.on_server_lost = [this](uint32_t, uint64_t generation, const Status& why) {
    if (generation > generation_) ResetGeneration(generation, why.message());
  };
  co.on_server_rejoined = [this](uint32_t server, uint64_t generation) {
    if (generation > generation_) {
      ResetGeneration(generation, fmt::format("server {} rejoined", server));
    }
  };
  BP_ASSIGN_OR_RETURN(client_, scheduler::SchedulerClient::Create(std::move(co), endpoint_.get()));
  RegisterHandlers();
  // A worker can be faster than the scheduler's message to us: its data waits, in order,
  // until this server knows the cluster and has connected to the workers.
  endpoint_->HoldPlane(node::Plane::kData);
  endpoint_->Start();
  BP_RETURN_IF_ERROR(client_->Register());

  const v1::Assignment& a = client_->assignment();
  num_workers_ = static_cast<uint32_t>(a.workers_size());
  for (int i = 0; i < a.workers_size(); ++i) {
    const std::string peer = node::NodePeerId(v1::ROLE_WORKER, static_cast<uint32_t>(i));
    // The worker's data plane: its data address when it has one (transport ucx).
    const v1::NodeInfo& w = a.workers(i);
    const std::string& address = w.data_address().empty() ? w.address() : w.data_address();
    BP_RETURN_IF_ERROR(endpoint_->Connect(peer, address)
                           .WithContext(fmt::format("server {}: connecting to worker {} at {}",
                                                    options_.rank, i, address)));
  }
  endpoint_->ReleasePlane(node::Plane::kData);
  BP_LOG_INFO("server {}: serving {} workers with {} engine threads{}", options_.rank, num_workers_,
              engines_.size(),
              plan.empty() ? " (not pinned)" : fmt::format(" pinned to CPUs {}", [&] {
                std::string s;
                for (const CpuSlot& c : plan) {
                  s += (s.empty() ? "" : ",") + std::to_string(c.cpu);
                }
                return s;
              }()));
  return Status::Ok();
}

void Server::Impl::Close() {
  if (closed_.exchange(true)) return;
  if (endpoint_) endpoint_->Close();  // joins the I/O thread: nothing new is queued after this
  if (client_) client_->Close();
  for (auto& e : engines_) {
    {
      std::lock_guard<std::mutex> lock(e->mu);
      e->stop = true;
    }
    e->cv.notify_all();
  }
  for (auto& e : engines_) {
    if (e->thread.joinable()) e->thread.join();
  }
}

ServerStats Server::Impl::Stats() const {
  ServerStats s;
  s.keys = keys_.load();
  s.pushes_accepted = pushes_accepted_.load();
  s.pushes_rejected = pushes_rejected_.load();
  s.replies_sent = replies_sent_.load();
  s.rounds_published = rounds_published_.load();
  s.quantized_values = quantized_values_.load();
  s.quantized_saturated = quantized_saturated_.load();
  s.error_values = error_values_.load();
  s.error_saturated = error_saturated_.load();
  s.bytes_received = bytes_received_.load();
  s.bytes_sent = bytes_sent_.load();
  s.raw_bytes_received = raw_bytes_received_.load();
  s.raw_bytes_sent = raw_bytes_sent_.load();
  s.engine_busy_ns = engine_busy_ns_.load();
  s.engine_cpu_ns = engine_cpu_ns_.load();
  return s;
}

std::vector<EngineThreadInfo> Server::Impl::EngineThreads() const {
  std::vector<EngineThreadInfo> out;
  for (const auto& e : engines_) {
    EngineThreadInfo info;
    if (e->pin) {
      info.cpu = e->slot.cpu;
      info.numa_node = e->slot.numa_node;
    }
    info.keys = e->keys.load();
    info.load = e->load.load();
    {
      std::lock_guard<std::mutex> lock(e->mu);
      info.queued = e->queue.size();
    }
    out.push_back(info);
  }
  return out;
}

// ---- I/O thread ----

void Server::Impl::RegisterHandlers() {
  using node::Plane;
  using node::Sender;
  endpoint_->OnData(DataHeader::OP_DECLARE, [this](const Sender& from, DataHeader& h, Message& m) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) {
      HandleDeclare(*w, h, m);
    }
  });
  endpoint_->OnData(DataHeader::OP_INIT_KEY, [this](const Sender& from, DataHeader& h, Message& m) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) PlaceInit(*w, h, m);
  });
  endpoint_->OnData(DataHeader::OP_PUSH, [this](const Sender& from, DataHeader& h, Message& m) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) QueuePush(*w, h, m);
  });
  for (DataHeader::Op op : {DataHeader::OP_STATE_READ, DataHeader::OP_STATE_WRITE}) {
    endpoint_->OnData(op, [this](const Sender& from, DataHeader& h, Message& m) {
      if (std::optional<uint32_t> w = CheckedWorker(from, h)) QueuePush(*w, h, m);
    });
  }
  endpoint_->OnUnhandledData([this](const Sender& from, DataHeader& h, Message&) {
    if (std::optional<uint32_t> w = CheckedWorker(from, h)) {
      SendError(*w, h.op(), h.key(), h.round(),
                InvalidArgumentError(fmt::format("unexpected data op {} from worker {}",
                                                 DataHeader::Op_Name(h.op()), *w)));
    }
  });
  endpoint_->OnRejected(Plane::kData, [this](const Sender& from, const Message& m,
                                             node::NodeEndpoint::Rejection why, std::string_view) {
    const std::optional<uint32_t> worker = WorkerOf(from);
    if (!worker || why != node::NodeEndpoint::Rejection::kMalformed) return;
    SendError(
        *worker, DataHeader::OP_UNSPECIFIED, 0, 0,
        DataLossError(fmt::format("server {}: malformed data header from worker {} ({} bytes)",
                                  options_.rank, *worker, m.header.size())));
  });
  endpoint_->OnEvent(Plane::kData, [this](const Sender& from, const transport::TransportEvent& ev) {
    // A lost connection is not a verdict (workers close theirs at a clean shutdown): the
    // scheduler's heartbeats decide, and tell this server when a worker died. A failed send
    // is: the worker misses that reply.
    if (ev.kind == transport::TransportEvent::Kind::kSendFailed) {
      BP_LOG_WARN("server {}: {}: {}", options_.rank, from.peer, ev.status.ToString());
    } else {
      BP_LOG_DEBUG("server {}: transport event about {}: {}", options_.rank, from.peer,
                   ev.status.ok() ? std::string("connected") : ev.status.ToString());
    }
  });
}

std::optional<uint32_t> Server::Impl::WorkerOf(const node::Sender& sender) {
  if (!sender.node || !sender.Is(v1::ROLE_WORKER) || sender.node->rank >= num_workers_) {
    ++pushes_rejected_;
    if (std::string more; MayLog("peer:" + sender.peer, &more)) {
      BP_LOG_WARN(
          "server {}: dropped a data message from '{}', which is not a worker of the "
          "cluster{}",
          options_.rank, sender.peer, more);
    }
    return std::nullopt;
  }
  return sender.node->rank;
}

std::optional<uint32_t> Server::Impl::CheckedWorker(const node::Sender& sender,
                                                    const DataHeader& header) {
  const std::optional<uint32_t> worker = WorkerOf(sender);
  if (!worker) return std::nullopt;
  if (header.sender() != *worker) {
    SendError(*worker, header.op(), header.key(), header.round(),
              InvalidArgumentError(fmt::format("message from worker {} claims to be from worker {}",
                                               *worker, header.sender())));
    return std::nullopt;
  }
  if (header.generation() < generation_) {  // sent before a server failed: its job rolled back
    BP_LOG_DEBUG("server {}: dropped a {} of generation {} from worker {} (now {})", options_.rank,
                 DataHeader::Op_Name(header.op()), header.generation(), *worker, generation_);
    return std::nullopt;
  }
  if (header.generation() > generation_) {  // the worker heard of the failure first
    ResetGeneration(header.generation(), fmt::format("worker {} is in it", *worker));
  }
  return worker;
}

void Server::Impl::ResetGeneration(uint64_t generation, const std::string& why) {
  BP_LOG_WARN("server {}: data-plane generation {} -> {} ({}): dropping {} keys", options_.rank,
              generation_, generation, why, placement_.size());
  generation_ = generation;
  placement_.clear();
  declare_epochs_.clear();
  keys_ = 0;
  for (const std::unique_ptr<Engine>& e : engines_) {
    e->load = 0;
    e->keys = 0;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      Task reset;  // op OP_UNSPECIFIED: drop every key of this engine
      e->queue.push_back(std::move(reset));
    }
    e->cv.notify_one();
  }
}

void Server::Impl::PlaceInit(uint32_t worker, DataHeader& header, Message& msg) {
  auto it = placement_.find(header.key());
  if (it == placement_.end()) {
    const uint32_t owner = client_->ServerForKey(header.key());
    if (owner != options_.rank) {
      SendError(worker, header.op(), header.key(), 0,
                InvalidArgumentError(fmt::format(
                    "key {} belongs to server {} under the cluster's key mapping, but worker "
                    "{} declared it to server {}",
                    header.key(), owner, worker, options_.rank)));
      return;
    }
    // Least weighted load wins; compressed keys weigh more (paper 001 §4.2.4).
    uint32_t best = 0;
    for (uint32_t i = 1; i < engines_.size(); ++i) {
      if (engines_[i]->load.load() < engines_[best]->load.load()) best = i;
    }
    const bool compressed = compressors::MethodCompresses(header.compressor_config().id());
    const uint64_t weight =
        std::max<uint64_t>(1, header.element_count() * 4) * (compressed ? kCompressedKeyWeight : 1);
    engines_[best]->load += weight;
    ++engines_[best]->keys;
    ++keys_;
    it = placement_.emplace(header.key(), best).first;
  }
  Engine& e = *engines_[it->second];
  {
    std::lock_guard<std::mutex> lock(e.mu);
    e.queue.push_back(Task{std::move(header), std::move(msg), worker});
  }
  e.cv.notify_one();
}

void Server::Impl::QueuePush(uint32_t worker, DataHeader& header, Message& msg) {
  auto it = placement_.find(header.key());
  if (it == placement_.end()) {
    SendError(worker, header.op(), header.key(), header.round(),
              NotFoundError(fmt::format("key {} is unknown here: no OP_INIT_KEY declared it "
                                        "({} from worker {}, round {})",
                                        header.key(), DataHeader::Op_Name(header.op()), worker,
                                        header.round())));
    return;
  }
  Engine& e = *engines_[it->second];
  {
    std::lock_guard<std::mutex> lock(e.mu);
    e.queue.push_back(Task{std::move(header), std::move(msg), worker});
  }
  e.cv.notify_one();
}

void Server::Impl::HandleDeclare(uint32_t worker, const DataHeader& header,
                                 const Message& message) {
  if (options_.rank != 0) {
    SendError(worker, DataHeader::OP_DECLARE, 0, header.round(),
              FailedPreconditionError(fmt::format(
                  "tensor declarations go to server 0, but worker {} sent them to server {}",
                  worker, options_.rank)));
    return;
  }
  v1::TensorManifest manifest;
  if (message.frames.size() != 1 ||
      !manifest.ParseFromArray(message.frames[0].data(),
                               static_cast<int>(message.frames[0].size()))) {
    SendError(worker, DataHeader::OP_DECLARE, 0, header.round(),
              DataLossError(fmt::format("malformed tensor manifest from worker {} (epoch {})",
                                        worker, header.round())));
    return;
  }
  DeclareEpoch& epoch = declare_epochs_[header.round()];
  if (epoch.manifests.empty()) epoch.manifests.resize(num_workers_);
  if (epoch.manifests[worker]) {
    SendError(worker, DataHeader::OP_DECLARE, 0, header.round(),
              InvalidArgumentError(
                  fmt::format("worker {} declared epoch {} twice", worker, header.round())));
    return;
  }
  epoch.manifests[worker] = std::move(manifest);
  if (++epoch.received < num_workers_) return;

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
    for (uint32_t w = 1; w < num_workers_ && difference.empty(); ++w) {
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
  declare_epochs_.erase(epoch_id);
  for (uint32_t w = 0; w < num_workers_; ++w) {
    if (!difference.empty()) {
      SendError(w, DataHeader::OP_DECLARE, 0, epoch_id, InvalidArgumentError(difference));
      continue;
    }
    DataHeader reply;
    reply.set_op(DataHeader::OP_DECLARE_REPLY);
    reply.set_round(epoch_id);
    SendToWorker(w, std::move(reply), {});
  }
  if (!difference.empty()) BP_LOG_ERROR("server 0: {}", difference);
}

// ---- engine threads ----

void Server::Impl::EngineLoop(Engine& engine) {
  if (engine.pin) {
    const Status pinned = PinCurrentThread(engine.slot.cpu);
    if (!pinned.ok()) {
      BP_LOG_WARN("server {}: {}", options_.rank, pinned.ToString());
      engine.pin = false;
    }
  }
  std::unique_lock<std::mutex> lock(engine.mu);
  for (;;) {
    engine.cv.wait(lock, [&] { return engine.stop || !engine.queue.empty(); });
    if (engine.stop) return;
    Task task = std::move(engine.queue.front());
    engine.queue.pop_front();
    lock.unlock();
    const Clock::time_point start = Clock::now();
    const uint64_t cpu_start = ThreadCpuNs();
    if (task.header.op() == DataHeader::OP_UNSPECIFIED) {  // ResetGeneration
      engine.key_states.clear();
    } else if (task.header.op() == DataHeader::OP_INIT_KEY) {
      HandleInit(engine, task);
    } else if (task.header.op() == DataHeader::OP_STATE_READ ||
               task.header.op() == DataHeader::OP_STATE_WRITE) {
      HandleState(engine, task);
    } else {
      HandlePush(engine, task);
    }
    engine_busy_ns_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    engine_cpu_ns_ += ThreadCpuNs() - cpu_start;
    lock.lock();
  }
}

void Server::Impl::HandleInit(Engine& engine, const Task& task) {
  const DataHeader& h = task.header;
  auto it = engine.key_states.find(h.key());
  if (it != engine.key_states.end()) {
    const DataHeader& first = it->second.init;
    if (first.element_count() != h.element_count() || first.dtype() != h.dtype() ||
        first.compressor_config().SerializeAsString() !=
            h.compressor_config().SerializeAsString() ||
        first.server_residual() != h.server_residual() || first.sum() != h.sum() ||
        first.server_optimizer().SerializeAsString() != h.server_optimizer().SerializeAsString()) {
      SendError(task.worker, DataHeader::OP_INIT_KEY, h.key(), 0,
                InvalidArgumentError(fmt::format(
                    "key {} (tensor '{}'): worker {} declared {} elements of dtype {} with {} "
                    "but another worker declared {} elements of dtype {} with {}",
                    h.key(), h.tensor(), task.worker, h.element_count(), h.dtype(),
                    compressors::CompressorSpecString(h.compressor_config()), first.element_count(),
                    first.dtype(), compressors::CompressorSpecString(first.compressor_config()))));
    }
    return;
  }
  if (h.dtype() >= static_cast<uint32_t>(kNumDTypes)) {
    SendError(task.worker, DataHeader::OP_INIT_KEY, h.key(), 0,
              InvalidArgumentError(fmt::format("key {}: unknown dtype {}", h.key(), h.dtype())));
    return;
  }
  KeySpec spec;
  spec.key = h.key();
  spec.elements = h.element_count();
  spec.dtype = static_cast<DType>(h.dtype());
  spec.compressor = h.compressor_config();
  spec.server_residual = h.server_residual();
  spec.num_workers = num_workers_;
  spec.average = !h.sum();
  const std::string where = fmt::format("key {} (tensor '{}')", h.key(), h.tensor());
  if (h.has_server_optimizer()) {
    StatusOr<ServerOptimizerSpec> optimizer = OptimizerFromWire(h.server_optimizer());
    if (!optimizer.ok()) {
      SendError(task.worker, DataHeader::OP_INIT_KEY, h.key(), 0,
                optimizer.status().WithContext(where + ": server-side optimizer"));
      return;
    }
    spec.optimizer = std::move(optimizer).value();
  }
  // Created on this (pinned) thread: first touch puts the key's buffers on its NUMA node. A key
  // with a server-side optimizer has no weights yet: OP_STATE_WRITE `weights` installs them.
  StatusOr<std::unique_ptr<KeyState>> state = KeyState::Create(spec);
  if (!state.ok()) {
    SendError(task.worker, DataHeader::OP_INIT_KEY, h.key(), 0, state.status().WithContext(where));
    return;
  }
  KeyEntry entry;
  entry.state = std::move(state).value();
  entry.init = h;
  engine.key_states.emplace(h.key(), std::move(entry));
}

void Server::Impl::HandlePush(Engine& engine, Task& task) {
  const DataHeader& h = task.header;
  auto it = engine.key_states.find(h.key());
  if (it == engine.key_states.end()) {
    SendError(task.worker, DataHeader::OP_PUSH, h.key(), h.round(),
              NotFoundError(fmt::format("key {} is unknown here: its OP_INIT_KEY was refused "
                                        "(push from worker {}, round {})",
                                        h.key(), task.worker, h.round())));
    return;
  }
  KeyEntry& entry = it->second;
  std::vector<Buffer>& frames = task.message.frames;
  if (frames.size() != 1 || frames[0].size() != h.byte_count()) {
    SendError(task.worker, DataHeader::OP_PUSH, h.key(), h.round(),
              DataLossError(fmt::format(
                  "key {}: push from worker {} in round {} has {} frame(s) of {} bytes, but its "
                  "header announces one frame of {} bytes",
                  h.key(), task.worker, h.round(), frames.size(),
                  frames.empty() ? 0 : frames[0].size(), h.byte_count())));
    return;
  }
  const v1::CompressorId key_compressor = entry.state->spec().compressor.id();
  if (h.compressor() != key_compressor || h.element_count() != entry.state->spec().elements) {
    SendError(task.worker, DataHeader::OP_PUSH, h.key(), h.round(),
              InvalidArgumentError(fmt::format(
                  "key {}: worker {} pushed {} elements compressed with {} but the key holds {} "
                  "elements compressed with {}",
                  h.key(), task.worker, h.element_count(),
                  compressors::CompressorName(h.compressor()), entry.state->spec().elements,
                  compressors::CompressorSpecString(entry.state->spec().compressor))));
    return;
  }
  const uint64_t published_before = entry.state->stats().rounds_published;
  const size_t push_bytes = frames[0].size();
  // Moved, not copied: a buffer nobody else holds may become the round's accumulator.
  const Status pushed =
      h.has_lr() ? entry.state->Push(task.worker, h.round(), std::move(frames[0]), h.lr())
                 : entry.state->Push(task.worker, h.round(), std::move(frames[0]));
  if (!pushed.ok()) {
    SendError(task.worker, DataHeader::OP_PUSH, h.key(), h.round(), pushed);
    return;
  }
  ++pushes_accepted_;
  bytes_received_ += push_bytes;
  raw_bytes_received_ += h.element_count() * DTypeSize(static_cast<DType>(h.dtype()));
  entry.waiting.emplace_back(task.worker, h.round());
  for (const KeyState::LateRejection& late : entry.state->TakeLateRejections()) {
    --pushes_accepted_;
    auto w = std::find(entry.waiting.begin(), entry.waiting.end(),
                       std::make_pair(late.worker, late.round));
    if (w != entry.waiting.end()) entry.waiting.erase(w);
    SendError(late.worker, DataHeader::OP_PUSH, h.key(), late.round, late.status);
  }
  rounds_published_ += entry.state->stats().rounds_published - published_before;
  compressors::CompressorTelemetry telemetry;  // the reply's quantiser (loco two-hop)
  entry.state->TakeTelemetry(&telemetry);
  if (telemetry.values != 0) {
    quantized_values_ += telemetry.values;
    quantized_saturated_ += telemetry.saturated;
    error_values_ += telemetry.error_values;
    error_saturated_ += telemetry.error_saturated;
  }
  ServeWaiting(entry);
}

void Server::Impl::HandleState(Engine& engine, const Task& task) {
  const DataHeader& h = task.header;
  auto it = engine.key_states.find(h.key());
  if (it == engine.key_states.end()) {
    SendError(
        task.worker, h.op(), h.key(), 0,
        NotFoundError(fmt::format("key {} is unknown here: its OP_INIT_KEY was refused", h.key())));
    return;
  }
  KeyState& state = *it->second.state;
  DataHeader reply;
  reply.set_op(DataHeader::OP_STATE_REPLY);
  reply.set_key(h.key());
  reply.set_refused_op(h.op());  // which request this answers
  if (h.weights()) {
    HandleWeights(it->second, task, std::move(reply));
    return;
  }
  if (h.optimizer_state()) {
    reply.set_optimizer_state(true);
    const std::string context =
        fmt::format("server {}: key {}'s optimizer state", options_.rank, h.key());
    if (h.op() == DataHeader::OP_STATE_READ) {
      StatusOr<std::string> saved = state.SaveOptimizerState();
      if (!saved.ok()) {
        SendError(task.worker, h.op(), h.key(), 0, saved.status().WithContext(context));
        return;
      }
      reply.set_byte_count(saved->size());
      SendToWorker(task.worker, std::move(reply), {Buffer::Copy(saved->data(), saved->size())});
      return;
    }
    const std::vector<Buffer>& frames = task.message.frames;
    const Status restored =
        frames.size() != 1
            ? DataLossError(
                  fmt::format("an optimizer state to restore is one frame, got {}", frames.size()))
            : state.RestoreOptimizerState(std::string_view(
                  reinterpret_cast<const char*>(frames[0].data()), frames[0].size()));
    if (!restored.ok()) {
      SendError(task.worker, h.op(), h.key(), 0, restored.WithContext(context));
      return;
    }
    SendToWorker(task.worker, std::move(reply), {});
    AnswerWeightReaders(it->second);
    return;
  }
  if (h.op() == DataHeader::OP_STATE_READ) {
    const Span<const float> residual = state.server_residual();
    const size_t bytes = residual.size() * sizeof(float);
    reply.set_element_count(residual.size());
    reply.set_byte_count(bytes);
    SendToWorker(task.worker, std::move(reply), {Buffer::Copy(residual.data(), bytes)});
    return;
  }
  const std::vector<Buffer>& frames = task.message.frames;
  Status s;
  if (frames.size() != 1 || frames[0].size() % sizeof(float) != 0) {
    s =
        DataLossError(fmt::format("key {}: a residual to restore is one frame of float32, got {} "
                                  "frame(s) of {} bytes",
                                  h.key(), frames.size(), frames.empty() ? 0 : frames[0].size()));
  } else if (state.RoundOpen()) {
    s = FailedPreconditionError(fmt::format(
        "key {}: a round is open (pushed, not yet pulled by every worker); restore the server "
        "residual before the first push_pull",
        h.key()));
  } else if (!(frames[0].size() == 0 && state.server_residual().size() == 0)) {
    std::vector<float> values(frames[0].size() / sizeof(float));
    if (!values.empty()) std::memcpy(values.data(), frames[0].data(), frames[0].size());
    s = state.RestoreServerResidual(values);
  }
  if (!s.ok()) {
    SendError(task.worker, h.op(), h.key(), 0,
              s.WithContext(fmt::format("server {}: restoring key {}", options_.rank, h.key())));
    return;
  }
  SendToWorker(task.worker, std::move(reply), {});
}

void Server::Impl::ServeWaiting(KeyEntry& entry) {
  KeyState& state = *entry.state;
  for (size_t i = 0; i < entry.waiting.size();) {
    const auto [worker, round] = entry.waiting[i];
    if (!state.RoundPublished(round)) {
      ++i;
      continue;
    }
    StatusOr<Buffer> payload = state.Pull(worker, round);
    entry.waiting.erase(entry.waiting.begin() + static_cast<std::ptrdiff_t>(i));
    if (!payload.ok()) {
      SendError(worker, DataHeader::OP_PUSH, state.spec().key, round, payload.status());
      continue;
    }
    DataHeader reply;
    reply.set_op(DataHeader::OP_PULL_REPLY);
    reply.set_key(state.spec().key);
    reply.set_round(round);
    reply.set_compressor(state.spec().compressor.id());
    reply.set_element_count(state.spec().elements);
    reply.set_dtype(static_cast<uint32_t>(state.spec().dtype));  // the aggregate's payload dtype
    reply.set_byte_count(payload->size());
    bytes_sent_ += payload->size();
    raw_bytes_sent_ += state.spec().elements * DTypeSize(state.spec().dtype);
    ++replies_sent_;
    SendToWorker(worker, std::move(reply), {std::move(payload).value()});
  }
}

// ---- any thread ----

void Server::Impl::HandleWeights(KeyEntry& entry, const Task& task, DataHeader reply) {
  const DataHeader& h = task.header;
  KeyState& state = *entry.state;
  const std::string context =
      fmt::format("server {}: key {} (tensor '{}')", options_.rank, h.key(), entry.init.tensor());
  if (!state.spec().optimizer) {
    SendError(
        task.worker, h.op(), h.key(), 0,
        FailedPreconditionError(context + ": its optimizer does not run on the server (no weights "
                                          "here)"));
    return;
  }
  if (h.op() == DataHeader::OP_STATE_READ) {
    if (state.weights_installed()) {
      SendWorkersWeights(entry, task.worker);
    } else if (std::find(entry.weight_readers.begin(), entry.weight_readers.end(), task.worker) ==
               entry.weight_readers.end()) {
      entry.weight_readers.push_back(task.worker);  // answered at the install
    }
    return;
  }
  const std::vector<Buffer>& frames = task.message.frames;
  const size_t n = state.spec().elements;
  if (frames.size() != 1 || frames[0].size() != n * sizeof(float)) {
    SendError(
        task.worker, h.op(), h.key(), 0,
        DataLossError(fmt::format(
            "{}: starting weights are one frame of {} float32 ({} bytes); got {} frame(s) "
            "of {} bytes",
            context, n, n * sizeof(float), frames.size(), frames.empty() ? 0 : frames[0].size())));
    return;
  }
  std::vector<float> weights(n);
  if (n > 0) std::memcpy(weights.data(), frames[0].data(), frames[0].size());
  if (Status st = state.InstallWeights({weights.data(), weights.size()}); !st.ok()) {
    SendError(task.worker, h.op(), h.key(), 0, st.WithContext(context));
    return;
  }
  reply.set_weights(true);
  SendToWorker(task.worker, std::move(reply), {});
  AnswerWeightReaders(entry);
}

void Server::Impl::AnswerWeightReaders(KeyEntry& entry) {
  if (!entry.state->weights_installed()) return;
  std::vector<uint32_t> readers = std::move(entry.weight_readers);
  entry.weight_readers.clear();
  for (uint32_t worker : readers) SendWorkersWeights(entry, worker);
}

void Server::Impl::SendWorkersWeights(KeyEntry& entry, uint32_t worker) {
  const uint64_t key = entry.state->spec().key;
  StatusOr<std::vector<float>> w = entry.state->WorkersWeights();
  if (!w.ok()) {
    SendError(
        worker, DataHeader::OP_STATE_READ, key, 0,
        w.status().WithContext(fmt::format("server {}: key {}'s weights", options_.rank, key)));
    return;
  }
  DataHeader reply;
  reply.set_op(DataHeader::OP_STATE_REPLY);
  reply.set_key(key);
  reply.set_refused_op(DataHeader::OP_STATE_READ);
  reply.set_weights(true);
  reply.set_round(entry.state->next_round(worker));  // where the worker's rounds continue
  reply.set_element_count(w->size());
  reply.set_byte_count(w->size() * sizeof(float));
  SendToWorker(worker, std::move(reply), {Buffer::Copy(w->data(), w->size() * sizeof(float))});
}

void Server::Impl::SendError(uint32_t worker, DataHeader::Op refused, uint64_t key, uint64_t round,
                             const Status& status) {
  ++pushes_rejected_;
  if (std::string more; MayLog(fmt::format("worker:{}", worker), &more)) {
    BP_LOG_WARN("server {}: refused a request from worker {}: {}{}", options_.rank, worker,
                status.ToString(), more);
  }
  DataHeader h;
  h.set_op(DataHeader::OP_ERROR);
  h.set_key(key);
  h.set_round(round);
  h.set_error(status.message());
  h.set_error_code(static_cast<uint32_t>(status.code()));
  h.set_refused_op(refused);
  SendToWorker(worker, std::move(h), {});
}

void Server::Impl::SendToWorker(uint32_t worker, DataHeader header, std::vector<Buffer> frames) {
  header.set_sender(options_.rank);
  const Status sent =
      endpoint_->SendData(node::NodePeerId(v1::ROLE_WORKER, worker), header, std::move(frames));
  if (!sent.ok()) {
    BP_LOG_WARN("server {}: cannot answer worker {}: {}", options_.rank, worker, sent.ToString());
  }
}

// ---- Server ----

StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  BP_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
Status Server::Wait(std::chrono::milliseconds timeout) {
  return impl_->Wait(timeout);
}
void Server::Close() {
  impl_->Close();
}
uint32_t Server::rank() const {
  return impl_->Rank();
}
ServerStats Server::stats() const {
  return impl_->Stats();
}
std::vector<EngineThreadInfo> Server::engine_threads() const {
  return impl_->EngineThreads();
}

node::EndpointStats Server::endpoint_stats() const {
  return impl_->EndpointStats();
}

}  // namespace bitpush::server
