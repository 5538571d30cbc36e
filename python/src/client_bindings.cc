// Python bindings of worker::Client and PushPullHandle (`bitpush._C.Client`, `bitpush._C.Handle`).
//
// Data is passed as raw addresses (torch's tensor.data_ptr()): the Python layer
// (bitpush/torch/__init__.py) owns the tensors and keeps them alive until the handle completed.
// Every call that can block — registration, declarations' commit, push_pull, waits, barrier,
// shutdown, close — runs with the GIL released. Waits are cut into 100 ms slices with
// PyErr_CheckSignals between them, so Ctrl-C raises KeyboardInterrupt in the waiting thread
// (the operation itself goes on; its buffers stay owned by the handle's keep-alives).
//
// Thread-safety: as worker::Client (any thread). The Client is held by shared_ptr and each call
// copies it under the GIL, so close() from one thread never frees it under another's call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/logging.h"
#include "compressors/spec_registry.h"
#include "config/cluster_config.h"
#include "python/src/bindings.h"
#include "python/src/status_error.h"
#include "worker/client.h"

namespace bitpush::python {
namespace {

namespace py = pybind11;
using worker::Client;
using worker::ClientMode;
using worker::PushPullHandle;

constexpr std::chrono::milliseconds kWaitSlice(100);

// The Python object behind bitpush._C.Client.
class PyClient {
 public:
  PyClient(const std::string& config_path, uint32_t rank, const std::string& mode,
           uint32_t local_rank, uint32_t local_size, const std::string& socket) {
    worker::ClientOptions o;
    if (mode == "embedded") {
      o.mode = ClientMode::kEmbedded;
    } else if (mode == "daemon") {
      o.mode = ClientMode::kDaemon;
    } else {
      throw StatusError(
          InvalidArgumentError("mode must be 'embedded' or 'daemon', got '" + mode + "'"));
    }
    o.rank = rank;
    o.local_rank = local_rank;
    o.local_size = local_size;
    o.daemon_socket = socket;
    StatusOr<std::unique_ptr<Client>> client = InternalError("not created");
    {
      py::gil_scoped_release nogil;
      StatusOr<config::ClusterConfig> cluster = config::LoadClusterConfig(config_path);
      if (!cluster.ok()) {
        client = cluster.status();
      } else {
        o.cluster = std::move(cluster).value();
        client = Client::Create(std::move(o));
      }
    }
    client_ = std::shared_ptr<Client>(ValueOrThrow(std::move(client)).release());
  }

  std::shared_ptr<Client> Get() const {
    if (!client_) throw StatusError(FailedPreconditionError("the bitpush client is closed"));
    return client_;
  }

  void Close() {
    std::shared_ptr<Client> c = std::move(client_);
    if (c) {
      py::gil_scoped_release nogil;
      c->Close();
      c.reset();  // the last reference (unless another thread's call still runs) joins here
    }
  }

  bool closed() const { return client_ == nullptr; }

 private:
  std::shared_ptr<Client> client_;
};

// The Python object behind bitpush._C.Handle.
struct PyHandle {
  PushPullHandle handle;
  std::string tensor;
};

DType DTypeOrThrow(const std::string& name) {
  return ValueOrThrow(ParseDType(name));
}

// Waits for `h` in slices, checking for signals (KeyboardInterrupt) in between. Returns the
// operation's status, or Timeout after `timeout_ms` (the operation goes on).
Status WaitInterruptibly(const PyHandle& h, std::optional<int64_t> timeout_ms) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto slice = kWaitSlice;
    if (timeout_ms) {
      const auto left = std::chrono::milliseconds(*timeout_ms) -
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start);
      slice = std::max(std::chrono::milliseconds(0), std::min(slice, left));
    }
    Status s;
    bool ready = false;
    {
      py::gil_scoped_release nogil;
      s = h.handle.Wait(slice);
      ready = h.handle.Ready();
      if (ready) s = h.handle.Wait();  // the final status; returns at once
    }
    if (ready) return s;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (timeout_ms &&
        std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(*timeout_ms)) {
      return TimeoutError("push_pull of tensor '" + h.tensor + "' not complete after " +
                          std::to_string(*timeout_ms) + " ms");
    }
  }
}

