// The cluster YAML (docs/config.md): values, defaults, normalisation, and the error messages
// users see — each naming the file, the line and the key.
#include "config/cluster_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "fmt/format.h"
#include "tests/unit/test_util.h"

namespace bitpush::config {
namespace {

using std::chrono::milliseconds;

constexpr char kFull[] = R"(# a full cluster
cluster:
  scheduler: 127.0.0.1:9000
  transport: zmq
  token: s3cret
  servers: [127.0.0.1:9101, "tcp://127.0.0.1:9102"]
  workers:
    - 127.0.0.1:9201
    - ipc:///tmp/bitpush-w1.sock
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 1000
  startup_timeout_s: 7
compression:
  spec: onebit
  error_feedback: both
  min_compress_bytes: 1024
  partition_bytes: 4096
)";

constexpr char kMinimal[] = R"(cluster:
  scheduler: localhost:9000
  servers: [localhost:9101]
  workers: [localhost:9201]
)";

ClusterConfig Parse(const std::string& yaml) {
  StatusOr<ClusterConfig> c = ParseClusterConfig(yaml, "cluster.yaml");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ClusterConfig{};
}

// The error message for `yaml`, which must be rejected.
std::string Error(const std::string& yaml) {
  StatusOr<ClusterConfig> c = ParseClusterConfig(yaml, "cluster.yaml");
  EXPECT_FALSE(c.ok()) << "accepted:\n" << yaml;
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
  return c.status().message();
}

// kMinimal with `line` appended to the cluster section.
std::string MinimalWith(const std::string& line) {
  return std::string(kMinimal) + "  " + line + "\n";
}

TEST(ClusterConfig, ParsesEveryKey) {
  const ClusterConfig c = Parse(kFull);
  EXPECT_EQ(c.source, "cluster.yaml");
  EXPECT_EQ(c.scheduler_address, "tcp://127.0.0.1:9000");
  EXPECT_EQ(c.transport, "zmq");
  EXPECT_EQ(c.token, "s3cret");
  EXPECT_EQ(c.servers, (std::vector<std::string>{"tcp://127.0.0.1:9101", "tcp://127.0.0.1:9102"}));
  EXPECT_EQ(c.workers,
            (std::vector<std::string>{"tcp://127.0.0.1:9201", "ipc:///tmp/bitpush-w1.sock"}));
  EXPECT_EQ(c.heartbeat_interval, milliseconds(200));
  EXPECT_EQ(c.heartbeat_timeout, milliseconds(1000));
  EXPECT_EQ(c.startup_timeout, milliseconds(7000));
  EXPECT_EQ(c.compression.spec, "onebit:scaled=true");  // canonical
  EXPECT_EQ(c.compression.error_feedback, "both");
  EXPECT_EQ(c.compression.min_compress_bytes, 1024u);
  EXPECT_EQ(c.compression.partition_bytes, 4096u);
  EXPECT_EQ(c.num_nodes(), 4u);
  EXPECT_EQ(c.NodeAddress(v1::ROLE_SERVER, 1), "tcp://127.0.0.1:9102");
  EXPECT_EQ(c.NodeAddress(v1::ROLE_WORKER, 2), "");
  EXPECT_TRUE(ValidateClusterConfig(c).ok());
}

TEST(ClusterConfig, Defaults) {
  const ClusterConfig c = Parse(kMinimal);
  EXPECT_EQ(c.transport, "zmq");
  EXPECT_EQ(c.token, "");
  EXPECT_EQ(c.heartbeat_interval, milliseconds(1000));
  EXPECT_EQ(c.heartbeat_timeout, milliseconds(5000));
  EXPECT_EQ(c.startup_timeout, milliseconds(60000));
  EXPECT_EQ(c.compression.spec, "none");
  EXPECT_EQ(c.compression.error_feedback, "none");
  EXPECT_EQ(c.compression.min_compress_bytes, 4096u);
  EXPECT_EQ(c.compression.partition_bytes, 4096000u);
}

TEST(ClusterConfig, FractionalStartupTimeout) {
  EXPECT_EQ(Parse(MinimalWith("startup_timeout_s: 0.25")).startup_timeout, milliseconds(250));
}

