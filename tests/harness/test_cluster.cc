#include "tests/harness/test_cluster.h"

#include <fmt/format.h>

#include <fstream>
#include <set>
#include <utility>

#include "compressors/registry.h"
#include "tests/harness/child_process.h"

namespace bitpush::testing {
namespace {

using std::chrono::milliseconds;

// Seconds with millisecond precision, as the YAML's *_s keys take them.
std::string Seconds(milliseconds ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000);
  return fmt::format("{:.3f}", static_cast<double>(ms.count()) / 1000.0);
}

std::string List(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

// A YAML single-quoted scalar.
std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

config::ClusterConfig TestClusterConfig(const TestClusterOptions& o) {
  config::ClusterConfig c;
  c.source = o.source;
  std::set<int> used;
  // A free port (and, with a data port, port + offset), neither taken by another node.
  auto tcp = [&used, &o](bool data_port = false) {
    const int offset = data_port ? static_cast<int>(o.ucx_port_offset) : 0;
    int p = FreeTcpPort(offset);
    while (p > 0 && (used.count(p) != 0 || (offset > 0 && used.count(p + offset) != 0))) {
      p = FreeTcpPort(offset);
    }
    used.insert(p);
    if (offset > 0) used.insert(p + offset);
    return "tcp://127.0.0.1:" + std::to_string(p);
  };
  auto node = [&](v1::Role role, uint32_t rank) -> std::string {
    switch (o.transport) {
      case TestTransport::kInproc: return "inproc://" + node::NodePeerId(role, rank);
      case TestTransport::kTcp: return tcp();
      case TestTransport::kUcx: return tcp(/*data_port=*/true);
      case TestTransport::kIpc:
        return fmt::format("ipc://{}/{}{}.sock", o.ipc_dir, role == v1::ROLE_SERVER ? "s" : "w",
                           rank);
    }
    return "";
  };
  if (o.transport == TestTransport::kInproc) {
    c.transport = "inproc";
    c.scheduler_address = "inproc://scheduler";
  } else {
    c.scheduler_address = tcp();
  }
  if (o.transport == TestTransport::kUcx) {
    c.transport = "ucx";
    c.ucx.port_offset = o.ucx_port_offset;
    c.ucx.tls = o.ucx_tls;
    c.ucx.net_devices = o.ucx_net_devices;
  }
  if (!o.scheduler_address.empty()) c.scheduler_address = o.scheduler_address;
  for (uint32_t i = 0; i < o.servers; ++i) c.servers.push_back(node(v1::ROLE_SERVER, i));
  for (uint32_t i = 0; i < o.workers; ++i) c.workers.push_back(node(v1::ROLE_WORKER, i));
  c.token = o.token;
  c.heartbeat_interval = o.heartbeat_interval;
  c.heartbeat_timeout = o.heartbeat_timeout;
  c.startup_timeout = o.startup_timeout;
  c.compression = o.compression;
  // The canonical spelling, as the YAML parser leaves it (a spec that does not parse stays as
  // written, for tests of its refusal).
  auto canonical = [](std::string* spec) {
    StatusOr<v1::CompressorConfig> parsed = compressors::ParseCompressorSpec(*spec);
    if (parsed.ok()) *spec = compressors::CompressorSpecString(*parsed);
  };
  canonical(&c.compression.spec);
  for (auto& ov : c.compression.overrides) canonical(&ov.spec);
  c.server = o.server;
  c.worker = o.worker;
  return c;
}

std::string TestClusterYaml(const config::ClusterConfig& c) {
  std::string y = "cluster:\n";
  y += "  scheduler: " + c.scheduler_address + "\n";
  if (c.transport != "zmq") y += "  transport: " + c.transport + "\n";
  if (!c.token.empty()) y += "  token: " + Quoted(c.token) + "\n";
  y += "  servers: " + List(c.servers) + "\n";
  y += "  workers: " + List(c.workers) + "\n";
  y += fmt::format("  heartbeat_interval_ms: {}\n", c.heartbeat_interval.count());
  y += fmt::format("  heartbeat_timeout_ms: {}\n", c.heartbeat_timeout.count());
  y += "  startup_timeout_s: " + Seconds(c.startup_timeout) + "\n";
  if (c.transport == "ucx") {
    y += "  ucx:\n";
    y += fmt::format("    port_offset: {}\n", c.ucx.port_offset);
    if (!c.ucx.tls.empty()) y += "    tls: " + Quoted(c.ucx.tls) + "\n";
    if (!c.ucx.net_devices.empty()) y += "    net_devices: " + Quoted(c.ucx.net_devices) + "\n";
  }
  const config::CompressionSettings& k = c.compression;
  y += "compression:\n";
  y += "  spec: " + Quoted(k.spec) + "\n";
  y += "  error_feedback: " + k.error_feedback + "\n";
  y += fmt::format("  min_compress_bytes: {}\n", k.min_compress_bytes);
  if (!k.method_minimum) y += "  method_minimum: false\n";
  y += fmt::format("  partition_bytes: {}\n", k.partition_bytes);
  if (k.raw_partition_bytes != 0) {
    y += fmt::format("  raw_partition_bytes: {}\n", k.raw_partition_bytes);
  }
  if (!k.overrides.empty()) {
    y += "  overrides:\n";
    for (const auto& ov : k.overrides) {
      y += "    - {pattern: " + Quoted(ov.pattern) + ", spec: " + Quoted(ov.spec) + "}\n";
    }
  }
  y += "server:\n";
  if (c.server.engine_threads != 0) {
    y += fmt::format("  engine_threads: {}\n", c.server.engine_threads);
  }
  y += "  numa: " + std::string(config::NumaModeName(c.server.numa)) + "\n";
  const config::WorkerSettings& w = c.worker;
  y += "worker:\n";
  if (w.compress_threads != 0) y += fmt::format("  compress_threads: {}\n", w.compress_threads);
  if (w.reduce_threads != 0) y += fmt::format("  reduce_threads: {}\n", w.reduce_threads);
  y += "  numa: " + std::string(config::NumaModeName(w.numa)) + "\n";
  y += fmt::format("  credit_bytes: {}\n", w.credit_bytes);
  if (w.server_window_bytes != 0) {
    y += fmt::format("  server_window_bytes: {}\n", w.server_window_bytes);
  }
  y += "  op_timeout_s: " + Seconds(w.op_timeout) + "\n";
  if (w.local_size != 0) y += fmt::format("  local_size: {}\n", w.local_size);
  if (!w.socket.empty()) y += "  socket: " + Quoted(w.socket) + "\n";
  if (c.security.mode != config::SecurityMode::kNone) {
    y += "security:\n";
    y += "  mode: " + std::string(config::SecurityModeName(c.security.mode)) + "\n";
    if (!c.security.keys_dir.empty()) y += "  keys_dir: " + Quoted(c.security.keys_dir) + "\n";
  }
  if (c.metrics.port != 0) {
    y += "metrics:\n";
    y += fmt::format("  port: {}\n", c.metrics.port);
    y += "  bind_address: " + Quoted(c.metrics.bind_address) + "\n";
  }
  return y;
}

Status WriteTestClusterYaml(const config::ClusterConfig& config, const std::string& path) {
  std::ofstream out(path);
  out << TestClusterYaml(config);
  out.close();
  if (!out) return InternalError("cannot write the test cluster YAML " + path);
  return Status::Ok();
}

ThreadCluster::ThreadCluster(ThreadClusterOptions options)
    : options_(std::move(options)), hub_(transport::NewInprocHub()) {}

ThreadCluster::~ThreadCluster() {
  Close();
}

Status ThreadCluster::Start() {
  const config::ClusterConfig& config = options_.config;
  scheduler::SchedulerOptions so;
  so.cluster = config;
  so.inproc_hub = hub_;
  BP_ASSIGN_OR_RETURN(scheduler_, scheduler::Scheduler::Create(so));
  scheduler_thread_ = std::thread([this] { scheduler_status_ = scheduler_->Run(); });
  const uint32_t servers = static_cast<uint32_t>(config.servers.size());
  const uint32_t workers = static_cast<uint32_t>(config.workers.size());
  servers_.resize(servers);
  workers_.resize(workers);
  std::vector<Status> status(servers + workers);
  std::vector<std::thread> threads;
  threads.reserve(servers + workers);
  // Create blocks until every node registered: one thread per node.
  for (uint32_t s = 0; s < servers; ++s) {
    threads.emplace_back([this, s, &status] {
      if (!options_.start_servers) {
        if (options_.custom_node) status[s] = options_.custom_node(v1::ROLE_SERVER, s);
        return;
      }
      server::ServerOptions o;
      o.cluster = options_.config;
      o.rank = s;
      o.inproc_hub = hub_;
      StatusOr<std::unique_ptr<server::Server>> made = server::Server::Create(o);
      if (made.ok()) {
        servers_[s] = std::move(made).value();
      } else {
        status[s] = made.status();
      }
    });
  }
  for (uint32_t w = 0; w < workers; ++w) {
    threads.emplace_back([this, w, servers, &status] {
      if (!options_.start_workers) {
        if (options_.custom_node) status[servers + w] = options_.custom_node(v1::ROLE_WORKER, w);
        return;
      }
      worker::ClientOptions o;
      o.cluster = options_.config;
      o.rank = w;
      o.inproc_hub = hub_;
      o.clock = options_.worker_clock;
      StatusOr<std::unique_ptr<worker::Client>> made = worker::Client::Create(o);
      if (made.ok()) {
        workers_[w] = std::move(made).value();
      } else {
        status[servers + w] = made.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) BP_RETURN_IF_ERROR(s);
  return Status::Ok();
}

Status ThreadCluster::Shutdown(milliseconds timeout) {
  std::vector<Status> status(workers_.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (!workers_[w]) continue;
    threads.emplace_back(
        [this, w, timeout, &status] { status[w] = workers_[w]->Shutdown(timeout); });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) BP_RETURN_IF_ERROR(s);
  for (auto& s : servers_) {
    if (s) BP_RETURN_IF_ERROR(s->Wait(timeout));
  }
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
  return scheduler_status_;
}

void ThreadCluster::StopScheduler() {
  if (scheduler_) scheduler_->Stop();
}

void ThreadCluster::Close() {
  for (auto& w : workers_) {
    if (w) w->Close();
  }
  for (auto& s : servers_) {
    if (s) s->Close();
  }
  if (scheduler_thread_.joinable()) {
    scheduler_->Stop();
    scheduler_thread_.join();
  }
}

}  // namespace bitpush::testing