py::dict StatsDict(const worker::ClientStats& s) {
  py::dict d;
  d["ops_completed"] = s.ops_completed;
  d["ops_failed"] = s.ops_failed;
  d["partitions_pushed"] = s.partitions_pushed;
  d["bytes_pushed"] = s.bytes_pushed;
  d["bytes_pulled"] = s.bytes_pulled;
  d["compress_ns"] = s.compress_ns;
  d["network_ns"] = s.network_ns;
  d["decompress_ns"] = s.decompress_ns;
  d["peak_bytes_in_flight"] = s.peak_bytes_in_flight;
  d["peak_server_window_bytes"] = s.peak_server_window_bytes;
  d["raw_bytes_pushed"] = s.raw_bytes_pushed;
  d["quantized_values"] = s.quantized_values;
  d["quantized_saturated"] = s.quantized_saturated;
  d["non_finite_pushes"] = s.non_finite_pushes;
  d["non_finite_rounds"] = s.non_finite_rounds;
  d["error_values"] = s.error_values;
  d["error_saturated"] = s.error_saturated;
  d["error_norm"] = s.error_norm;
  d["gradient_norm"] = s.gradient_norm;
  return d;
}

// A residual read by `read` (ErrorFeedbackState or ServerErrorFeedbackState) as float32 bytes.
template <typename Read>
py::bytes ResidualBytes(const PyClient& self, uint32_t index, Read read) {
  auto c = self.Get();
  StatusOr<std::vector<float>> state = InternalError("not read");
  {
    py::gil_scoped_release nogil;
    state = ((*c).*read)(worker::TensorId{index});
  }
  const std::vector<float> v = ValueOrThrow(std::move(state));
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Float32 bytes handed to `restore` (RestoreErrorFeedbackState or its server twin).
template <typename Restore>
void RestoreResidual(const PyClient& self, uint32_t index, const py::bytes& saved, const char* what,
                     Restore restore) {
  auto c = self.Get();
  const std::string raw = saved;
  if (raw.size() % sizeof(float) != 0) {
    ThrowIfError(InvalidArgumentError(std::string(what) + ": " + std::to_string(raw.size()) +
                                      " bytes is not a whole number of float32"));
  }
  std::vector<float> v(raw.size() / sizeof(float));
  if (!raw.empty()) std::memcpy(v.data(), raw.data(), raw.size());
  Status s;
  {
    py::gil_scoped_release nogil;
    s = ((*c).*restore)(worker::TensorId{index}, v);
  }
  ThrowIfError(s);
}

// worker::ServerOptimizerOptions from the Python layer's dict; unknown keys are refused by name.
worker::ServerOptimizerOptions ServerOptimizerFromDict(const py::dict& d) {
  worker::ServerOptimizerOptions o;
  for (const auto& [k, v] : d) {
    const std::string key = py::str(k);
    if (key == "rule") {
      o.rule = v.cast<std::string>();
    } else if (key == "weight_decay") {
      o.weight_decay = v.cast<float>();
    } else if (key == "momentum") {
      o.momentum = v.cast<float>();
    } else if (key == "nesterov") {
      o.nesterov = v.cast<bool>();
    } else if (key == "beta1") {
      o.beta1 = v.cast<float>();
    } else if (key == "beta2") {
      o.beta2 = v.cast<float>();
    } else if (key == "eps") {
      o.eps = v.cast<float>();
    } else if (key == "pull") {
      o.pull = v.is_none() ? "" : v.cast<std::string>();
    } else if (key == "pull_form") {
      o.pull_form = v.is_none() ? "" : v.cast<std::string>();
    } else {
      throw StatusError(InvalidArgumentError(
          "server_optimizer: unknown key '" + key +
          "' (rule, weight_decay, momentum, nesterov, beta1, beta2, eps, pull, pull_form)"));
    }
  }
  return o;
}

}  // namespace