TEST(ClusterConfig, InprocAddresses) {
  const ClusterConfig c = Parse(R"(cluster:
  transport: inproc
  scheduler: sched
  servers: [inproc://s0]
  workers: [w0, w1]
)");
  EXPECT_EQ(c.scheduler_address, "inproc://sched");
  EXPECT_EQ(c.servers[0], "inproc://s0");
  EXPECT_EQ(c.workers[1], "inproc://w1");
}

TEST(ClusterConfig, UnbiasedRandomkWithErrorFeedbackIsRefused) {
  const std::string base = std::string(kMinimal) + "compression:\n";
  std::string m =
      Error(base + "  spec: randomk:ratio=0.03125,unbiased=true\n  error_feedback: both\n");
  EXPECT_CONTAINS(m, "compression.error_feedback");
  EXPECT_CONTAINS(m, "unbiased random-k");
  EXPECT_CONTAINS(m, "error_feedback: none");
  // The combinations that make sense are accepted.
  Parse(base + "  spec: randomk:ratio=0.03125,unbiased=true\n  error_feedback: none\n");
  Parse(base + "  spec: randomk:ratio=0.03125,unbiased=false\n  error_feedback: both\n");
}

TEST(ClusterConfig, UnknownKeyNamesKeyAndLine) {
  std::string m = Error(MinimalWith("heartbeat_intervall_ms: 100"));
  EXPECT_CONTAINS(m, "cluster.yaml:5: cluster.heartbeat_intervall_ms: unknown key");
  EXPECT_CONTAINS(m, "heartbeat_interval_ms");  // lists the valid keys
  m = Error(std::string(kMinimal) + "servers:\n  threads: 4\n");
  EXPECT_CONTAINS(m, "cluster.yaml:5: servers: unknown key");
  m = Error(std::string(kMinimal) + "compression:\n  spec: none\n  ratio: 3\n");
  EXPECT_CONTAINS(m, "cluster.yaml:7: compression.ratio: unknown key");
}

TEST(ClusterConfig, BadValuesNameKeyAndLine) {
  EXPECT_CONTAINS(Error(MinimalWith("heartbeat_interval_ms: fast")),
                  "cluster.yaml:5: cluster.heartbeat_interval_ms: expected a non-negative "
                  "integer, got 'fast'");
  EXPECT_CONTAINS(Error(MinimalWith("heartbeat_interval_ms: 0")),
                  "cluster.yaml:5: cluster.heartbeat_interval_ms: must be 1..60000");
  EXPECT_CONTAINS(Error(MinimalWith("heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 150")),
                  "cluster.yaml:6: cluster.heartbeat_timeout_ms: must be at least 2 x "
                  "cluster.heartbeat_interval_ms (200 ms)");
  EXPECT_CONTAINS(Error(MinimalWith("heartbeat_interval_ms: 4000")),
                  "cluster.yaml:5: cluster.heartbeat_interval_ms: is too long for the default");
  EXPECT_CONTAINS(Error(MinimalWith("startup_timeout_s: -1")),
                  "cluster.yaml:5: cluster.startup_timeout_s: expected a number of seconds");
  EXPECT_CONTAINS(Error(MinimalWith("transport: rdma")),
                  "cluster.yaml:5: cluster.transport: unknown transport 'rdma'; valid: zmq, "
                  "ucx, inproc");
  EXPECT_CONTAINS(Error(MinimalWith("token:")), "cluster.yaml:5: cluster.token: has no value");
  EXPECT_CONTAINS(Error(MinimalWith("heartbeat_interval_ms: [1, 2]")),
                  "cluster.yaml:5: cluster.heartbeat_interval_ms: expected a single value");
}

TEST(ClusterConfig, SizesAboveTheirBoundNameKeyValueAndBound) {
  const std::string base = std::string(kMinimal) + "compression:\n  spec: none\n";
  EXPECT_CONTAINS(Error(base + "  partition_bytes: 1000000000000\n"),
                  "cluster.yaml:7: compression.partition_bytes: must be 1..1073741824 (bytes), "
                  "got 1000000000000");
  EXPECT_CONTAINS(Error(base + "  partition_bytes: 1e12\n"),
                  "cluster.yaml:7: compression.partition_bytes: expected a non-negative integer, "
                  "got '1e12'");
  EXPECT_EQ(Parse(base + "  partition_bytes: 1073741824\n").compression.partition_bytes,
            uint64_t{1} << 30);
  EXPECT_CONTAINS(Error(base + "  min_compress_bytes: 1099511627777\n"),
                  "compression.min_compress_bytes: must be 0..1099511627776 (bytes), got "
                  "1099511627777");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "worker:\n  credit_bytes: 99999999999999999\n"),
                  "cluster.yaml:6: worker.credit_bytes: must be 1..1099511627776 (bytes), got "
                  "99999999999999999");
  // The defaults are inside.
  const ClusterConfig d = Parse(kMinimal);
  EXPECT_EQ(d.compression.partition_bytes, 4096000u);
  EXPECT_EQ(d.worker.credit_bytes, 64ull << 20);
}

TEST(ClusterConfig, ServerAndWorkerSections) {
  const ClusterConfig d = Parse(kMinimal);
  EXPECT_EQ(d.server.engine_threads, 0u);  // auto
  EXPECT_EQ(d.server.numa, NumaMode::kAuto);
  EXPECT_EQ(d.worker.compress_threads, 0u);
  EXPECT_EQ(d.worker.credit_bytes, 64ull << 20);
  EXPECT_EQ(d.worker.op_timeout.count(), 300000);
  const ClusterConfig c = Parse(std::string(kMinimal) +
                                "server:\n  engine_threads: 3\n  numa: off\n"
                                "worker:\n  compress_threads: auto\n  credit_bytes: 8192\n"
                                "  op_timeout_s: 2.5\n");
  EXPECT_EQ(c.server.engine_threads, 3u);
  EXPECT_EQ(c.server.numa, NumaMode::kOff);
  EXPECT_EQ(c.worker.compress_threads, 0u);
  EXPECT_EQ(c.worker.credit_bytes, 8192u);
  EXPECT_EQ(c.worker.op_timeout.count(), 2500);
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "server:\n  engine_threads: 0\n"),
                  "cluster.yaml:6: server.engine_threads: expected 'auto' or an integer from 1 "
                  "to 256, got '0'");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "server:\n  numa: yes\n"),
                  "cluster.yaml:6: server.numa: unknown value 'yes'; valid: auto, on, off");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "worker:\n  credit_bytes: 0\n"),
                  "cluster.yaml:6: worker.credit_bytes: must be 1..1099511627776 (bytes), got 0");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "worker:\n  op_timeout_s: never\n"),
                  "cluster.yaml:6: worker.op_timeout_s: expected a number of seconds");
  EXPECT_CONTAINS(
      Error(std::string(kMinimal) + "worker:\n  threads: 2\n"),
      "worker.threads: unknown key; valid keys of worker: compress_threads, "
      "credit_bytes, local_size, numa, op_timeout_s, reduce_threads, server_window_bytes, socket");
  // Local tuning: not part of config agreement.
  EXPECT_EQ(ConfigHash(ConfigFields(c)), ConfigHash(ConfigFields(d)));
}

