// The daemon's Unix socket against other users of the machine (docs/local-ipc.md, "Socket
// directory and peer credentials"): another uid (a forked child that setuid()s to nobody)
// pre-creates the default socket directory or listens at a configured path before the daemon,
// connects to the daemon, or leaves a socket file behind; and the directory rules themselves.
// The attacks need root (to become nobody) and skip, naming why, without it.
#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
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
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "tests/harness/child_process.h"
#include "tests/harness/forked_child.h"
#include "worker/daemon_client.h"
#include "worker/ipc/channel.h"
#include "worker/ipc/socket_dir.h"

namespace bitpush::worker::ipc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uid_t kNobody = 65534;

#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "'" << (part) << "' not in: " << (text)

using Forked = bitpush::testing::ForkedChild;

sockaddr_un Address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  return a;
}

// A raw SEQPACKET listener at `path` open to everyone (what an attacker would bind); -1 on error.
int RawListen(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  const sockaddr_un a = Address(path);
  if (fd < 0 || bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      chmod(path.c_str(), 0777) != 0 || listen(fd, 8) != 0) {
    return -1;
  }
  return fd;
}

// Waits at most `ms` for `fd` to be readable.
bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) > 0;
}

std::string ModeOf(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return "missing";
  return fmt::format("{:04o}", st.st_mode & 07777);
}

// Every test runs with its own default socket directory: XDG_RUNTIME_DIR = <base>/run, where
// <base>/run is world-writable and sticky like /tmp (so another user can try to take
// <base>/run/bitpush first), and RUNTIME_DIRECTORY unset. <base>/shared (1777) holds the
// configured paths.
class LocalIpcAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(base_.ok());
    ASSERT_EQ(chmod(base_.path().c_str(), 0755), 0);
    for (const std::string& d : {Run(), Shared()}) {
      ASSERT_EQ(mkdir(d.c_str(), 0700), 0) << d;
      ASSERT_EQ(chmod(d.c_str(), 01777), 0) << d;
    }
    for (const char* name : {"RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"}) {
      if (const char* v = getenv(name)) saved_.emplace_back(name, v);
    }
    unsetenv("RUNTIME_DIRECTORY");
    setenv("XDG_RUNTIME_DIR", Run().c_str(), 1);
  }
  void TearDown() override {
    unsetenv("XDG_RUNTIME_DIR");
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  void NeedRoot() {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (uid " << kNobody << ")";
  }

  std::string Run() const { return base_.path() + "/run"; }
  std::string Shared() const { return base_.path() + "/shared"; }
  std::string PrivateDir() const { return Run() + "/bitpush"; }

  bitpush::testing::TempDir base_{"bp-attack"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(LocalIpcAttack, TheDefaultPathIsInThePrivateDirectoryFromTheEnvironment) {
  EXPECT_EQ(DefaultSocketDirectory(), PrivateDir());
  EXPECT_EQ(worker::DefaultDaemonSocketPath(3), PrivateDir() + "/worker-3.sock");
  setenv("RUNTIME_DIRECTORY", "/run/bitpush:/run/other", 1);  // systemd's list: the first
  EXPECT_EQ(worker::DefaultDaemonSocketPath(0), "/run/bitpush/worker-0.sock");
  unsetenv("RUNTIME_DIRECTORY");
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(worker::DefaultDaemonSocketPath(1),
            fmt::format("/tmp/bitpush-{}/worker-1.sock", geteuid()));
  // The daemon and its clients resolve the same path (DaemonSocketPath is the one place).
  config::ClusterConfig c;
  EXPECT_EQ(worker::DaemonSocketPath("", c, 1), worker::DefaultDaemonSocketPath(1));
  EXPECT_EQ(worker::DaemonSocketPath("/x/y.sock", c, 1), "/x/y.sock");
}

// Another user takes the default directory (and listens in it) before the daemon starts: the
// training process refuses the directory, naming its owner and mode, and never connects.
TEST_F(LocalIpcAttack, ClientRefusesADefaultDirectoryAnotherUserCreatedAndSendsNothing) {
  NeedRoot();
  const std::string dir = PrivateDir();
  const std::string path = worker::DefaultDaemonSocketPath(0);
  Forked attacker(kNobody, [&](Forked& self) -> int {
    if (mkdir(dir.c_str(), 0777) != 0 || chmod(dir.c_str(), 0777) != 0) return 1;
    const int fd = RawListen(path);
    if (fd < 0) return 2;
    self.Tell("listening");
    self.Tell(Readable(fd, 800) ? "a connection arrived" : "no connection");
    return 0;
  });
  ASSERT_EQ(attacker.NextLine(), "listening");
  worker::DaemonClientOptions o;
  o.socket_path = path;
  o.startup_timeout = milliseconds(2000);
  auto client = worker::DaemonClient::Connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition) << client.status().ToString();
  EXPECT_CONTAINS(client.status().message(), "refusing the private socket directory " + dir);
  EXPECT_CONTAINS(client.status().message(), "owned by uid 65534");
  EXPECT_CONTAINS(client.status().message(), "mode 0777");
  EXPECT_EQ(attacker.NextLine(), "no connection");
  // The daemon refuses it alike.
  auto listener = Listener::Listen(path);
  ASSERT_FALSE(listener.ok());
  EXPECT_CONTAINS(listener.status().message(), "owned by uid 65534");
}

// At a configured path in a shared sticky directory (like /tmp) another user listens first:
// the training process sees the listener's uid (SO_PEERCRED) and refuses it before its Hello.
TEST_F(LocalIpcAttack, ClientRefusesAListenerOfAnotherUserBeforeSendingHello) {
  NeedRoot();
  const std::string path = Shared() + "/worker-0.sock";
  Forked attacker(kNobody, [&](Forked& self) -> int {
    const int fd = RawListen(path);
    if (fd < 0) return 2;
    self.Tell("listening");
    if (!Readable(fd, 3000)) {
      self.Tell("no connection");
      return 0;
    }
    const int c = accept(fd, nullptr, nullptr);
    char buf[256];
    // The client closes at once (end of stream, 0 bytes) or sends its Hello.
    const ssize_t n = Readable(c, 1500) ? recv(c, buf, sizeof(buf), 0) : -1;
    self.Tell(n > 0 ? fmt::format("received {} bytes", n) : "received nothing");
    return 0;
  });
  ASSERT_EQ(attacker.NextLine(), "listening");
  worker::DaemonClientOptions o;
  o.socket_path = path;
  o.startup_timeout = milliseconds(2000);
  const Clock::time_point start = Clock::now();
  auto client = worker::DaemonClient::Connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_LT(Clock::now() - start, milliseconds(1000));  // at once, not after a Hello timeout
  EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition) << client.status().ToString();
  EXPECT_CONTAINS(client.status().message(), "refusing the bitpush-worker daemon at " + path);
  EXPECT_CONTAINS(client.status().message(),
                  fmt::format("(pid {}) runs as uid 65534", attacker.pid()));
  EXPECT_CONTAINS(client.status().message(), "this training process runs as uid 0");
  EXPECT_CONTAINS(client.status().message(), "nothing was sent");
  EXPECT_EQ(attacker.NextLine(), "received nothing");
}

