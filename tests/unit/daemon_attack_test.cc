// The real bitpush-worker daemon against other users and against its own crashed predecessor
// (docs/local-ipc.md, "Socket directory and peer credentials"):
//  - a daemon SIGKILLed while starting leaves its socket in the private default directory
//    (XDG_RUNTIME_DIR/bitpush here); the next daemon replaces it and is the one clients reach;
//  - connections of another user (forked children that setuid() to nobody) are refused, counted
//    in bitpush_worker_local_connections_refused_total and logged once per interval, and the
//    daemon goes on serving.
// Real processes: bitpush-scheduler, bitpush-server, bitpush-worker. The refusal test needs root
// (to become nobody) and skips, naming why, without it.
#include <fmt/format.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness/child_process.h"
#include "tests/harness/http_get.h"
#include "tests/harness/test_cluster.h"
#include "worker/ipc/channel.h"
#include "worker/ipc/socket_dir.h"

#ifndef BITPUSH_DAEMON_BIN
#error "BITPUSH_DAEMON_BIN must be defined (tests/CMakeLists.txt)"
#endif

namespace bitpush::testing {
namespace {

using std::chrono::milliseconds;

constexpr uid_t kNobody = 65534;

bool PathExists(const std::string& p) {
  struct stat st {};
  return lstat(p.c_str(), &st) == 0;
}

int PortOf(const std::string& url) {
  return std::atoi(url.c_str() + url.rfind(':') + 1);
}

// As nobody, connects to `path` and reports how it went through the exit code: 0 = the daemon
// closed the connection without a word, 1 = connect failed, 2 = it stayed open or sent bytes.
int ConnectAsNobody(const std::string& path) {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(3);
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) _exit(1);
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[16];
    _exit(recv(fd, buf, sizeof(buf), 0) == 0 ? 0 : 2);
  }
  int status = 0;
  for (int i = 0; i < 500; ++i) {  // 5 s
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

class DaemonAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    if (const char* v = getenv("XDG_RUNTIME_DIR")) saved_xdg_ = v;
    if (const char* v = getenv("RUNTIME_DIRECTORY")) saved_runtime_ = v;
    unsetenv("RUNTIME_DIRECTORY");
    setenv("XDG_RUNTIME_DIR", dir_.path().c_str(), 1);  // children inherit it
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << DescribeChildren(children_, 30);
    children_.clear();
    unsetenv("XDG_RUNTIME_DIR");
    if (!saved_xdg_.empty()) setenv("XDG_RUNTIME_DIR", saved_xdg_.c_str(), 1);
    if (!saved_runtime_.empty()) setenv("RUNTIME_DIRECTORY", saved_runtime_.c_str(), 1);
  }

  // One server, one worker node on free tcp ports; `socket` "" = the default path. With
  // `metrics`, metrics.port on 3 free consecutive ports (scheduler, server 0, worker 0).
  void WriteConfig(const std::string& socket, bool metrics) {
    TestClusterOptions t;
    t.transport = TestTransport::kTcp;
    t.heartbeat_interval = milliseconds(100);
    t.heartbeat_timeout = milliseconds(2000);
    t.startup_timeout = milliseconds(20000);
    t.worker.local_size = 1;
    t.worker.socket = socket;
    config_ = TestClusterConfig(t);
    if (metrics) {
      std::set<int> taken = {PortOf(config_.scheduler_address), PortOf(config_.servers[0]),
                             PortOf(config_.workers[0])};
      int first = -1;
      for (int attempt = 0; attempt < 200 && first < 0; ++attempt) {
        const int p = FreeTcpPort();
        bool ok = p > 0 && p + 3 <= 32768;
        for (int q = p; ok && q < p + 3; ++q) ok = taken.count(q) == 0 && PortFree(q);
        if (ok) first = p;
      }
      ASSERT_GT(first, 0) << "no 3 free consecutive ports";
      config_.metrics.port = static_cast<uint32_t>(first);
    }
    path_ = dir_.path() + "/cluster.yaml";
    ASSERT_TRUE(WriteTestClusterYaml(config_, path_).ok());
  }

  static bool PortFree(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (fd >= 0) close(fd);
    return ok;
  }