TEST(ClusterConfig, WorkerDaemonKeys) {
  const ClusterConfig d = Parse(kMinimal);
  EXPECT_EQ(d.worker.local_size, 0u);      // from the first Hello
  EXPECT_EQ(d.worker.socket, "");          // the default path
  EXPECT_EQ(d.worker.reduce_threads, 0u);  // auto
  EXPECT_EQ(d.worker.numa, NumaMode::kAuto);
  const ClusterConfig c =
      Parse(std::string(kMinimal) +
            "worker:\n  local_size: 3\n  socket: /tmp/bp-node.sock\n  reduce_threads: 2\n"
            "  numa: off\n");
  EXPECT_EQ(c.worker.reduce_threads, 2u);
  EXPECT_EQ(c.worker.numa, NumaMode::kOff);
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "worker:\n  numa: maybe\n"),
                  "cluster.yaml:6: worker.numa: unknown value 'maybe'; valid: auto, on, off");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "worker:\n  reduce_threads: 0\n"),
                  "cluster.yaml:6: worker.reduce_threads: expected 'auto' or an integer from 1 "
                  "to 256, got '0'");
  EXPECT_EQ(c.worker.local_size, 3u);
  EXPECT_EQ(c.worker.socket, "/tmp/bp-node.sock");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "worker:\n  local_size: 0\n"),
                  "cluster.yaml:6: worker.local_size: expected 1..1024 training processes, got 0");
  EXPECT_CONTAINS(
      Error(std::string(kMinimal) + "worker:\n  socket: /" + std::string(120, 'x') + "\n"),
      "cluster.yaml:6: worker.socket: expected a path of 1..107 bytes");
  // Local tuning: not part of config agreement.
  EXPECT_EQ(ConfigHash(ConfigFields(c)), ConfigHash(ConfigFields(d)));
}

TEST(ClusterConfig, PerTensorOverridesByNamePattern) {
  const ClusterConfig d = Parse(kMinimal);
  EXPECT_TRUE(d.compression.overrides.empty());
  const ClusterConfig c = Parse(std::string(kMinimal) +
                                "compression:\n  spec: onebit\n  overrides:\n"
                                "    - {pattern: '*.bias', spec: none}\n"
                                "    - pattern: 'embed*'\n      spec: topk:ratio=0.01\n"
                                "    - {pattern: '*', spec: fp16}\n");
  ASSERT_EQ(c.compression.overrides.size(), 3u);
  EXPECT_EQ(c.compression.SpecForTensor("fc1.bias"), "none");
  EXPECT_EQ(c.compression.SpecForTensor("embeddings.weight"), "topk:ratio=0.01");
  EXPECT_EQ(c.compression.SpecForTensor("fc1.weight"), "fp16");  // first match wins
  // Without a catch-all the cluster's spec applies.
  const ClusterConfig e = Parse(std::string(kMinimal) +
                                "compression:\n  spec: onebit\n  overrides:\n"
                                "    - {pattern: '*.bias', spec: none}\n");
  EXPECT_EQ(e.compression.SpecForTensor("fc1.weight"), "onebit:scaled=true");
  // Agreed: part of the hash only when set.
  EXPECT_NE(
      ConfigHash(ConfigFields(e)),
      ConfigHash(ConfigFields(Parse(std::string(kMinimal) + "compression:\n  spec: onebit\n"))));
  EXPECT_EQ(ConfigFields(d).size(), 4u);
  EXPECT_CONTAINS(DescribeClusterConfig(e), "- {pattern: '*.bias', spec: 'none'}");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "compression:\n  overrides: {a: b}\n"),
                  "cluster.yaml:6: compression.overrides: expected a list");
  EXPECT_CONTAINS(Error(std::string(kMinimal) +
                        "compression:\n  overrides:\n    - {pattern: x, spec: twobit}\n"),
                  "compression.overrides[0].spec: unknown compressor 'twobit'");
  EXPECT_CONTAINS(Error(std::string(kMinimal) + "compression:\n  overrides:\n    - {spec: none}\n"),
                  "compression.overrides[0]: needs 'pattern'");
  EXPECT_CONTAINS(Error(std::string(kMinimal) +
                        "compression:\n  overrides:\n    - {pattern: x, spec: none, ratio: 1}\n"),
                  "compression.overrides[0].ratio: unknown key");
}

TEST(ClusterConfig, MethodMinimumIsOnByDefaultAgreedWhenOffAndChecked) {
  const ClusterConfig d = Parse(kMinimal);
  EXPECT_TRUE(d.compression.method_minimum);
  const std::string base = std::string(kMinimal) + "compression:\n  spec: separate\n";
  EXPECT_TRUE(Parse(base + "  method_minimum: true\n").compression.method_minimum);
  const ClusterConfig off = Parse(base + "  method_minimum: false\n");
  EXPECT_FALSE(off.compression.method_minimum);
  // Agreed: a field only when off, so configs that keep the default keep their hash.
  EXPECT_EQ(ConfigFields(d).size(), 4u);
  const std::vector<v1::ConfigField> fields = ConfigFields(off);
  ASSERT_EQ(fields.size(), 5u);
  EXPECT_EQ(fields[4].name(), "compression.method_minimum");
  EXPECT_EQ(fields[4].value(), "false");
  EXPECT_EQ(ConfigHash(ConfigFields(Parse(base + "  method_minimum: true\n"))),
            ConfigHash(ConfigFields(Parse(base))));
  EXPECT_CONTAINS(DescribeClusterConfig(off), "method_minimum: false");
  EXPECT_CONTAINS(Error(base + "  method_minimum: maybe\n"),
                  "cluster.yaml:7: compression.method_minimum: expected true or false, got "
                  "'maybe'");
  EXPECT_CONTAINS(Error(base + "  method_minimum: 0\n"),
                  "compression.method_minimum: expected true or false, got '0'");
}

TEST(ClusterConfig, BadCompressionNamesKeyAndLine) {
  std::string m = Error(std::string(kMinimal) + "compression:\n  spec: twobit\n");
  EXPECT_CONTAINS(m, "cluster.yaml:6: compression.spec: unknown compressor 'twobit'");
  m = Error(std::string(kMinimal) + "compression:\n  error_feedback: always\n");
  EXPECT_CONTAINS(m,
                  "cluster.yaml:6: compression.error_feedback: unknown error-feedback policy "
                  "'always'");
  m = Error(std::string(kMinimal) + "compression:\n  partition_bytes: 0\n");
  EXPECT_CONTAINS(
      m, "cluster.yaml:6: compression.partition_bytes: must be 1..1073741824 (bytes), got 0");
  m = Error(std::string(kMinimal) + "compression:\n  min_compress_bytes: -5\n");
  EXPECT_CONTAINS(m, "cluster.yaml:6: compression.min_compress_bytes: expected a non-negative");
}

