// The test-cluster builder (tests/harness/test_cluster.h): the YAML it writes for process tests
// parses back to the config that threads-as-nodes tests use directly, for every transport and
// for non-default settings, so the two kinds of tests run the same cluster.
#include <gtest/gtest.h>

#include "config/cluster_config.h"
#include "tests/harness/child_process.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"

namespace bitpush::testing {
namespace {

using std::chrono::milliseconds;

void ExpectRoundTrip(const config::ClusterConfig& c) {
  const std::string yaml = TestClusterYaml(c);
  StatusOr<config::ClusterConfig> parsed = config::ParseClusterConfig(yaml, "round trip");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << yaml;
  const auto want = config::ConfigFields(c);
  const auto got = config::ConfigFields(*parsed);
  EXPECT_EQ(config::DescribeConfigDifference(got, want), "") << yaml;
  EXPECT_EQ(config::ConfigHash(got), config::ConfigHash(want)) << yaml;
  // What the hash leaves out but a node reads.
  EXPECT_EQ(parsed->scheduler_address, c.scheduler_address);
  EXPECT_EQ(parsed->token, c.token);
  EXPECT_EQ(parsed->startup_timeout, c.startup_timeout);
  EXPECT_EQ(parsed->server.engine_threads, c.server.engine_threads);
  EXPECT_EQ(parsed->server.numa, c.server.numa);
  EXPECT_EQ(parsed->worker.compress_threads, c.worker.compress_threads);
  EXPECT_EQ(parsed->worker.reduce_threads, c.worker.reduce_threads);
  EXPECT_EQ(parsed->worker.numa, c.worker.numa);
  EXPECT_EQ(parsed->worker.credit_bytes, c.worker.credit_bytes);
  EXPECT_EQ(parsed->worker.op_timeout, c.worker.op_timeout);
  EXPECT_EQ(parsed->worker.local_size, c.worker.local_size);
}

TEST(TestClusterYaml, DefaultsRoundTripOverTcp) {
  TestClusterOptions o;
  o.servers = 2;
  o.workers = 3;
  o.transport = TestTransport::kTcp;
  const config::ClusterConfig c = TestClusterConfig(o);
  ASSERT_EQ(c.servers.size(), 2u);
  ASSERT_EQ(c.workers.size(), 3u);
  for (const std::string& a : c.servers) EXPECT_EQ(a.rfind("tcp://127.0.0.1:", 0), 0u) << a;
  ExpectRoundTrip(c);
}

TEST(TestClusterYaml, EverySettingRoundTripsOverIpc) {
  TempDir dir;
  TestClusterOptions o;
  o.servers = 1;
  o.workers = 2;
  o.transport = TestTransport::kIpc;
  o.ipc_dir = dir.path();
  o.token = "it's a token";
  o.heartbeat_interval = milliseconds(70);
  o.heartbeat_timeout = milliseconds(900);
  o.startup_timeout = milliseconds(2500);
  o.compression.spec = "topk:ratio=0.25";
  o.compression.error_feedback = "worker";
  o.compression.min_compress_bytes = 4096;
  o.compression.partition_bytes = 32768;
  o.compression.overrides = {{"embed.*", "none"}, {"*.bias", "onebit"}};
  o.server.engine_threads = 3;
  o.server.numa = config::NumaMode::kOff;
  o.worker.compress_threads = 2;
  o.worker.reduce_threads = 1;
  o.worker.numa = config::NumaMode::kOn;
  o.worker.credit_bytes = 1 << 20;
  o.worker.op_timeout = milliseconds(12345);
  o.worker.local_size = 4;
  const config::ClusterConfig c = TestClusterConfig(o);
  EXPECT_EQ(c.workers[1], "ipc://" + dir.path() + "/w1.sock");
  ExpectRoundTrip(c);
}

}  // namespace
}  // namespace bitpush::testing
