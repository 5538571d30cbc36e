// The one way tests describe a cluster, and the one way they run real nodes as threads.
//
// TestClusterOptions -> TestClusterConfig(): the ClusterConfig of a test cluster, its node
// addresses chosen by the transport: inproc:// names (threads as nodes: ClusterHarness,
// ThreadCluster), free tcp ports of 127.0.0.1 or ipc:// sockets in a directory (real
// processes). TestClusterYaml() writes that config as the YAML the daemons read
// (`--config`), so a process test starts its scheduler, servers and workers from the same
// description a threads-as-nodes test uses (cluster_config_test checks the round trip).
//
// ThreadCluster: the real Scheduler, Servers and worker Clients of one ClusterConfig as
// threads of the test process over one InprocHub. Start blocks until every node registered;
// a test may start some nodes itself (start_servers / start_workers = false, or a
// custom_node hook that Start runs on the node's own thread).
//
// Owned by tests. Thread-safety: TestClusterConfig / TestClusterYaml are pure; a
// ThreadCluster is driven from the test's thread (Start, Shutdown, Close, the destructor);
// the Clients and Servers it hands out are thread-safe as documented in worker/ and server/.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/transport/transport.h"
#include "config/cluster_config.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "worker/client.h"

namespace bitpush::testing {

enum class TestTransport {
  kInproc,  // threads as nodes: inproc://scheduler, inproc://server:N, inproc://worker:N
  kTcp,     // processes: tcp://127.0.0.1:<free port> for every node
  kIpc,     // processes: ipc://<ipc_dir>/sN.sock, wN.sock for the nodes, tcp for the scheduler
  // processes, cluster.transport ucx: tcp://127.0.0.1:<free port> for every node (the control
  // plane), each server's and worker's port + ucx_port_offset free too (its ucx:// data plane)
  kUcx,
};

struct TestClusterOptions {
  uint32_t servers = 1;
  uint32_t workers = 1;
  TestTransport transport = TestTransport::kInproc;
  std::string ipc_dir;                 // kIpc: where the node sockets go
  std::string ucx_tls;                 // kUcx: cluster.ucx.tls ("" = UCX's choice)
  std::string ucx_net_devices = "lo";  // kUcx: cluster.ucx.net_devices (tests stay on loopback)
  uint32_t ucx_port_offset = 1000;     // kUcx: cluster.ucx.port_offset
  std::string scheduler_address;       // "" = chosen by the transport
  std::string source = "test cluster";
  std::string token;
  // Short control-plane timing, for fast tests (tests that time a failure detection set their own
  // timeout).
  std::chrono::milliseconds heartbeat_interval{50};
  std::chrono::milliseconds heartbeat_timeout{2000};  // a stalled sanitizer build is no failure
  std::chrono::milliseconds startup_timeout{5000};
  config::CompressionSettings compression;
  config::ServerSettings server;
  config::WorkerSettings worker;
};

// The cluster config the options describe (tcp ports are picked free now).
config::ClusterConfig TestClusterConfig(const TestClusterOptions& options);

// `config` as cluster YAML: every key of the cluster, compression, server and worker sections
// (not the host form's per-node training processes; cluster.ucx under transport ucx), the
// metrics section when its port is set, and security.mode and keys_dir when the mode is not
// none. The token is written as it is.
std::string TestClusterYaml(const config::ClusterConfig& config);

// Writes TestClusterYaml(config) to `path`.
Status WriteTestClusterYaml(const config::ClusterConfig& config, const std::string& path);

struct ThreadClusterOptions {
  config::ClusterConfig config;  // transport inproc
  bool start_servers = true;     // false: the test brings its own server endpoints
  bool start_workers = true;     // false: the test brings its own worker endpoints
  // Called on its own thread for each node Start does not start itself (a role switched off
  // above), concurrently with the others; its status is the node's start status.
  std::function<Status(v1::Role role, uint32_t rank)> custom_node;
  // The clock of the worker Clients (op deadlines, the declaration wait, their control-plane
  // timers); null = the system clock.
  std::shared_ptr<const Clock> worker_clock;
};

class ThreadCluster {
 public:
  explicit ThreadCluster(ThreadClusterOptions options);
  ~ThreadCluster();  // Close()
  ThreadCluster(const ThreadCluster&) = delete;
  ThreadCluster& operator=(const ThreadCluster&) = delete;

  // Starts the scheduler thread, then every node on its own thread (Create blocks until every
  // node registered); the first node's error, if any.
  Status Start();

  // Clean end: every worker Shutdown (Done + wait), every server and the scheduler end OK.
  Status Shutdown(std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

  // Closes every worker and server and stops the scheduler (idempotent).
  void Close();

  // Stops the scheduler (Scheduler::Stop): it shuts the cluster down with the error "scheduler
  // interrupted", as SIGTERM does to bitpush-scheduler; Close joins its thread.
  void StopScheduler();

  worker::Client& worker(uint32_t w) { return *workers_.at(w); }
  server::Server& server(uint32_t s) { return *servers_.at(s); }
  const config::ClusterConfig& config() const { return options_.config; }
  const std::shared_ptr<transport::InprocHub>& hub() const { return hub_; }

 private:
  const ThreadClusterOptions options_;
  const std::shared_ptr<transport::InprocHub> hub_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::thread scheduler_thread_;
  Status scheduler_status_;
  std::vector<std::unique_ptr<server::Server>> servers_;
  std::vector<std::unique_ptr<worker::Client>> workers_;
};

}  // namespace bitpush::testing