TEST(ClusterConfig, RequiredKeysAndLists) {
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: h:1\n  workers: [h:2]\n"),
                  "cluster.yaml:2: cluster.servers: is required");
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: h:1\n  servers: []\n  workers: [h:2]\n"),
                  "cluster.yaml:3: cluster.servers: needs at least one address");
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: h:1\n  servers: h:3\n  workers: [h:2]\n"),
                  "cluster.yaml:3: cluster.servers: expected a list of addresses");
  EXPECT_CONTAINS(Error("compression:\n  spec: none\n"), "cluster: is required");
  EXPECT_CONTAINS(Error(""), "cluster.yaml: empty config");
  EXPECT_CONTAINS(Error("cluster:\n"), "cluster.yaml:1: cluster: is empty; expected a mapping");
}

TEST(ClusterConfig, BadAddresses) {
  auto with_server = [](const std::string& a) {
    return "cluster:\n  scheduler: h:1\n  servers: [\"" + a + "\"]\n  workers: [h:2]\n";
  };
  EXPECT_CONTAINS(Error(with_server("127.0.0.1")),
                  "cluster.yaml:3: cluster.servers[0]: address '127.0.0.1': expected host:port");
  EXPECT_CONTAINS(Error(with_server("tcp://h:99999")), "port must be 1..65535");
  EXPECT_CONTAINS(Error(with_server("h:0")), "port must be 1..65535");
  EXPECT_CONTAINS(Error(with_server("udp://h:5")), "unknown scheme 'udp'");
  EXPECT_CONTAINS(Error(with_server("*:5")), "needs a host others can connect to");
  EXPECT_CONTAINS(Error(with_server("inproc://x")), "inproc:// needs cluster.transport inproc");
  EXPECT_CONTAINS(Error(with_server("h:1")),
                  "cluster.servers[0]: address tcp://h:1 is already used by cluster.scheduler");
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: h:1\n  servers: [h:2]\n  workers: [h:3, h:2]\n"),
                  "cluster.yaml:4: cluster.workers[1]: address tcp://h:2 is already used by "
                  "cluster.servers[0]");
}

TEST(ClusterConfig, NormalizeAddress) {
  EXPECT_EQ(*NormalizeAddress("h:5", "zmq"), "tcp://h:5");
  EXPECT_EQ(*NormalizeAddress("tcp://10.0.0.1:5", "zmq"), "tcp://10.0.0.1:5");
  EXPECT_EQ(*NormalizeAddress("[::1]:5", "zmq"), "tcp://[::1]:5");
  EXPECT_EQ(*NormalizeAddress("ipc:///tmp/x", "zmq"), "ipc:///tmp/x");
  EXPECT_EQ(*NormalizeAddress("x", "inproc"), "inproc://x");
  EXPECT_FALSE(NormalizeAddress("", "zmq").ok());
  EXPECT_FALSE(NormalizeAddress("ipc://", "zmq").ok());
  EXPECT_FALSE(NormalizeAddress("tcp://h:5", "inproc").ok());
}

TEST(ClusterConfig, SyntaxErrorAndDuplicateKeys) {
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: [h:1\n"), "cluster.yaml:");
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: [h:1\n"), "YAML syntax error");
  EXPECT_CONTAINS(Error(MinimalWith("scheduler: h:7")),
                  "cluster.yaml:5: cluster.scheduler: duplicate key (first at line 2)");
  EXPECT_CONTAINS(Error("- a\n- b\n"), "top level: expected a mapping");
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/bitpush-config-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { (void)!system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  // A file only its owner may access, as a secret must be.
  std::string WriteSecret(const std::string& name, const std::string& text,
                          mode_t mode = 0600) const {
    const std::string p = Write(name, text);
    EXPECT_EQ(chmod(p.c_str(), mode), 0) << p;
    return p;
  }

 private:
  std::string path_;
};

TEST(ClusterConfig, TokenFileRelativeToTheConfig) {
  TempDir dir;
  dir.WriteSecret("token", "from-a-file\n");
  const std::string path = dir.Write("c.yaml", MinimalWith("token_file: token"));
  StatusOr<ClusterConfig> c = LoadClusterConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->token, "from-a-file");
  EXPECT_EQ(c->source, path);

  dir.WriteSecret("empty", "\n");
  c = LoadClusterConfig(dir.Write("e.yaml", MinimalWith("token_file: empty")));
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "e.yaml:5: cluster.token_file: ");
  EXPECT_CONTAINS(c.status().message(), "holds an empty token");

  c = LoadClusterConfig(dir.Write("m.yaml", MinimalWith("token_file: missing")));
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), dir.path() + "/missing: cannot open: No such file");

  EXPECT_CONTAINS(Error(MinimalWith("token: a\n  token_file: b")),
                  "cluster.yaml:6: cluster.token_file: set either cluster.token or "
                  "cluster.token_file, not both");
}

TEST(ClusterConfig, TokenFileOthersMayAccessIsRefusedNamingTheFileItsModeAndTheFix) {
  TempDir dir;
  for (const mode_t mode : {0640, 0604, 0620, 0660, 0644, 0610}) {
    const std::string name = fmt::format("token-{:o}", mode);
    const std::string token = dir.WriteSecret(name, "s3cret\n", mode);
    StatusOr<ClusterConfig> c =
        LoadClusterConfig(dir.Write("c.yaml", MinimalWith("token_file: " + name)));
    ASSERT_FALSE(c.ok()) << std::oct << mode;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    const std::string m = c.status().message();
    EXPECT_CONTAINS(m, "c.yaml:5: cluster.token_file: ");
    EXPECT_CONTAINS(m, token);
    EXPECT_CONTAINS(m, fmt::format("has mode {:04o}", mode));
    EXPECT_CONTAINS(m, "chmod 600 " + token);
    EXPECT_EQ(m.find("s3cret"), std::string::npos) << "the token leaked into: " << m;
  }
  // Owner-only modes are accepted.
  for (const mode_t mode : {0600, 0400, 0700}) {
    const std::string name = fmt::format("token-{:o}", mode);
    dir.WriteSecret(name, "s3cret\n", mode);
    StatusOr<ClusterConfig> c =
        LoadClusterConfig(dir.Write("c.yaml", MinimalWith("token_file: " + name)));
    ASSERT_TRUE(c.ok()) << std::oct << mode << ": " << c.status().ToString();
    EXPECT_EQ(c->token, "s3cret");
  }
}