// The socket's mode 0600 keeps other users out; past it (a socket opened up to everyone), the
// daemon's credential check refuses them, counts each refusal and keeps serving its own user.
TEST_F(LocalIpcAttack, DaemonRefusesAndCountsClientsOfAnotherUser) {
  NeedRoot();
  const std::string path = Shared() + "/daemon.sock";
  auto listener = Listener::Listen(path);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  EXPECT_EQ(ModeOf(path), "0600");
  auto connect_as_nobody = [&]() {
    return std::make_unique<Forked>(kNobody, [&](Forked& self) -> int {
      const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
      const sockaddr_un a = Address(path);
      if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
        self.Tell(std::string("connect: ") + std::strerror(errno));
        return 0;
      }
      self.Tell("connected");
      char buf[16];
      self.Tell(Readable(fd, 3000) && recv(fd, buf, sizeof(buf), 0) <= 0 ? "closed by the daemon"
                                                                         : "still open");
      return 0;
    });
  };
  {
    auto denied = connect_as_nobody();
    EXPECT_EQ(denied->NextLine(), std::string("connect: ") + std::strerror(EACCES));
  }
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  for (int i = 1; i <= 2; ++i) {
    auto intruder = connect_as_nobody();
    ASSERT_EQ(intruder->NextLine(), "connected");
    auto ch = (*listener)->Accept(milliseconds(2000));
    ASSERT_FALSE(ch.ok());
    EXPECT_EQ(ch.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_CONTAINS(ch.status().message(), "refused a connection at " + path);
    EXPECT_CONTAINS(ch.status().message(),
                    fmt::format("from pid {}: it runs as uid 65534", intruder->pid()));
    EXPECT_CONTAINS(ch.status().message(), "this daemon as uid 0");
    EXPECT_EQ(intruder->NextLine(), "closed by the daemon");
    EXPECT_EQ((*listener)->refused(), static_cast<uint64_t>(i));
  }
  // Its own user still gets in, and is not counted.
  auto own = Channel::Connect(path, milliseconds(1000));
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  auto accepted = (*listener)->Accept(milliseconds(1000));
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  EXPECT_EQ((*listener)->refused(), 2u);
}

// A socket file another user left in a shared directory (nobody listening) is not the daemon's
// to remove: it refuses to start there, naming the owner, and the file stays.
TEST_F(LocalIpcAttack, DaemonLeavesAStaleSocketOfAnotherUserAlone) {
  NeedRoot();
  const std::string path = Shared() + "/worker-0.sock";
  Forked other(kNobody, [&](Forked&) -> int {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    const sockaddr_un a = Address(path);
    return bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0 ? 0 : 1;
  });
  ASSERT_EQ(other.WaitExitCode(), 0);
  auto listener = Listener::Listen(path);
  ASSERT_FALSE(listener.ok());
  EXPECT_EQ(listener.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(listener.status().message(),
                  "cannot listen at " + path + ": a stale socket file of uid 65534");
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kNobody);
}

