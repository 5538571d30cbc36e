// `bitpush._C.load_cluster_config(path)`: the cluster YAML read by the C++ parser
// (config/cluster_config.h), for `bitpush check-config`, `bitpush launch`
// (python/bitpush/launch.py, docs/launch.md) and bitpush.torch (the cluster's
// compression.error_feedback, the per-node process counts). `bitpush._C.knobs()`: the knob
// table (config/cluster_knobs.h). One parser: the Python package never reads the YAML
// itself, so a file it accepts is a file every daemon accepts, with the same values.
// `bitpush._C.compressor_spec(spec)`: a compressor spec checked and printed canonically by
// the same registry, so bitpush.torch refuses a mistyped spec when it is given, not at the
// first step.
//
// Thread-safety: the function holds no state; it releases nothing (parsing is quick).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "common/security/keys.h"
#include "compressors/spec_registry.h"
#include "config/cluster_config.h"
#include "config/cluster_knobs.h"
#include "config/node_security.h"
#include "python/src/status_error.h"
#include "worker/daemon_client.h"

namespace bitpush::python {

namespace py = pybind11;

void BindConfig(py::module_& m) {
  m.def(
      "load_cluster_config",
      [](const std::string& path) {
        config::ClusterConfig c = ValueOrThrow(config::LoadClusterConfig(path));
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
        std::vector<std::pair<std::string, std::string>> placements;
        for (const auto& o : c.optimizer.overrides) placements.emplace_back(o.pattern, o.placement);
        d["optimizer_overrides"] = placements;
        d["description"] = config::DescribeClusterConfig(c);
        // Every scalar knob's canonical value by its path (secrets left out).
        py::dict knobs;
        for (const config::ClusterKnob& k : config::ClusterKnobs()) {
          if (k.get == nullptr || k.spec.secret) continue;
          knobs[py::str(k.spec.path)] = config::FormatKnobValue(k.spec, k.get(c));
        }
        d["knobs"] = knobs;
        return d;
      },
      py::arg("path"),
      "Parses a cluster YAML with the C++ parser (docs/config.md). Returns a dict: scheduler, "
      "servers, workers (normalised URLs), transport, worker_local_size (0 = unset), "
      "worker_socket ('' = default), per worker node worker_processes (0 = unset), "
      "worker_gpus (device indices, [] = CPU) and worker_sockets (the daemon's socket path), "
      "processes_differ (nodes run different numbers of processes), optimizer_overrides "
      "([(pattern, placement), ...]), description (the "
      "effective config as text) and knobs ({'worker.op_timeout_s': '300', ...}: every "
      "scalar knob but the token, in canonical text; docs/config.md). A bad file raises "
      "BitpushError whose message names the file, line and key.");
  m.def(
      "write_cluster_keys",
      [](const std::string& path, std::string out_dir, bool overwrite) {
        config::ClusterConfig c = ValueOrThrow(config::LoadClusterConfig(path));
        if (out_dir.empty()) out_dir = config::KeysDir(c);
        if (out_dir.empty()) {
          throw StatusError(InvalidArgumentError(
              path + ": security.keys_dir is not set: give the directory (--out DIR)"));
        }
        return ValueOrThrow(
            security::WriteClusterKeys(out_dir, config::ClusterNodeNames(c), overwrite));
      },
      py::arg("path"), py::arg("out_dir") = "", py::arg("overwrite") = false,
      "`bitpush keygen`: a CURVE key file for every node of the cluster YAML at `path` "
      "(scheduler.key, server-0.key, worker-0.key; mode 0600) and public_keys, in out_dir "
      "(default: the YAML's security.keys_dir). Existing key files are kept (and listed) "
      "unless overwrite. Returns the paths written. docs/security.md.");
  m.def(
      "check_node_security",
      [](const std::string& path, const std::string& node) {
        config::ClusterConfig c = ValueOrThrow(config::LoadClusterConfig(path));
        ThrowIfError(config::NodeTransportSecurity(c, node).status());
      },
      py::arg("path"), py::arg("node"),
      "Raises BitpushError naming the file and the problem when node ('scheduler', "
      "'server:0', 'worker:1') could not start under the YAML's security settings (its key "
      "file, its mode, the public key list).");
  m.def(
      "compressor_spec",
      [](const std::string& spec) {
        return compressors::CompressorSpecString(
            ValueOrThrow(compressors::ParseCompressorSpec(spec)));
      },
      "The canonical form of a compressor spec ('onebit' -> 'onebit:scaled=true'; "
      "docs/compressors.md), parsed by the spec registry the daemons use. A bad spec raises "
      "BitpushError naming the problem ('unknown compressor ...', 'unknown parameter ...').");
  m.def(
      "recommended_error_feedback",
      [](const std::string& spec) {
        return std::string(
            compressors::ErrorFeedbackPolicyName(compressors::RecommendedErrorFeedback(
                ValueOrThrow(compressors::ParseCompressorSpec(spec)))));
      },
      "The error-feedback policy a compressor spec asks for ('none', 'worker', 'server', "
      "'both'): both for the biased methods and loco (worker for loco with 16/32-bit pulls), "
      "worker for separate, none for the unbiased ones (dithering, unbiased randomk, sdp4bit). "
      "A bad spec raises BitpushError.");
  m.def(
      "knobs",
      [] {
        py::list out;
        for (const config::ClusterKnob& k : config::ClusterKnobs()) {
          py::dict d;
          d["path"] = k.spec.path;
          d["type"] = config::KnobTypeDoc(k.spec);
          d["default"] = k.spec.default_text;
          d["scalar"] = k.get != nullptr;
          d["flag"] = k.spec.flag.name;
          d["env"] = k.spec.env;
          d["doc"] = k.spec.doc;
          out.append(d);
        }
        return out;
      },
      "The knob table of the cluster YAML (docs/config.md): a list of dicts with path "
      "('worker.op_timeout_s'), type, default (canonical text), scalar (False for the "
      "structured keys: addresses, hosts, overrides, token_file), flag and env (the "
      "command-line flag and environment variable, '' when none) and doc.");
}

}  // namespace bitpush::python