TEST(ClusterConfig, MissingFileIsNotFound) {
  StatusOr<ClusterConfig> c = LoadClusterConfig("/nonexistent/cluster.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(c.status().message(), "/nonexistent/cluster.yaml");
}

TEST(ClusterConfig, ConfigFieldsAndHash) {
  const ClusterConfig c = Parse(kFull);
  const std::vector<v1::ConfigField> f = ConfigFields(c);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].name(), "compression.spec");
  EXPECT_EQ(f[0].value(), "onebit:scaled=true");
  EXPECT_EQ(f[1].name(), "compression.error_feedback");
  EXPECT_EQ(f[1].value(), "both");
  EXPECT_EQ(f[2].name(), "compression.min_compress_bytes");
  EXPECT_EQ(f[2].value(), "1024");
  EXPECT_EQ(f[3].name(), "compression.partition_bytes");
  EXPECT_EQ(f[3].value(), "4096");
  // FNV-1a 64 of "compression.spec=onebit:scaled=true\n...": pinned, every build must agree.
  EXPECT_EQ(ConfigHash(f), ConfigHash(ConfigFields(Parse(kFull))));
  ClusterConfig other = c;
  other.compression.partition_bytes = 4097;
  EXPECT_NE(ConfigHash(ConfigFields(other)), ConfigHash(f));
  EXPECT_EQ(ConfigHash({}), 0xCBF29CE484222325ull);  // FNV-1a offset basis
  v1::ConfigField a;
  a.set_name("a");
  a.set_value("b");
  EXPECT_EQ(ConfigHash({a}), 0xEC8B8C82C37596FBull) << std::hex << ConfigHash({a});  // "a=b\n"
}

TEST(ClusterConfig, DescribeConfigDifferenceNamesEveryField) {
  ClusterConfig sched = Parse(kFull);
  ClusterConfig node = sched;
  EXPECT_EQ(DescribeConfigDifference(ConfigFields(node), ConfigFields(sched)), "");
  node.compression.spec = "topk:ratio=0.01";
  node.compression.partition_bytes = 8192;
  EXPECT_EQ(DescribeConfigDifference(ConfigFields(node), ConfigFields(sched)),
            "config differs from the scheduler's: compression.spec is 'topk:ratio=0.01' here but "
            "'onebit:scaled=true' on the scheduler; compression.partition_bytes is '8192' here "
            "but '4096' on the scheduler");
  std::vector<v1::ConfigField> fewer = ConfigFields(sched);
  v1::ConfigField extra = fewer.back();
  fewer.pop_back();
  extra.set_name("compression.future_knob");
  fewer.push_back(extra);
  EXPECT_EQ(DescribeConfigDifference(fewer, ConfigFields(sched)),
            "config differs from the scheduler's: compression.partition_bytes is not set here "
            "but '4096' on the scheduler; compression.future_knob is '4096' here but unknown to "
            "the scheduler");
}

TEST(ClusterConfig, DescribeNeverShowsTheToken) {
  const std::string d = DescribeClusterConfig(Parse(kFull));
  EXPECT_EQ(d.find("s3cret"), std::string::npos) << d;
  EXPECT_CONTAINS(d, "token: <set>");
  EXPECT_CONTAINS(d, "scheduler: tcp://127.0.0.1:9000");
  EXPECT_CONTAINS(d, "spec: onebit:scaled=true");
  EXPECT_CONTAINS(d, "startup_timeout_s: 7\n");
}

TEST(ClusterConfig, ValidateCodeBuiltConfig) {
  ClusterConfig c = Parse(kFull);
  c.source = "";
  EXPECT_TRUE(ValidateClusterConfig(c).ok());
  ClusterConfig bad = c;
  bad.servers[0] = "127.0.0.1:9101";  // not normalised
  EXPECT_CONTAINS(ValidateClusterConfig(bad).message(),
                  "cluster.servers[0]: address "
                  "'127.0.0.1:9101' is not normalised");
  bad = c;
  bad.heartbeat_timeout = milliseconds(300);
  EXPECT_CONTAINS(ValidateClusterConfig(bad).message(), "cluster.heartbeat_timeout_ms");
  bad = c;
  bad.compression.spec = "onebit";
  EXPECT_CONTAINS(ValidateClusterConfig(bad).message(), "is not canonical");
  bad = c;
  bad.workers.clear();
  EXPECT_CONTAINS(ValidateClusterConfig(bad).message(), "cluster.workers: needs at least one");
}

TEST(ClusterConfig, Roles) {
  EXPECT_EQ(*ParseNodeRole("server"), v1::ROLE_SERVER);
  EXPECT_EQ(*ParseNodeRole("worker"), v1::ROLE_WORKER);
  EXPECT_CONTAINS(ParseNodeRole("scheduler").status().message(), "valid: server, worker");
  EXPECT_EQ(node::NodePeerId(v1::ROLE_WORKER, 3), "worker:3");
  EXPECT_EQ(node::RoleName(v1::ROLE_SCHEDULER), "scheduler");
}

// ---- the host form of cluster.servers / cluster.workers ----

constexpr char kHosts[] = R"(cluster:
  scheduler: ps0:9000
  servers: {hosts: [ps0, ps1], count: 2}
  workers:
    - {host: gpu0, processes: 4, gpus: [3, 2, 1, 0]}
    - {host: gpu1, gpus: 2, port: 7000}
    - gpu2:9300
)";

