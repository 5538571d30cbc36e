// `bitpush._C.load_cluster_config(path)`: the cluster YAML read by the C++ parser
// (scheduler/cluster_config.h), for `bitpush check-config` and `bitpush launch`
// (python/bitpush/launch.py, docs/launch.md). One parser: the launcher never re-implements
// the YAML rules, so a file it accepts is a file every daemon accepts.
//
// Thread-safety: the function holds no state; it releases nothing (parsing is quick).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "python/src/status_error.h"
#include "scheduler/cluster_config.h"
#include "worker/daemon_client.h"

namespace bitpush::python {

namespace py = pybind11;

void BindConfig(py::module_& m) {
  m.def(
      "load_cluster_config",
      [](const std::string& path) {
        scheduler::ClusterConfig c = ValueOrThrow(scheduler::LoadClusterConfig(path));
        py::dict d;
        d["scheduler"] = c.scheduler_address;
        d["transport"] = c.transport;
        d["servers"] = c.servers;
        d["workers"] = c.workers;
        d["worker_local_size"] = c.worker.local_size;
        d["worker_socket"] = c.worker.socket;
        std::vector<uint32_t> processes;
        std::vector<std::vector<uint32_t>> gpus;
        std::vector<std::string> sockets;
        for (uint32_t r = 0; r < c.workers.size(); ++r) {
          processes.push_back(c.ProcessesOnNode(r));
          gpus.push_back(c.GpusOnNode(r));
          sockets.push_back(worker::DaemonSocketPath("", c, r));
        }
        d["worker_processes"] = processes;
        d["worker_gpus"] = gpus;
        d["worker_sockets"] = sockets;
        d["processes_differ"] = c.ProcessCountsDiffer();
        d["description"] = scheduler::DescribeClusterConfig(c);
        return d;
      },
      py::arg("path"),
      "Parses a cluster YAML with the C++ parser (docs/config.md). Returns a dict: scheduler, "
      "servers, workers (normalised URLs), transport, worker_local_size (0 = unset), "
      "worker_socket ('' = default), per worker node worker_processes (0 = unset), "
      "worker_gpus (device indices, [] = CPU) and worker_sockets (the daemon's socket path), "
      "processes_differ (nodes run different numbers of processes) and description (the "
      "effective config as text). A bad file raises BitpushError whose message names the "
      "file, line and key.");
}

}  // namespace bitpush::python