// A daemon of this user killed with SIGKILL leaves its socket in the private directory; the
// next Listen replaces it, and a client waiting meanwhile gets the new daemon.
TEST_F(LocalIpcAttack, AStaleSocketOfOurOwnInThePrivateDirectoryIsReplaced) {
  const std::string path = worker::DefaultDaemonSocketPath(0);
  Forked crashed(std::nullopt, [&](Forked& self) -> int {
    auto l = Listener::Listen(path);
    self.Tell(l.ok() ? "listening" : l.status().ToString());
    for (;;) pause();
  });
  ASSERT_EQ(crashed.NextLine(), "listening");
  EXPECT_EQ(ModeOf(PrivateDir()), "0700");  // created by Listen
  kill(crashed.pid(), SIGKILL);
  crashed.WaitExitCode();
  ASSERT_NE(ModeOf(path), "missing");  // left behind
  auto again = Listener::Listen(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto client = Channel::Connect(path, milliseconds(1000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->peer().pid, getpid());
  // A live daemon there is still refused.
  auto second = Listener::Listen(path);
  ASSERT_FALSE(second.ok());
  EXPECT_CONTAINS(second.status().message(),
                  fmt::format("another process is listening there (pid {}", getpid()));
}

// The private directory's rules: created 0700; refused when group or others may enter, when
// it is a symlink, or when another user owns it — by the daemon and by its clients alike.
TEST_F(LocalIpcAttack, PrivateDirectoryMustBeOursAndClosedToOthers) {
  const std::string dir = PrivateDir();
  const std::string path = worker::DefaultDaemonSocketPath(0);
  // Missing: a client waits for it (the daemon makes it), bounded, naming it.
  auto waiting = Channel::Connect(path, milliseconds(100));
  ASSERT_FALSE(waiting.ok());
  EXPECT_EQ(waiting.status().code(), StatusCode::kTimeout);
  EXPECT_CONTAINS(waiting.status().message(), "the socket directory " + dir + " does not exist");
  {
    auto l = Listener::Listen(path);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(ModeOf(dir), "0700");
  }
  ASSERT_EQ(chmod(dir.c_str(), 0750), 0);
  for (const Status& s :
       {Listener::Listen(path).status(), Channel::Connect(path, milliseconds(100)).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_CONTAINS(s.message(), "refusing the private socket directory " + dir);
    EXPECT_CONTAINS(s.message(), fmt::format("owner uid {}", geteuid()));
    EXPECT_CONTAINS(s.message(), "mode 0750 lets group or others in");
  }
  // A symlink to a directory of ours is refused too: the link's target could change.
  ASSERT_EQ(rmdir(dir.c_str()), 0);
  const std::string real = base_.path() + "/real";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(symlink(real.c_str(), dir.c_str()), 0);
  for (const Status& s :
       {Listener::Listen(path).status(), Channel::Connect(path, milliseconds(100)).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_CONTAINS(s.message(), "it is a symbolic link");
  }
  if (geteuid() == 0) {
    ASSERT_EQ(unlink(dir.c_str()), 0);
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(chown(dir.c_str(), kNobody, kNobody), 0);
    const Status s = Listener::Listen(path).status();
    EXPECT_CONTAINS(s.message(), "it is owned by uid 65534");
    EXPECT_CONTAINS(s.message(), "mode 0700");
    EXPECT_CONTAINS(s.message(), "not by this process's uid 0");
  }
}

// A configured path's directory: fine when only its owner (this user or root) may write it, or
// when it is sticky like /tmp; refused when others may write it without the sticky bit, or when
// another user owns it.
TEST_F(LocalIpcAttack, ConfiguredDirectoryMustNotLetOthersReplaceTheSocket) {
  const std::string open_dir = base_.path() + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  for (const Status& s : {Listener::Listen(open_dir + "/w.sock").status(),
                          Channel::Connect(open_dir + "/w.sock", milliseconds(100)).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_CONTAINS(s.message(), "refusing the socket directory " + open_dir);
    EXPECT_CONTAINS(s.message(), "mode 0777 lets group or others write it and it is not sticky");
  }
  auto sticky = Listener::Listen(Shared() + "/w.sock");
  EXPECT_TRUE(sticky.ok()) << sticky.status().ToString();
  auto own = Listener::Listen(base_.path() + "/w.sock");  // 0755, ours
  EXPECT_TRUE(own.ok()) << own.status().ToString();
  if (geteuid() == 0) {
    const std::string theirs = base_.path() + "/theirs";
    ASSERT_EQ(mkdir(theirs.c_str(), 0755), 0);
    ASSERT_EQ(chown(theirs.c_str(), kNobody, kNobody), 0);
    const Status s = Listener::Listen(theirs + "/w.sock").status();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_CONTAINS(s.message(), "owned by uid 65534");
    EXPECT_CONTAINS(s.message(), "could replace the socket");
  }
  const Status missing = Listener::Listen(base_.path() + "/no/such/w.sock").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  EXPECT_CONTAINS(missing.message(), base_.path() + "/no/such does not exist");
}

}  // namespace
}  // namespace bitpush::worker::ipc