TEST(ClusterConfigHosts, ExpandsHostsCountsAndDefaultPorts) {
  const ClusterConfig c = Parse(kHosts);
  EXPECT_EQ(c.servers, (std::vector<std::string>{"tcp://ps0:9100", "tcp://ps0:9101",
                                                 "tcp://ps1:9100", "tcp://ps1:9101"}));
  EXPECT_EQ(c.workers,
            (std::vector<std::string>{"tcp://gpu0:9200", "tcp://gpu1:7000", "tcp://gpu2:9300"}));
  ASSERT_EQ(c.worker_nodes.size(), 3u);
  EXPECT_EQ(c.ProcessesOnNode(0), 4u);
  EXPECT_EQ(c.GpusOnNode(0), (std::vector<uint32_t>{3, 2, 1, 0}));
  EXPECT_EQ(c.ProcessesOnNode(1), 2u);  // from gpus: 2
  EXPECT_EQ(c.GpusOnNode(1), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(c.ProcessesOnNode(2), 0u);  // an address: not set
  EXPECT_TRUE(c.GpusOnNode(2).empty());
  EXPECT_EQ(c.TotalProcesses(), 0u);  // node 2 unknown
  EXPECT_FALSE(c.ProcessCountsDiffer());
  EXPECT_TRUE(ValidateClusterConfig(c).ok());
}

TEST(ClusterConfigHosts, SeveralEntriesOnOneHostContinueItsPorts) {
  const ClusterConfig c = Parse(R"(cluster:
  scheduler: 127.0.0.1:47100
  servers:
    - {host: 127.0.0.1, count: 2}
    - {host: 127.0.0.1}
    - {host: "::1", port: 47000}
  workers: {hosts: [127.0.0.1], count: 2, port: 47111}
)");
  EXPECT_EQ(c.servers, (std::vector<std::string>{"tcp://127.0.0.1:9100", "tcp://127.0.0.1:9101",
                                                 "tcp://127.0.0.1:9102", "tcp://[::1]:47000"}));
  EXPECT_EQ(c.workers,
            (std::vector<std::string>{"tcp://127.0.0.1:47111", "tcp://127.0.0.1:47112"}));
}

TEST(ClusterConfigHosts, WorkerLocalSizeIsTheDefaultForNodesWithoutProcesses) {
  const ClusterConfig c = Parse(R"(cluster:
  scheduler: a:9000
  servers: [a:9100]
  workers: [{host: b, processes: 3}, {host: c}]
worker:
  local_size: 2
)");
  EXPECT_EQ(c.ProcessesOnNode(0), 3u);
  EXPECT_EQ(c.ProcessesOnNode(1), 2u);
  EXPECT_EQ(c.TotalProcesses(), 5u);
  EXPECT_TRUE(c.ProcessCountsDiffer());
}

TEST(ClusterConfigHosts, DifferentCountsJoinConfigAgreement) {
  const std::string head = "cluster:\n  scheduler: a:9000\n  servers: [a:9100]\n  workers: ";
  const ClusterConfig same = Parse(head + "{hosts: [b, c], processes: 2}\n");
  EXPECT_EQ(same.TotalProcesses(), 4u);
  EXPECT_FALSE(same.ProcessCountsDiffer());
  EXPECT_EQ(ConfigFields(same).size(), 4u);  // equal counts keep the hash of the address form
  EXPECT_EQ(ConfigHash(ConfigFields(same)),
            ConfigHash(ConfigFields(Parse(head + "[b:9200, c:9200]\n"))));

  const ClusterConfig differ = Parse(head + "[{host: b, processes: 2}, {host: c, gpus: 3}]\n");
  EXPECT_TRUE(differ.ProcessCountsDiffer());
  const std::vector<v1::ConfigField> f = ConfigFields(differ);
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[4].name(), "cluster.training_processes");
  EXPECT_EQ(f[4].value(), "2,3");
  const ClusterConfig other = Parse(head + "[{host: b, processes: 3}, {host: c, gpus: 2}]\n");
  EXPECT_EQ(DescribeConfigDifference(ConfigFields(other), f),
            "config differs from the scheduler's: cluster.training_processes is '3,2' here but "
            "'2,3' on the scheduler");
  const ClusterConfig equal = Parse(head + "[{host: b, processes: 3}, {host: c, gpus: 3}]\n");
  EXPECT_EQ(DescribeConfigDifference(ConfigFields(equal), f),
            "config differs from the scheduler's: cluster.training_processes is not set here but "
            "'2,3' on the scheduler");
  EXPECT_CONTAINS(DescribeClusterConfig(differ), "- tcp://c:9200: 3 processes, gpus [0, 1, 2]");
  EXPECT_CONTAINS(DescribeClusterConfig(differ), "- tcp://b:9200: 2 processes, cpu");
}

TEST(ClusterConfigHosts, ErrorsNameTheKeyAndLine) {
  const std::string head = "cluster:\n  scheduler: a:9000\n  servers: [a:9100]\n";
  EXPECT_CONTAINS(Error(head + "  workers:\n    - {host: b, processes: 4, gpus: 2}\n"),
                  "cluster.yaml:5: cluster.workers[0].processes: is 4 but gpus gives 2 "
                  "device(s); one GPU per training process");
  EXPECT_CONTAINS(Error(head + "  workers:\n    - {host: b, gpus: [0, 1, 0]}\n"),
                  "cluster.yaml:5: cluster.workers[0].gpus[2]: device 0 is listed twice");
  EXPECT_CONTAINS(Error(head + "  workers:\n    - {host: b, hosts: [c]}\n"),
                  "cluster.yaml:5: cluster.workers[0]: needs either host: NAME or hosts:");
  EXPECT_CONTAINS(Error(head + "  workers:\n    - {count: 2}\n"),
                  "cluster.workers[0]: needs either host: NAME or hosts:");
  EXPECT_CONTAINS(Error(head + "  workers:\n    - {host: b, gpu: 1}\n"),
                  "cluster.yaml:5: cluster.workers[0].gpu: unknown key; valid keys of "
                  "cluster.workers[0]: count, gpus, host, hosts, port, processes");
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: a:9000\n  servers: {hosts: [a], processes: 2}\n"
                        "  workers: [b:1]\n"),
                  "cluster.yaml:3: cluster.servers.processes: unknown key; valid keys of "
                  "cluster.servers: count, host, hosts, port");
  EXPECT_CONTAINS(Error(head + "  workers: {hosts: [b], processes: 0}\n"),
                  "cluster.yaml:4: cluster.workers.processes: expected 1..1024 training "
                  "processes, got 0");
  EXPECT_CONTAINS(Error(head + "  workers: {hosts: [b], count: 3, port: 65534}\n"),
                  "cluster.workers.port: must be 1..65533 so the 3 ports from it fit, got 65534");
  EXPECT_CONTAINS(Error(head + "  workers: {hosts: [b, 'x y']}\n"),
                  "cluster.yaml:4: cluster.workers.hosts[1]: 'x y' is not a host name");
  EXPECT_CONTAINS(Error(head + "  workers: {hosts: []}\n"),
                  "cluster.workers.hosts: expected a list of host names");
  EXPECT_CONTAINS(Error(head + "  workers: 3\n"),
                  "cluster.yaml:4: cluster.workers: expected a list of addresses");
  // An explicit port meeting an address given before it.
  EXPECT_CONTAINS(Error("cluster:\n  scheduler: a:9000\n  servers: [a:9100]\n  workers:\n"
                        "    - {host: a, port: 9099, count: 2}\n"),
                  "cluster.yaml:5: cluster.workers[0].host (#2 of 2): address tcp://a:9100 is "
                  "already used by cluster.servers[0]");
  EXPECT_CONTAINS(Error("cluster:\n  transport: inproc\n  scheduler: s\n  servers: [s0]\n"
                        "  workers: [{host: b}]\n"),
                  "cluster.yaml:5: cluster.workers[0]: host entries need cluster.transport zmq "
                  "or ucx (the transport is inproc)");
}