void BindClient(py::module_& m) {
  py::class_<PyHandle>(m, "Handle",
                       "The completion of one push_pull (bitpush._C.Client.push_pull).")
      .def(
          "wait",
          [](const PyHandle& h, std::optional<int64_t> timeout_ms) {
            ThrowIfError(WaitInterruptibly(h, timeout_ms));
          },
          py::arg("timeout_ms") = py::none(),
          "Blocks until the push_pull completed; raises BitpushError with its failure. With "
          "timeout_ms, raises BitpushError (code Timeout) after that long without failing the "
          "operation. Ctrl-C raises KeyboardInterrupt (the operation goes on).")
      .def(
          "ready", [](const PyHandle& h) { return h.handle.Ready(); },
          "True once the push_pull completed (successfully or not).")
      .def_property_readonly("tensor", [](const PyHandle& h) { return h.tensor; });

  py::class_<PyClient>(m, "Client",
                       "A bitpush worker (worker/client.h): embedded (this process is the worker "
                       "node) or daemon mode (one training process of a node's bitpush-worker).")
      .def(py::init<const std::string&, uint32_t, const std::string&, uint32_t, uint32_t,
                    const std::string&>(),
           py::arg("config"), py::arg("rank"), py::arg("mode") = "embedded",
           py::arg("local_rank") = 0, py::arg("local_size") = 1, py::arg("socket") = "",
           "Loads the cluster YAML `config`, then registers worker `rank` with the scheduler "
           "(embedded) or connects to that node's daemon (daemon); bounded by "
           "cluster.startup_timeout_s.")
      .def(
          "declare",
          [](const PyClient& self, const std::string& name, size_t elements,
             const std::string& dtype, int64_t priority, const std::string& compression, bool sum,
             bool cuda, const std::optional<py::dict>& server_optimizer) {
            auto c = self.Get();
            worker::TensorOptions o;
            if (server_optimizer) o.server_optimizer = ServerOptimizerFromDict(*server_optimizer);
            o.cuda = cuda;
            o.priority = priority;
            o.compression = compression;
            o.op = sum ? worker::ReduceOp::kSum : worker::ReduceOp::kAverage;
            const DType t = DTypeOrThrow(dtype);
            StatusOr<worker::TensorId> id = InternalError("not declared");
            {
              py::gil_scoped_release nogil;
              id = c->Declare(name, elements, t, o);
            }
            return ValueOrThrow(std::move(id)).index;
          },
          py::arg("name"), py::arg("elements"), py::arg("dtype"), py::arg("priority") = 0,
          py::arg("compression") = "", py::arg("sum") = false, py::arg("cuda") = false,
          py::arg("server_optimizer") = py::none(),
          "Declares a tensor; returns its index. compression '' = the cluster's spec. cuda: "
          "its push_pulls take CUDA device pointers (fp32, daemon mode: the GPU path). "
          "server_optimizer: a dict (rule, weight_decay, momentum, nesterov, beta1, beta2, eps, "
          "pull, pull_form; worker::ServerOptimizerOptions) when the servers run its optimizer.")
      .def(
          "push_pull_step",
          [](const PyClient& self, uint32_t index, uintptr_t grad_ptr, uintptr_t weights_ptr,
             size_t elements, float lr, const std::string& name) {
            auto c = self.Get();
            PyHandle h;
            h.tensor = name;
            {
              py::gil_scoped_release nogil;
              h.handle =
                  c->PushPull(worker::TensorId{index},
                              ConstTensorView(reinterpret_cast<const float*>(grad_ptr), elements),
                              TensorView(reinterpret_cast<float*>(weights_ptr), elements), lr);
            }
            return h;
          },
          py::arg("index"), py::arg("grad_ptr"), py::arg("weights_ptr"), py::arg("elements"),
          py::arg("lr"), py::arg("name") = "",
          "Server-side optimizer tensors: pushes the float32 gradient at grad_ptr with the "
          "round's learning rate; the weights at weights_ptr receive the servers' update. The "
          "caller keeps both alive until the handle completed.")
      .def(
          "init_server_weights",
          [](const PyClient& self, uint32_t index, uintptr_t ptr, size_t elements) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->InitServerWeights(worker::TensorId{index},
                                       TensorView(reinterpret_cast<float*>(ptr), elements));
            }
            ThrowIfError(s);
          },
          py::arg("index"), py::arg("ptr"), py::arg("elements"),
          "Collective: worker 0's float32 weights at ptr become the servers' master weights; "
          "every worker's are overwritten with the servers' copy.")
      .def(
          "pull_server_weights",
          [](const PyClient& self, uint32_t index, uintptr_t ptr, size_t elements) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->PullServerWeights(worker::TensorId{index},
                                       TensorView(reinterpret_cast<float*>(ptr), elements));
            }
            ThrowIfError(s);
          },
          py::arg("index"), py::arg("ptr"), py::arg("elements"),
          "Overwrites the float32 weights at ptr with the servers' copy (after a restore).")
      .def(
          "server_optimizer_state",
          [](const PyClient& self, uint32_t index) {
            auto c = self.Get();
            StatusOr<std::vector<std::string>> state = InternalError("not read");
            {
              py::gil_scoped_release nogil;
              state = c->ServerOptimizerState(worker::TensorId{index});
            }
            py::list out;
            for (const std::string& b : ValueOrThrow(std::move(state))) out.append(py::bytes(b));
            return out;
          },
          py::arg("index"),
          "The servers' optimizer state of tensor `index` (weights, moments, step, the workers' "
          "copy): one bytes object per partition.")
      .def(
          "restore_server_optimizer_state",
          [](const PyClient& self, uint32_t index, const std::vector<py::bytes>& saved) {
            auto c = self.Get();
            std::vector<std::string> parts;
            parts.reserve(saved.size());
            for (const py::bytes& b : saved) parts.emplace_back(b);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->RestoreServerOptimizerState(worker::TensorId{index}, parts);
            }
            ThrowIfError(s);
          },
          py::arg("index"), py::arg("saved"),
          "Writes a saved server optimizer state (server_optimizer_state's list) back; then "
          "every worker calls pull_server_weights.")
      .def(
          "error_feedback_state",
          [](const PyClient& self, uint32_t index) {
            return ResidualBytes(self, index, &Client::ErrorFeedbackState);
          },
          py::arg("index"),
          "The worker error-feedback residual of tensor `index` as float32 bytes (empty when "
          "it keeps none). Daemon mode: the node's residual, the same for every local "
          "process.")
      .def(
          "restore_error_feedback_state",
          [](const PyClient& self, uint32_t index, const py::bytes& saved) {
            RestoreResidual(self, index, saved, "restore_error_feedback_state",
                            &Client::RestoreErrorFeedbackState);
          },
          py::arg("index"), py::arg("saved"),
          "Puts a saved residual (float32 bytes) back into tensor `index`. Daemon mode: "
          "applied from local rank 0, checked but not applied from the others.")
      .def(
          "set_error_feedback_decay",
          [](const PyClient& self, uint32_t index, float decay) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->SetErrorFeedbackDecay(worker::TensorId{index}, decay);
            }
            ThrowIfError(s);
          },
          py::arg("index"), py::arg("decay"),
          "The worker residual's decay of tensor `index` (CLAN's error_feedback_decay), applied "
          "inside each compression from its next push_pull on (Client::SetErrorFeedbackDecay). "
          "Unimplemented for methods with their own kind of error state and in daemon mode.")
      .def(
          "server_error_feedback_state",
          [](const PyClient& self, uint32_t index) {
            return ResidualBytes(self, index, &Client::ServerErrorFeedbackState);
          },
          py::arg("index"),
          "The servers' error-feedback residual of tensor `index` as float32 bytes (empty when "
          "it keeps none); embedded mode.")
      .def(
          "restore_server_error_feedback_state",
          [](const PyClient& self, uint32_t index, const py::bytes& saved) {
            RestoreResidual(self, index, saved, "restore_server_error_feedback_state",
                            &Client::RestoreServerErrorFeedbackState);
          },
          py::arg("index"), py::arg("saved"),
          "Writes a saved server residual (float32 bytes) back to the servers of tensor "
          "`index`, before its first push_pull; embedded mode.")
      .def(
          "tensor_rounds",
          [](const PyClient& self, uint32_t index) {
            auto c = self.Get();
            StatusOr<uint64_t> r = InternalError("unset");
            {
              py::gil_scoped_release nogil;
              r = c->TensorRounds(worker::TensorId{index});
            }
            ThrowIfError(r.status());
            return *r;
          },
          py::arg("index"),
          "The push_pulls of tensor `index` completed in this run (Client::TensorRounds); "
          "embedded mode.")
      .def(
          "restore_tensor_rounds",
          [](const PyClient& self, uint32_t index, uint64_t next) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->RestoreTensorRounds(worker::TensorId{index}, next);
            }
            ThrowIfError(s);
          },
          py::arg("index"), py::arg("next"),
          "Moves tensor `index` to round `next` here and at its servers, before its first "
          "push_pull (Client::RestoreTensorRounds: random streams continue); every worker "
          "calls it, then a barrier; embedded mode.")
      .def(
          "commit_declarations",
          [](const PyClient& self) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->CommitDeclarations();
            }
            ThrowIfError(s);
          },
          "Checks the declarations made so far against every other worker's (bounded).")
      .def(
          "push_pull",
          [](const PyClient& self, uint32_t index, uintptr_t in_ptr, uintptr_t out_ptr,
             size_t elements, const std::string& dtype, const std::string& name) {
            auto c = self.Get();
            const DType t = DTypeOrThrow(dtype);
            PyHandle h;
            h.tensor = name;
            {
              py::gil_scoped_release nogil;
              h.handle =
                  c->PushPull(worker::TensorId{index},
                              ConstTensorView(reinterpret_cast<const void*>(in_ptr), elements, t),
                              TensorView(reinterpret_cast<void*>(out_ptr), elements, t));
            }
            return h;
          },
          py::arg("index"), py::arg("in_ptr"), py::arg("out_ptr"), py::arg("elements"),
          py::arg("dtype"), py::arg("name") = "",
          "Starts a push_pull of tensor `index` from the memory at in_ptr into out_ptr (may be "
          "equal). The caller keeps both alive until the handle completed.")
      .def(
          "wait_for_servers",
          [](const PyClient& self, double timeout_s) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->WaitForServers(
                  std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
            }
            ThrowIfError(s);
          },
          py::arg("timeout_s"),
          "cluster.server_rejoin_timeout_s: waits until a failed server rejoined (then restore "
          "the checkpoint); with none missing yet, waits up to 2 heartbeat timeouts for a verdict.")
      .def(
          "barrier",
          [](const PyClient& self) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->Barrier();
            }
            ThrowIfError(s);
          },
          "Waits for every worker (embedded mode only).")
      .def(
          "shutdown",
          [](PyClient& self, double timeout_s) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->Shutdown(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
            }
            c.reset();
            self.Close();
            ThrowIfError(s);
          },
          py::arg("timeout_s") = 30.0,
          "Tells the cluster this worker is done, waits (bounded) for the clean shutdown, "
          "closes the client.")
      .def(
          "trace_optimizer",
          [](const PyClient& self, int64_t start_ns, int64_t end_ns) {
            self.Get()->TraceOptimizer(start_ns, end_ns);
          },
          py::arg("start_ns"), py::arg("end_ns"),
          "The optimizer step from start_ns to end_ns (time.monotonic_ns()) as the timeline's "
          "`optimizer` span of the step just pushed (docs/observability.md); in daemon mode "
          "the node's daemon records it, with this process's local rank. Nothing when "
          "tracing is off.")
      .def("close", &PyClient::Close,
           "Fails pending handles with Cancelled and closes the client. Idempotent.")
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("rank", [](const PyClient& self) { return self.Get()->rank(); })
      .def_property_readonly("num_workers",
                             [](const PyClient& self) { return self.Get()->num_workers(); })
      .def_property_readonly("num_servers",
                             [](const PyClient& self) { return self.Get()->num_servers(); })
      .def(
          "status",
          [](const PyClient& self) {
            const Status s = self.Get()->status();
            return py::make_tuple(std::string(StatusCodeName(s.code())), s.message());
          },
          "The cluster's sticky error as (code, message); ('OK', '') while healthy.")
      .def(
          "stats", [](const PyClient& self) { return StatsDict(self.Get()->stats()); },
          "The worker's counters (worker::ClientStats) as a dict.")
      .def(
          "describe_compression",
          [](const PyClient& self, const std::vector<uint32_t>& indices) {
            std::vector<worker::TensorId> ids;
            ids.reserve(indices.size());
            for (uint32_t i : indices) ids.push_back(worker::TensorId{i});
            return ValueOrThrow(self.Get()->DescribeCompression(ids));
          },
          py::arg("indices"),
          "The 'compression: ...' line of these declared tensors (worker::Client::"
          "DescribeCompression): how many travel compressed, by spec, and which raw and why.")
      .def(
          "compression_of",
          [](const PyClient& self, const std::vector<uint32_t>& indices) {
            std::vector<worker::TensorId> ids;
            ids.reserve(indices.size());
            for (uint32_t i : indices) ids.push_back(worker::TensorId{i});
            py::list out;
            for (const worker::TensorCompression& t :
                 ValueOrThrow(self.Get()->CompressionOf(ids))) {
              out.append(py::make_tuple(compressors::CompressorSpecString(t.config),
                                        std::string(worker::WhyName(t.why))));
            }
            return out;
          },
          py::arg("indices"),
          "Per declared tensor: (the spec it travels with, canonical; why: 'compressed', "
          "'spec none', 'below min_compress_bytes' or 'below the method's minimum').");
  m.def(
      "set_log_level",
      [](const std::string& level) {
        if (!SetLogLevel(level)) {
          throw StatusError(InvalidArgumentError(
              "log level '" + level + "': expected trace, debug, info, warn, error or off"));
        }
      },
      py::arg("level"),
      "Sets the level of this process's bitpush log (the in-process worker engine): trace, "
      "debug, info, warn, error or off.");
}

}  // namespace bitpush::python
