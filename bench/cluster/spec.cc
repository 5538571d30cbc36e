#include "bench/cluster/spec.h"

#include <cstdlib>

#include "common/logging.h"
#include "common/node/identity.h"
#include "fmt/format.h"

namespace bitpush::bench::cluster {

config::ClusterConfig MakeClusterConfig(const ClusterSpec& spec, int first_port) {
  config::ClusterConfig c;
  c.source = fmt::format("bitpush-bench cluster ({} nodes over {})", spec.nodes, spec.transport);
  c.transport = spec.transport;
  int port = first_port;
  auto address = [&](const std::string& name) {
    if (spec.transport == "inproc") return "inproc://" + name;
    return fmt::format("tcp://127.0.0.1:{}", port++);
  };
  c.scheduler_address = address(node::kSchedulerPeerId);
  for (uint32_t s = 0; s < spec.servers(); ++s) {
    c.servers.push_back(address(node::NodePeerId(v1::ROLE_SERVER, s)));
  }
  for (uint32_t w = 0; w < spec.workers(); ++w) {
    c.workers.push_back(address(node::NodePeerId(v1::ROLE_WORKER, w)));
  }
  c.heartbeat_interval = spec.heartbeat_interval;
  c.heartbeat_timeout = spec.heartbeat_timeout;
  c.startup_timeout = std::chrono::seconds(60);
  return c;
}

std::vector<std::string> SpecArgs(const ClusterSpec& spec) {
  return {"--transport",
          spec.transport,
          "--nodes",
          std::to_string(spec.nodes),
          "--first-port",
          std::to_string(spec.first_port),
          "--heartbeat-ms",
          std::to_string(spec.heartbeat_interval.count()),
          "--heartbeat-timeout-ms",
          std::to_string(spec.heartbeat_timeout.count()),
          "--barriers",
          std::to_string(spec.barriers),
          "--idle-s",
          fmt::format("{}", spec.idle_s),
          "--pushpull-rounds",
          std::to_string(spec.pushpull_rounds),
          "--pushpull-floats",
          std::to_string(spec.pushpull_floats),
          "--log-level",
          spec.log_level};
}

bool ParseSpecFlag(const char* subcommand, ArgCursor& args, ClusterSpec* spec) {
  const std::string& a = args.flag();
  if (a == "--heartbeat-ms") {
    spec->heartbeat_interval =
        std::chrono::milliseconds(ParsePositive(subcommand, a, args.Value(), 60000));
  } else if (a == "--heartbeat-timeout-ms") {
    spec->heartbeat_timeout =
        std::chrono::milliseconds(ParsePositive(subcommand, a, args.Value(), 600000));
  } else if (a == "--barriers") {
    spec->barriers = static_cast<uint32_t>(ParsePositive(subcommand, a, args.Value(), 100000));
  } else if (a == "--idle-s") {
    spec->idle_s = ParseSeconds(subcommand, a, args.Value());
  } else if (a == "--pushpull-rounds") {
    const std::string v = args.Value();
    spec->pushpull_rounds =
        v == "0" ? 0 : static_cast<uint32_t>(ParsePositive(subcommand, a, v, 10000));
  } else if (a == "--pushpull-floats") {
    spec->pushpull_floats =
        static_cast<uint32_t>(ParsePositive(subcommand, a, args.Value(), 1u << 20));
  } else if (a == "--log-level") {
    spec->log_level = args.Value();
    static const char* const kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
    if (std::find(std::begin(kLevels), std::end(kLevels), spec->log_level) == std::end(kLevels)) {
      UsageError(subcommand,
                 "--log-level needs one of trace, debug, info, warn, error, off; got '" +
                     spec->log_level + "'");
    }
  } else {
    return false;
  }
  return true;
}

void CheckSpec(const char* subcommand, ClusterSpec* spec, bool timeout_set) {
  if (!timeout_set) spec->heartbeat_timeout = 5 * spec->heartbeat_interval;
  if (spec->nodes < 2) {
    UsageError(subcommand, "--nodes: a cluster needs at least 2 nodes (a server and a worker)");
  }
  const Status valid = config::ValidateClusterConfig(MakeClusterConfig(*spec, kLowestPort));
  if (!valid.ok()) UsageError(subcommand, valid.message());
}

JsonRecord& AddFigures(JsonRecord& r, const ClusterFigures& f) {
  return r.Add("register_s", f.register_s)
      .Add("register_total_s", f.register_total_s)
      .Add("barrier_ms_median", f.barrier_ms_median)
      .Add("barrier_ms_p99", f.barrier_ms_p99)
      .Add("barrier_ms_max", f.barrier_ms_max)
      .Add("barrier_first_release_ms_median", f.barrier_first_release_ms_median)
      .Add("barrier_fanout_ms_median", f.barrier_fanout_ms_median)
      .Add("scheduler_cpu_pct", f.scheduler_cpu_pct)
      .Add("scheduler_io_cpu_pct", f.scheduler_io_cpu_pct)
      .Add("process_cpu_pct", f.process_cpu_pct)
      .Add("idle_s", f.idle_s)
      .Add("rss_per_node_kib", f.rss_per_node_kib)
      .Add("threads", static_cast<long long>(f.threads))
      .Add("fds", static_cast<long long>(f.fds))
      .Add("fds_per_endpoint", f.fds_per_endpoint)
      .Add("fds_per_connection", f.fds_per_connection)
      .Add("kill_named_s", f.kill_named_s)
      .Add("killed", f.killed)
      .Add("pushpull_round_ms", f.pushpull_round_ms)
      .Add("pushpull_round_ms_max", f.pushpull_round_ms_max)
      .Add("pushpull_first_round_ms", f.pushpull_first_round_ms)
      .Add("pushpull_rounds", static_cast<long long>(f.pushpull_rounds))
      .Add("pushpull_skipped", f.pushpull_skipped);
}

std::string FiguresJson(const ClusterFigures& f) {
  JsonRecord r;
  return AddFigures(r, f).str();
}

ClusterFigures ParseFigures(const std::string& json) {
  const std::map<std::string, std::string> m = ReadFlatJson(json);
  auto number = [&m](const char* key) { return JsonNumber(m, key, NAN); };
  auto text = [&m](const char* key) {
    auto it = m.find(key);
    return it == m.end() ? std::string() : it->second;
  };
  ClusterFigures f;
  f.register_s = number("register_s");
  f.register_total_s = number("register_total_s");
  f.barrier_ms_median = number("barrier_ms_median");
  f.barrier_ms_p99 = number("barrier_ms_p99");
  f.barrier_ms_max = number("barrier_ms_max");
  f.barrier_first_release_ms_median = number("barrier_first_release_ms_median");
  f.barrier_fanout_ms_median = number("barrier_fanout_ms_median");
  f.scheduler_cpu_pct = number("scheduler_cpu_pct");
  f.scheduler_io_cpu_pct = number("scheduler_io_cpu_pct");
  f.process_cpu_pct = number("process_cpu_pct");
  f.idle_s = number("idle_s");
  f.rss_per_node_kib = number("rss_per_node_kib");
  f.threads = static_cast<int64_t>(JsonNumber(m, "threads", 0));
  f.fds = static_cast<int64_t>(JsonNumber(m, "fds", 0));
  f.fds_per_endpoint = number("fds_per_endpoint");
  f.fds_per_connection = number("fds_per_connection");
  f.kill_named_s = number("kill_named_s");
  f.killed = text("killed");
  f.pushpull_round_ms = number("pushpull_round_ms");
  f.pushpull_round_ms_max = number("pushpull_round_ms_max");
  f.pushpull_first_round_ms = number("pushpull_first_round_ms");
  f.pushpull_rounds = static_cast<int64_t>(JsonNumber(m, "pushpull_rounds", 0));
  f.pushpull_skipped = text("pushpull_skipped");
  return f;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  return values[std::min(values.size(), std::max<size_t>(rank, 1)) - 1];
}

}  // namespace bitpush::bench::cluster