TEST(ClusterConfigHosts, WorkerSocketNeedsRankWhenNodesShareAHost) {
  const std::string two =
      "cluster:\n  scheduler: a:9000\n  servers: [a:9100]\n"
      "  workers: {hosts: [b], count: 2}\nworker:\n";
  EXPECT_CONTAINS(Error(two + "  socket: /run/bitpush/w.sock\n"),
                  "cluster.yaml:6: worker.socket: workers 0 and 1 run on the same host, so their "
                  "bitpush-worker daemons would share '/run/bitpush/w.sock'; put {rank} in");
  const ClusterConfig c = Parse(two + "  socket: /run/bitpush/w{rank}-{rank}.sock\n");
  EXPECT_EQ(c.worker.SocketFor(1), "/run/bitpush/w1-1.sock");
  EXPECT_EQ(c.worker.SocketFor(12), "/run/bitpush/w12-12.sock");
  // One node per host: a fixed path is fine.
  EXPECT_EQ(Parse("cluster:\n  scheduler: a:9000\n  servers: [a:9100]\n"
                  "  workers: {hosts: [b, c]}\nworker:\n  socket: /run/w.sock\n")
                .worker.SocketFor(1),
            "/run/w.sock");
  // The length limit applies to the expanded path (107 bytes; the highest rank here is 1).
  EXPECT_EQ(Parse(two + "  socket: /" + std::string(105, 'x') + "{rank}\n").worker.SocketFor(1),
            "/" + std::string(105, 'x') + "1");
  EXPECT_CONTAINS(Error(two + "  socket: /" + std::string(106, 'x') + "{rank}\n"),
                  "worker.socket: expected a path of 1..107 bytes");
}

TEST(ClusterConfigHosts, ValidateChecksCodeBuiltWorkerNodes) {
  ClusterConfig c = Parse(kMinimal);
  ASSERT_EQ(c.worker_nodes.size(), 1u);  // the address form: one node, nothing set
  EXPECT_EQ(c.worker_nodes[0].processes, 0u);
  c.worker_nodes[0] = WorkerNode{3, {0, 1}};
  EXPECT_CONTAINS(ValidateClusterConfig(c).message(),
                  "cluster.workers[0].processes: is 3 but gpus gives 2 device(s)");
  c.worker_nodes[0] = WorkerNode{2, {1, 1}};
  EXPECT_CONTAINS(ValidateClusterConfig(c).message(),
                  "cluster.workers[0].gpus: lists a device twice");
  c.worker_nodes[0] = WorkerNode{2, {1, 0}};
  EXPECT_TRUE(ValidateClusterConfig(c).ok());
  c.worker_nodes.push_back(WorkerNode{});
  EXPECT_CONTAINS(ValidateClusterConfig(c).message(), "2 worker node settings for 1 workers");
}

// ---- cluster.transport ucx: the data plane at port + cluster.ucx.port_offset ----

TEST(ClusterConfigUcx, DataAddressesAndKnobs) {
  const ClusterConfig c = Parse(
      "cluster:\n  scheduler: a:9000\n  transport: ucx\n  servers: [a:9100, b:9100]\n"
      "  workers: {hosts: [c], count: 2}\n  ucx:\n    port_offset: 500\n    tls: 'sm,self'\n"
      "    net_devices: eth0\n");
  EXPECT_EQ(c.transport, "ucx");
  EXPECT_EQ(c.ControlBackend(), "zmq");
  EXPECT_EQ(c.ucx.port_offset, 500u);
  EXPECT_EQ(c.ucx.tls, "sm,self");
  EXPECT_EQ(c.ucx.net_devices, "eth0");
  // The YAML addresses stay tcp:// (the control plane).
  EXPECT_EQ(c.servers, (std::vector<std::string>{"tcp://a:9100", "tcp://b:9100"}));
  EXPECT_EQ(c.workers, (std::vector<std::string>{"tcp://c:9200", "tcp://c:9201"}));
  EXPECT_EQ(c.DataAddress(v1::ROLE_SERVER, 0), "ucx://a:9600");
  EXPECT_EQ(c.DataAddress(v1::ROLE_SERVER, 1), "ucx://b:9600");
  EXPECT_EQ(c.DataAddress(v1::ROLE_WORKER, 1), "ucx://c:9701");
  EXPECT_EQ(c.DataAddress(v1::ROLE_WORKER, 2), "");
  EXPECT_EQ(c.DataAddress(v1::ROLE_SCHEDULER, 0), "");
  const std::string described = DescribeClusterConfig(c);
  EXPECT_CONTAINS(described, "\n  transport: ucx\n");
  EXPECT_CONTAINS(described,
                  "\n  ucx:\n    port_offset: 500\n    tls: sm,self\n"
                  "    net_devices: eth0\n");
  EXPECT_CONTAINS(described,
                  "\n  data_plane:           # port + ucx.port_offset\n"
                  "    servers: [ucx://a:9600, ucx://b:9600]\n"
                  "    workers: [ucx://c:9700, ucx://c:9701]\n");
}

