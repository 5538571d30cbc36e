#include "server/server.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "common/cpu_topology.h"
#include "common/logging.h"
#include "common/node/endpoint.h"
#include "config/node_security.h"
#include "config/node_trace.h"
#include "scheduler/scheduler_client.h"
#include "server/dispatcher.h"
#include "server/engine_thread.h"
#include "server/server_counters.h"
#include "server/worker_peers.h"

namespace bitpush::server {

// The server's parts and their lifecycle: Start builds them in order (engine threads, endpoint,
// scheduler client, dispatcher) and releases the data plane once the workers are connected;
// Close takes them down in the order docs/threading.md gives.
class Server::Impl {
 public:
  explicit Impl(ServerOptions options)
      : options_(std::move(options)), workers_(options_.rank, &counters_) {}
  ~Impl() { Close(); }

  Status Start();
  Status Wait(std::chrono::milliseconds timeout) { return client_->WaitForShutdown(timeout); }
  void Close();

  uint32_t Rank() const { return options_.rank; }
  ServerStats Stats() const { return counters_.Snapshot(); }
  std::vector<EngineThreadInfo> EngineThreads() const;
  node::EndpointStats EndpointStats() const { return endpoint_->stats(); }

 private:
  const ServerOptions options_;
  ServerCounters counters_;
  WorkerPeers workers_;
  std::unique_ptr<trace::Recorder> trace_;  // null: tracing off
  std::unique_ptr<node::NodeEndpoint> endpoint_;
  std::unique_ptr<scheduler::SchedulerClient> client_;
  std::vector<std::unique_ptr<EngineThread>> engines_;
  std::unique_ptr<Dispatcher> dispatcher_;
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
  BP_ASSIGN_OR_RETURN(trace_, config::OpenNodeTrace(cluster, "server", options_.rank, "server"));
  for (size_t i = 0; i < threads; ++i) {
    engines_.push_back(std::make_unique<EngineThread>(
        options_.rank, plan.empty() ? std::nullopt : std::optional<CpuSlot>(plan[i]), &workers_,
        trace_.get(), &counters_));
  }
  for (auto& e : engines_) e->Start();

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
  workers_.Attach(endpoint_.get());

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
    dispatcher_->OnServerLost(generation, why);
  };
  co.on_server_rejoined = [this](uint32_t server, uint64_t generation) {
    dispatcher_->OnServerRejoined(server, generation);
  };
  if (trace::Recorder* tracer = trace_.get()) {
    co.on_clock_sample = [tracer](int64_t t0, int64_t t1, int64_t t2, int64_t t3) {
      tracer->Clock(t0, t1, t2, t3);
    };
  }
  BP_ASSIGN_OR_RETURN(client_, scheduler::SchedulerClient::Create(std::move(co), endpoint_.get()));
  dispatcher_ = std::make_unique<Dispatcher>(options_.rank, client_.get(), engines_, &workers_,
                                             &counters_, trace_.get());
  dispatcher_->Register(endpoint_.get());
  // A worker can be faster than the scheduler's message to us: its data waits, in order,
  // until this server knows the cluster and has connected to the workers.
  endpoint_->HoldPlane(node::Plane::kData);
  endpoint_->Start();
  BP_RETURN_IF_ERROR(client_->Register());

  BP_RETURN_IF_ERROR(workers_.Connect(client_->assignment()));
  endpoint_->ReleasePlane(node::Plane::kData);
  BP_LOG_INFO("server {}: serving {} workers with {} engine threads{}", options_.rank,
              workers_.count(), engines_.size(),
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
  for (auto& e : engines_) e->RequestStop();
  for (auto& e : engines_) e->Join();
  if (trace_) trace_->Close();  // its `end` record: every span is in
}

std::vector<EngineThreadInfo> Server::Impl::EngineThreads() const {
  std::vector<EngineThreadInfo> out;
  out.reserve(engines_.size());
  for (const auto& e : engines_) out.push_back(e->Info());
  return out;
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