  Child* Add(const std::string& label, const std::vector<std::string>& argv,
             const std::string& log) {
    children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log));
    EXPECT_TRUE(children_.back()->spawned()) << label;
    return children_.back().get();
  }

  Child* StartDaemon(const std::string& log) {
    return Add(log, {BITPUSH_DAEMON_BIN, "--config", path_, "--rank", "0", "--no-sweep"}, log);
  }

  TempDir dir_{"bp-dattack"};
  std::string saved_xdg_;
  std::string saved_runtime_;
  config::ClusterConfig config_;
  std::string path_;
  std::vector<std::unique_ptr<Child>> children_;
};

// No scheduler runs: each daemon binds its socket, then waits to register; the first is killed
// there, so its socket file stays behind.
TEST_F(DaemonAttack, DaemonAfterASigkilledDaemonReplacesItsStaleSocketAtTheDefaultPath) {
  WriteConfig("", false);
  const std::string socket = dir_.path() + "/bitpush/worker-0.sock";
  Child* first = StartDaemon("daemon-first.log");
  const ProcessClock::time_point deadline = ProcessClock::now() + milliseconds(10000);
  while (!PathExists(socket) && ProcessClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(PathExists(socket)) << first->output();
  struct stat st {};
  ASSERT_EQ(lstat((dir_.path() + "/bitpush").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);  // the private directory, made by the daemon
  first->Kill();
  ASSERT_TRUE(PathExists(socket));  // nothing ran in the killed daemon
  Child* second = StartDaemon("daemon-second.log");
  // A client (this process: the same user) reaches the second daemon, whatever it meets first.
  auto ch = worker::ipc::Channel::Connect(socket, milliseconds(10000));
  ASSERT_TRUE(ch.ok()) << ch.status().ToString() << "\n" << second->output();
  EXPECT_EQ((*ch)->peer().pid, second->pid());
  EXPECT_TRUE(WaitForOutput(*second, "replacing the stale socket " + socket, milliseconds(2000)))
      << second->output();
}

TEST_F(DaemonAttack, ClientsOfAnotherUserAreRefusedCountedAndLoggedOncePerInterval) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (uid " << kNobody << ")";
  const std::string socket = dir_.path() + "/node0.sock";
  WriteConfig(socket, true);
  Add("scheduler", {BITPUSH_SCHEDULER_BIN, "--config", path_}, "scheduler.log");
  Add("server 0", {BITPUSH_SERVER_BIN, "--config", path_, "--rank", "0"}, "server0.log");
  Child* daemon = StartDaemon("daemon.log");
  ASSERT_TRUE(WaitForOutput(*daemon, "listening at " + socket, milliseconds(20000)))
      << daemon->output();
  // The socket's mode 0600 is the first wall: nobody cannot even connect.
  EXPECT_EQ(ConnectAsNobody(socket), 1);
  // Past it, the credential check.
  ASSERT_EQ(chmod(socket.c_str(), 0666), 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ConnectAsNobody(socket), 0) << "attempt " << i;
  const int port = static_cast<int>(config_.MetricsPort(v1::ROLE_WORKER, 0));
  double refused = -1;
  for (int i = 0; i < 100 && refused != 3; ++i) {  // the poll loop counts as it accepts
    refused = SampleValue(HttpGet(port, "/metrics").body,
                          "bitpush_worker_local_connections_refused_total");
    if (refused != 3) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(refused, 3);
  const std::string out = daemon->output();
  const std::string line = "refused a connection at " + socket + " from pid";
  size_t count = 0;
  for (size_t at = out.find(line); at != std::string::npos; at = out.find(line, at + 1)) ++count;
  EXPECT_EQ(count, 1u) << out;  // three within kRefusalLogInterval: one message
  EXPECT_NE(out.find("it runs as uid 65534 (nobody), this daemon as uid 0"), std::string::npos)
      << out;
  // It still serves its own user.
  auto own = worker::ipc::Channel::Connect(socket, milliseconds(2000));
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_EQ((*own)->peer().pid, daemon->pid());
  EXPECT_FALSE(daemon->Poll()) << daemon->output();
}

}  // namespace
}  // namespace bitpush::testing