TEST(ClusterConfigUcx, DefaultsAndOtherTransports) {
  const ClusterConfig z = Parse(kMinimal);
  EXPECT_EQ(DescribeClusterConfig(z).find("data_plane"), std::string::npos);
  EXPECT_EQ(z.ucx.port_offset, 1000u);
  EXPECT_EQ(z.ucx.tls, "");
  EXPECT_EQ(z.ucx.net_devices, "");
  EXPECT_EQ(z.ControlBackend(), "zmq");
  EXPECT_EQ(z.DataAddress(v1::ROLE_SERVER, 0), "");  // zmq: the data plane uses the address
  const ClusterConfig u = Parse(
      "cluster:\n  scheduler: localhost:9000\n  transport: ucx\n  servers: [localhost:9101]\n"
      "  workers: ['[::1]:9201']\n");
  EXPECT_EQ(u.DataAddress(v1::ROLE_SERVER, 0), "ucx://localhost:10101");
  EXPECT_EQ(u.DataAddress(v1::ROLE_WORKER, 0), "ucx://[::1]:10201");
  EXPECT_EQ(u.ucx.tls, "");  // UCX's choice, or UCX_TLS
  const ClusterConfig i = Parse(
      "cluster:\n  transport: inproc\n  scheduler: s\n"
      "  servers: [s0]\n  workers: [w0]\n");
  EXPECT_EQ(i.ControlBackend(), "inproc");
  EXPECT_EQ(i.DataAddress(v1::ROLE_WORKER, 0), "");
}

TEST(ClusterConfigUcx, ErrorsNameTheKnobAndBothNodes) {
  const std::string head = "cluster:\n  scheduler: a:9000\n  transport: ucx\n";
  // A data port above 65535.
  EXPECT_EQ(Error(head + "  servers: [a:64600]\n  workers: [b:9200]\n"),
            "cluster.yaml: cluster.ucx.port_offset: server 0's data port 65600 (its port 64600 "
            "+ cluster.ucx.port_offset 1000) is above 65535; lower cluster.ucx.port_offset or "
            "the node's port");
  // Server 0's data port is worker 0's control port on the same host.
  EXPECT_EQ(Error(head + "  servers: [a:9100]\n  workers: [a:9200]\n  ucx: {port_offset: 100}\n"),
            "cluster.yaml:6: cluster.ucx.port_offset: server 0's data port 9200 (its port 9100 + "
            "cluster.ucx.port_offset 100) collides with worker 0 at tcp://a:9200 on the same "
            "host; pick a cluster.ucx.port_offset that keeps the data ports apart from the "
            "cluster's ports");
  // ... or the scheduler's.
  EXPECT_CONTAINS(Error(head + "  servers: [a:8000]\n  workers: [b:9200]\n"),
                  "server 0's data port 9000 (its port 8000 + cluster.ucx.port_offset 1000) "
                  "collides with the scheduler at tcp://a:9000 on the same host");
  // ... or another node's metrics port.
  EXPECT_CONTAINS(
      Error(head + "  servers: [a:9100]\n  workers: [a:9200]\nmetrics:\n  port: 10099\n"),
      "cluster.ucx.port_offset: server 0's data port 10100 (its port 9100 + "
      "cluster.ucx.port_offset 1000) collides with server 0's metrics port on the same host");
  // On other hosts the same port is fine.
  EXPECT_EQ(
      Parse(head + "  servers: [a:9100]\n  workers: [b:10100]\n").DataAddress(v1::ROLE_SERVER, 0),
      "ucx://a:10100");
  // Addresses without a port have no data address.
  EXPECT_CONTAINS(Error(head + "  servers: [a:9100]\n  workers: ['ipc:///tmp/w0.sock']\n"),
                  "cluster.transport: ucx needs a tcp:// address (host:port) for every server "
                  "and worker: worker 0's data plane listens on its host at its port + "
                  "cluster.ucx.port_offset, but its address is ipc:///tmp/w0.sock");
  EXPECT_CONTAINS(Error(head + "  servers: [a:9100]\n  workers: [b:9200]\n  ucx: {port: 1}\n"),
                  "cluster.yaml:6: cluster.ucx.port: unknown key; valid keys of cluster.ucx: "
                  "net_devices, port_offset, tls");
  EXPECT_CONTAINS(Error(head + "  servers: [a:9100]\n  workers: [b:9200]\n  ucx: tcp\n"),
                  "cluster.yaml:6: cluster.ucx: expected a mapping");
  EXPECT_CONTAINS(
      Error(head + "  servers: [a:9100]\n  workers: [b:9200]\n  ucx: {port_offset: 0}\n"),
      "cluster.ucx.port_offset: must be 1..65534");
  // Curve keys authenticate the ucx data plane too (pushpull_process_test runs such a cluster).
  EXPECT_EQ(Parse(head + "  servers: [a:9100]\n  workers: [b:9200]\nsecurity:\n  mode: curve\n")
                .security.mode,
            SecurityMode::kCurve);
}

TEST(ClusterConfigUcx, ValidateChecksCodeBuiltConfigs) {
  ClusterConfig c = Parse(kMinimal);
  c.transport = "ucx";
  EXPECT_TRUE(ValidateClusterConfig(c).ok());
  c.ucx.port_offset = 65535 - 9101 + 1;
  EXPECT_CONTAINS(ValidateClusterConfig(c).message(),
                  "cluster.ucx.port_offset: server 0's data port 65536");
  c.ucx.port_offset = 9201 - 9101;
  EXPECT_CONTAINS(ValidateClusterConfig(c).message(),
                  "server 0's data port 9201 (its port 9101 + cluster.ucx.port_offset 100) "
                  "collides with worker 0 at tcp://localhost:9201");
}

}  // namespace
}  // namespace bitpush::config
