// The knob registry: the typed knob specs and command-line flags of common/config/, the
// generated doc blocks, and the cluster YAML's knob table (config/cluster_knobs.h) with what
// follows from it: ValidateClusterConfig's checks of every section, --set / knob flags of the
// daemons' command lines, and the tables of docs/config.md.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/config/doc_blocks.h"
#include "common/config/flags.h"
#include "common/config/knob.h"
#include "config/cluster_config.h"
#include "config/cluster_knobs.h"
#include "config/daemon_command_line.h"
#include "tests/unit/test_util.h"

namespace bitpush {
namespace {

using config::ClusterConfig;
using config::FlagKind;
using config::FlagSpec;
using config::Knob;
using config::KnobSpec;
using config::KnobValue;

// ---- common/config: knob types ----

TEST(Knob, ParsesAndFormatsEachType) {
  const KnobSpec millis = Knob("a.ms").Millis(1, 60000);
  EXPECT_EQ(config::ParseKnobValue(millis, "250")->number, 250u);
  EXPECT_CONTAINS(config::ParseKnob(millis, "0").status().message(), "a.ms: ");
  EXPECT_FALSE(config::ParseKnobValue(millis, "x").ok());

  const KnobSpec seconds = Knob("a.s").Seconds(86400);
  EXPECT_EQ(config::ParseKnobValue(seconds, "2.5")->number, 2500u);
  EXPECT_EQ(config::FormatKnobValue(seconds, KnobValue::Number(2500)), "2.5");
  EXPECT_EQ(config::FormatKnobValue(seconds, KnobValue::Number(300000)), "300");
  EXPECT_CONTAINS(config::ParseKnobValue(seconds, "-1").status().message(),
                  "expected a number of seconds > 0 and <= 86400, got '-1'");

  const KnobSpec count = Knob("a.threads").AutoCount(256);
  EXPECT_EQ(config::ParseKnobValue(count, "auto")->number, 0u);
  EXPECT_EQ(config::FormatKnobValue(count, KnobValue::Number(0)), "auto");
  EXPECT_CONTAINS(config::ParseKnobValue(count, "0").status().message(),
                  "expected 'auto' or an integer from 1 to 256, got '0'");

  const KnobSpec mode = Knob("a.mode").Enum({"x", "y"}, "mode");
  EXPECT_EQ(config::ParseKnobValue(mode, "y")->text, "y");
  EXPECT_EQ(config::ParseKnobValue(mode, "z").status().message(), "unknown mode 'z'; valid: x, y");

  const KnobSpec flag = Knob("a.on").Bool();
  EXPECT_EQ(config::ParseKnobValue(flag, "true")->number, 1u);
  EXPECT_FALSE(config::ParseKnobValue(flag, "yes").ok());

  const KnobSpec text = Knob("a.name").String(1);
  EXPECT_EQ(config::ParseKnobValue(text, "").status().message(), "is empty");

  EXPECT_FALSE(config::ParseKnobValue(Knob("a.list").Structured("list"), "x").ok());
}

TEST(Knob, CheckNamesValuesSetInCode) {
  const KnobSpec mode = Knob("a.mode").Enum({"x", "y"});
  EXPECT_EQ(config::CheckKnobValue(mode, KnobValue::Text("x")), "");
  EXPECT_EQ(config::CheckKnobValue(mode, KnobValue::Text("q")), "unknown value 'q'; valid: x, y");
  const KnobSpec optional = Knob("a.size").Integer(1, 10, "things").Optional("auto");
  EXPECT_EQ(config::CheckKnobValue(optional, KnobValue::Number(0)), "");  // unset
  EXPECT_NE(config::CheckKnobValue(optional, KnobValue::Number(11)), "");
  EXPECT_EQ(config::DescribeKnobValue(optional, KnobValue::Number(0)), "auto");
  const KnobSpec secret = Knob("a.token").String(1).Optional("none").Secret();
  EXPECT_EQ(config::DescribeKnobValue(secret, KnobValue::Text("s3cret")), "<set>");
  EXPECT_EQ(config::DescribeKnobValue(secret, KnobValue::Text("")), "<none>");
}

// ---- common/config: command-line flags ----

std::vector<FlagSpec> Flags(const KnobSpec* knob) {
  return {{"--config", "PATH", "the file", FlagKind::kText, true},
          {"--rank", "N", "the rank", FlagKind::kCount, true},
          {"--quiet", "", "say less", FlagKind::kSwitch},
          {"--set", "K=V", "a knob", FlagKind::kRepeated},
          {"--threads", "T", "threads", FlagKind::kKnob, false, knob}};
}

TEST(Flags, ParsesEachKindAndNamesProblems) {
  const KnobSpec threads = Knob("w.threads").AutoCount(8);
  const std::vector<FlagSpec> specs = Flags(&threads);
  StatusOr<config::ParsedFlags> f =
      config::ParseFlags(specs, {"--config", "c.yaml", "--rank", "3", "--quiet", "--set", "a=1",
                                 "--set", "b=2", "--threads", "auto"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->text("--config"), "c.yaml");
  EXPECT_EQ(f->count("--rank", 99), 3u);
  EXPECT_TRUE(f->has("--quiet"));
  EXPECT_EQ(f->all("--set"), (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(f->knob("--threads")->number, 0u);

  EXPECT_EQ(config::ParseFlags(specs, {"--bogus"}).status().message(),
            "unknown argument '--bogus'");
  EXPECT_EQ(config::ParseFlags(specs, {"--config"}).status().message(), "--config needs a value");
  EXPECT_EQ(config::ParseFlags(specs, {"--config", "c", "--rank", "x"}).status().message(),
            "--rank needs a non-negative integer, got 'x'");
  EXPECT_EQ(config::ParseFlags(specs, {}).status().message(), "--config and --rank are required");
  EXPECT_CONTAINS(config::ParseFlags(specs, {"--config", "c", "--rank", "1", "--threads", "9"})
                      .status()
                      .message(),
                  "--threads");
  StatusOr<config::ParsedFlags> help = config::ParseFlags(specs, {"-h"});
  ASSERT_TRUE(help.ok()) << help.status().ToString();  // required flags are not checked then
  EXPECT_TRUE(help->help());
}

TEST(Flags, UsageListsEveryFlag) {
  const KnobSpec threads = Knob("w.threads").AutoCount(8);
  const std::string usage = config::UsageText("prog", Flags(&threads), "Does things.", "Bye.");
  EXPECT_EQ(usage.rfind("usage: prog --config PATH --rank N", 0), 0u) << usage;
  for (const char* f : {"--quiet", "--set K=V", "--threads T", "Does things.", "Bye."}) {
    EXPECT_CONTAINS(usage, f);
  }
}

// ---- common/config: generated doc blocks ----

TEST(DocBlocks, ReplacesBetweenMarkersAndKeepsTheRest) {
  const std::string doc = "intro\n" + config::BlockBeginMarker("t", "a", "note") + "\nold\n" +
                          config::BlockEndMarker("t", "a") + "\noutro\n";
  StatusOr<std::string> out = config::ReplaceGeneratedBlocks(doc, "t", {{"a", "new"}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "intro\n" + config::BlockBeginMarker("t", "a", "note") + "\nnew\n" +
                      config::BlockEndMarker("t", "a") + "\noutro\n");
  EXPECT_EQ(*config::ReplaceGeneratedBlocks(*out, "t", {{"a", "new"}}), *out);  // idempotent
  EXPECT_CONTAINS(
      config::ReplaceGeneratedBlocks(doc, "t", {{"a", "x"}, {"b", "y"}}).status().message(),
      "no block 't:b'");
  EXPECT_CONTAINS(config::ReplaceGeneratedBlocks(doc, "t", {}).status().message(),
                  "unknown generated block 't:a'");
}

// ---- the cluster YAML's knob table ----

ClusterConfig Valid() {
  ClusterConfig c;
  c.scheduler_address = "tcp://127.0.0.1:9000";
  c.servers = {"tcp://127.0.0.1:9101"};
  c.workers = {"tcp://127.0.0.1:9201"};
  return c;
}

TEST(ClusterKnobs, EveryKnobIsDeclaredOnceWithADocLine) {
  std::set<std::string> paths, flags, envs;
  for (const config::ClusterKnob& k : config::ClusterKnobs()) {
    EXPECT_TRUE(paths.insert(k.spec.path).second) << k.spec.path;
    EXPECT_FALSE(k.spec.doc.empty()) << k.spec.path;
    EXPECT_NE(std::find(config::ClusterSections().begin(), config::ClusterSections().end(),
                        k.spec.section()),
              config::ClusterSections().end())
        << k.spec.path;
    EXPECT_EQ(k.get == nullptr, k.spec.structured()) << k.spec.path;
    if (!k.spec.flag.name.empty()) {
      EXPECT_TRUE(flags.insert(k.spec.flag.name).second) << k.spec.flag.name;
    }
    if (!k.spec.env.empty()) {
      EXPECT_TRUE(envs.insert(k.spec.env).second) << k.spec.env;
    }
    if (k.get != nullptr) {
      // The default is the field's initial value, and it is a valid value.
      EXPECT_EQ(config::CheckKnobValue(k.spec, k.get(ClusterConfig{})), "") << k.spec.path;
    }
  }
  // The flag and environment variable names the programs and users already use.
  EXPECT_EQ(flags, (std::set<std::string>{"--reduce-threads", "--local-size", "--socket"}));
  EXPECT_EQ(envs, (std::set<std::string>{"BITPUSH_DAEMON_SOCKET", "BITPUSH_KEY_FILE",
                                         "BITPUSH_KEYS_DIR", "BITPUSH_TRACE_DIR"}));
  EXPECT_EQ(config::SectionKeys("server"), (std::vector<std::string>{"engine_threads", "numa"}));
}

// Every number in the YAML has an upper bound a real cluster stays far below, so a typo (1e12,
// a missing unit) is an error naming the key, the value and the bound, not a value the code
// then multiplies or allocates.
TEST(ClusterKnobs, EveryNumericKnobHasAnUpperBound) {
  std::vector<KnobSpec> specs;
  for (const config::ClusterKnob& k : config::ClusterKnobs()) {
    specs.push_back(k.spec);
    for (const KnobSpec& e : k.spec.entry_keys) specs.push_back(e);
  }
  size_t numeric = 0;
  for (const KnobSpec& s : specs) {
    switch (s.type) {
      case config::KnobType::kInteger:
      case config::KnobType::kBytes:
      case config::KnobType::kMillis:
      case config::KnobType::kSeconds:
      case config::KnobType::kAutoCount:
        ++numeric;
        // 2^40: a TiB, a count or a number of ms or s no cluster comes near.
        EXPECT_LE(s.max, uint64_t{1} << 40) << s.path << " has no sensible upper bound";
        break;
      default: break;
    }
  }
  EXPECT_GE(numeric, 15u);
  const config::ClusterKnob* partition = config::FindClusterKnob("compression.partition_bytes");
  ASSERT_NE(partition, nullptr);
  // A partition is one transport message: at most 1 GiB.
  EXPECT_EQ(partition->spec.max, uint64_t{1} << 30);
  StatusOr<KnobValue> too_big = config::ParseKnob(partition->spec, "1000000000000");
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().message(),
            "compression.partition_bytes: must be 1..1073741824 (bytes), got 1000000000000");
  EXPECT_TRUE(config::ParseKnob(partition->spec, "1073741824").ok());
}

TEST(ClusterKnobs, ValidateChecksTheServerAndWorkerSections) {
  ASSERT_TRUE(ValidateClusterConfig(Valid()).ok());
  struct Case {
    void (*break_it)(ClusterConfig*);
    const char* message;
  };
  const Case cases[] = {
      {[](ClusterConfig* c) { c->server.engine_threads = 300; },
       "server.engine_threads: expected 'auto' or an integer from 1 to 256, got '300'"},
      {[](ClusterConfig* c) { c->server.numa = static_cast<config::NumaMode>(7); },
       "server.numa: unknown value 'invalid'; valid: auto, on, off"},
      {[](ClusterConfig* c) { c->worker.compress_threads = 257; }, "worker.compress_threads: "},
      {[](ClusterConfig* c) { c->worker.reduce_threads = 1000; }, "worker.reduce_threads: "},
      {[](ClusterConfig* c) { c->worker.numa = static_cast<config::NumaMode>(9); },
       "worker.numa: unknown value 'invalid'; valid: auto, on, off"},
      {[](ClusterConfig* c) { c->worker.credit_bytes = 0; }, "worker.credit_bytes: "},
      {[](ClusterConfig* c) { c->worker.op_timeout = std::chrono::milliseconds(0); },
       "worker.op_timeout_s: "},
      {[](ClusterConfig* c) { c->worker.local_size = 2000; }, "worker.local_size: "},
      {[](ClusterConfig* c) { c->worker.socket = "/tmp/" + std::string(200, 's'); },
       "worker.socket: expected a path of 1..107 bytes"},
      {[](ClusterConfig* c) {
         c->workers.push_back("tcp://127.0.0.1:9202");
         c->worker.socket = "/tmp/same.sock";
       },
       "worker.socket: workers 0 and 1 run on the same host"},
  };
  for (const Case& k : cases) {
    ClusterConfig c = Valid();
    k.break_it(&c);
    const Status s = ValidateClusterConfig(c);
    EXPECT_FALSE(s.ok()) << k.message;
    EXPECT_CONTAINS(s.message(), k.message);
  }
}

TEST(ClusterKnobs, NumaIsAnEnumNamingItsValues) {
  const std::string yaml =
      "cluster:\n  scheduler: localhost:9000\n  servers: [localhost:9101]\n"
      "  workers: [localhost:9201]\nserver:\n  numa: on\nworker:\n  numa: off\n";
  StatusOr<ClusterConfig> c = config::ParseClusterConfig(yaml, "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.numa, config::NumaMode::kOn);
  EXPECT_EQ(c->worker.numa, config::NumaMode::kOff);
  EXPECT_EQ(config::NumaModeName(config::NumaMode::kAuto), "auto");
  EXPECT_CONTAINS(
      config::ParseClusterConfig(yaml + "  x: 1\n", "c.yaml").status().message(),
      "c.yaml:9: worker.x: unknown key; valid keys of worker: compress_threads, "
      "credit_bytes, local_size, numa, op_timeout_s, reduce_threads, server_window_bytes, socket");
}

TEST(ClusterKnobs, HostEntryBoundsComeFromTheTable) {
  const std::string head = "cluster:\n  scheduler: localhost:9000\n  servers: [localhost:9101]\n";
  EXPECT_CONTAINS(
      config::ParseClusterConfig(head + "  workers: {host: a, processes: 0}\n", "c.yaml")
          .status()
          .message(),
      "c.yaml:4: cluster.workers.processes: expected 1..1024 training processes, got 0");
  EXPECT_CONTAINS(
      config::ParseClusterConfig(head + "  workers: {host: a, count: 2000}\n", "c.yaml")
          .status()
          .message(),
      "c.yaml:4: cluster.workers.count: expected 1..1024 worker nodes per host, got 2000");
  EXPECT_EQ(config::FindHostEntryKey(/*servers=*/true, "processes"), nullptr);
  ClusterConfig c = Valid();
  c.worker_nodes.resize(1);
  c.worker_nodes[0].processes = 2000;
  EXPECT_CONTAINS(ValidateClusterConfig(c).message(),
                  "cluster.workers[0].processes: expected 1..1024 training processes, got 2000");
}

TEST(ClusterKnobs, SetClusterKnobParsesByTheKnobsType) {
  ClusterConfig c = Valid();
  ASSERT_TRUE(config::SetClusterKnob(&c, "worker.op_timeout_s", "2.5").ok());
  EXPECT_EQ(c.worker.op_timeout.count(), 2500);
  ASSERT_TRUE(config::SetClusterKnob(&c, "server.numa", "off").ok());
  EXPECT_EQ(c.server.numa, config::NumaMode::kOff);
  ASSERT_TRUE(config::SetClusterKnob(&c, "compression.spec", "onebit").ok());
  EXPECT_EQ(c.compression.spec, "onebit:scaled=true");  // canonical
  EXPECT_CONTAINS(config::SetClusterKnob(&c, "server.numa", "yes").message(),
                  "server.numa: unknown value 'yes'; valid: auto, on, off");
  EXPECT_CONTAINS(config::SetClusterKnob(&c, "worker.bogus", "1").message(),
                  "worker.bogus: unknown knob; valid: ");
  EXPECT_CONTAINS(config::SetClusterKnob(&c, "cluster.servers", "a:1").message(),
                  "cluster.servers: takes addresses or hosts, which only the YAML can give");
}

TEST(ClusterKnobs, DocBlocksHaveOneRowPerKnob) {
  const config::DocBlocks blocks = config::ClusterKnobDocBlocks();
  std::string all;
  for (const auto& [name, content] : blocks) all += content + "\n";
  for (const config::ClusterKnob& k : config::ClusterKnobs()) {
    EXPECT_CONTAINS(all, "| `" + k.spec.key() + "` |");
  }
  EXPECT_CONTAINS(all, "`--reduce-threads T` (`bitpush-worker`)");
  EXPECT_CONTAINS(all, "`BITPUSH_DAEMON_SOCKET`");
}

// ---- the daemons' command line ----

class DaemonCommandLineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "knobs-test-" + std::to_string(getpid()) + ".yaml";
    std::ofstream(path_) << "cluster:\n  scheduler: localhost:9000\n  servers: [localhost:9101]\n"
                            "  workers: [localhost:9201]\n";
  }
  void TearDown() override { unlink(path_.c_str()); }

  config::DaemonCommandLine Worker() {
    return config::DaemonCommandLine(
        {"bitpush-worker", "Runs.", "", {{"--rank", "N", "rank", FlagKind::kCount, true}}});
  }
  std::string path_;
};

TEST_F(DaemonCommandLineTest, KnobFlagsAndSetOverrideTheYaml) {
  config::DaemonCommandLine cli = Worker();
  ASSERT_EQ(cli.Parse({"--config", path_, "--rank", "0", "--reduce-threads", "3", "--set",
                       "worker.op_timeout_s=30", "--local-size", "4", "--socket", "/tmp/x.sock"}),
            config::DaemonCommandLine::Outcome::kRun)
      << cli.error();
  EXPECT_EQ(cli.config().worker.reduce_threads, 3u);  // sets the knob
  EXPECT_EQ(cli.config().worker.op_timeout.count(), 30000);
  // --local-size and --socket are the daemon's own values, not the YAML's.
  EXPECT_EQ(cli.config().worker.local_size, 0u);
  EXPECT_EQ(cli.knob_flag("worker.local_size")->number, 4u);
  EXPECT_EQ(cli.config().worker.socket, "");
  EXPECT_EQ(cli.knob_flag("worker.socket")->text, "/tmp/x.sock");
  for (const char* f : {"--reduce-threads T", "--local-size P", "--socket PATH", "--set"}) {
    EXPECT_CONTAINS(cli.Usage(), f);
  }
}

TEST_F(DaemonCommandLineTest, BadValuesAreUsageOrConfigErrors) {
  using Outcome = config::DaemonCommandLine::Outcome;
  config::DaemonCommandLine a = Worker();
  EXPECT_EQ(a.Parse({"--config", path_, "--rank", "0", "--reduce-threads", "0"}),
            Outcome::kUsageError);
  EXPECT_CONTAINS(a.error(), "--reduce-threads");
  config::DaemonCommandLine b = Worker();
  EXPECT_EQ(b.Parse({"--config", path_, "--rank", "0", "--set", "worker.numa=maybe"}),
            Outcome::kUsageError);
  EXPECT_CONTAINS(b.error(), "worker.numa: unknown value 'maybe'; valid: auto, on, off");
  config::DaemonCommandLine c = Worker();
  EXPECT_EQ(
      c.Parse({"--config", path_, "--rank", "0", "--set", "cluster.heartbeat_interval_ms=4000"}),
      Outcome::kConfigError);
  EXPECT_CONTAINS(c.error(), "cluster.heartbeat_timeout_ms: must be at least 2 x");
  EXPECT_CONTAINS(c.error(), "(after the command-line overrides)");
  config::DaemonCommandLine d = Worker();
  EXPECT_EQ(d.Parse({"--config", path_ + ".missing", "--rank", "0"}), Outcome::kConfigError);
  config::DaemonCommandLine e = Worker();
  EXPECT_EQ(e.Parse({"--rank", "0", "--help"}), Outcome::kHelp);
}

}  // namespace
}  // namespace bitpush
