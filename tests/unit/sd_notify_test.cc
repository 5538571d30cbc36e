// Tests of common/sd_notify.h: the datagrams a Type=notify unit's systemd would receive, on a
// socket bound in a temporary directory (and in the abstract namespace), and the no-op and
// error cases.
#include "common/sd_notify.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace bitpush {
namespace {

// A bound SOCK_DGRAM socket standing in for systemd's notification socket; sets
// $NOTIFY_SOCKET to its name and restores the previous value on destruction.
class FakeNotifySocket {
 public:
  // `name` is "@abstract" or empty (a path in a fresh temporary directory).
  explicit FakeNotifySocket(const std::string& abstract_name = "") {
    const char* old = getenv("NOTIFY_SOCKET");
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    socklen_t len = 0;
    if (abstract_name.empty()) {
      char tmpl[] = "/tmp/bitpush-sd-notify-XXXXXX";
      EXPECT_NE(mkdtemp(tmpl), nullptr);
      dir_ = tmpl;
      name_ = dir_ + "/notify";
      std::memcpy(addr.sun_path, name_.c_str(), name_.size() + 1);
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size() + 1);
    } else {
      name_ = abstract_name;
      std::memcpy(addr.sun_path, name_.data(), name_.size());
      addr.sun_path[0] = '\0';
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    }
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
    setenv("NOTIFY_SOCKET", name_.c_str(), 1);
  }
  ~FakeNotifySocket() {
    if (had_old_) {
      setenv("NOTIFY_SOCKET", old_.c_str(), 1);
    } else {
      unsetenv("NOTIFY_SOCKET");
    }
    close(fd_);
    if (!dir_.empty()) {
      unlink(name_.c_str());
      rmdir(dir_.c_str());
    }
  }

  // The next datagram, or "<none>" when none arrives within `timeout_ms`.
  std::string Receive(int timeout_ms = 2000) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return "<none>";
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n < 0 ? "<error>" : std::string(buf, static_cast<size_t>(n));
  }

  const std::string& name() const { return name_; }

 private:
  int fd_ = -1;
  std::string dir_;
  std::string name_;
  bool had_old_ = false;
  std::string old_;
};

TEST(SdNotify, ReadyIsOneDatagramWithStatus) {
  FakeNotifySocket sock;
  ASSERT_TRUE(NotifyReady("listening at 127.0.0.1:9000").ok());
  EXPECT_EQ(sock.Receive(), "READY=1\nSTATUS=listening at 127.0.0.1:9000");
  EXPECT_EQ(sock.Receive(50), "<none>");
}

TEST(SdNotify, StatusNewlinesCannotAddKeys) {
  FakeNotifySocket sock;
  ASSERT_TRUE(NotifyReady("a\nMAINPID=1").ok());
  EXPECT_EQ(sock.Receive(), "READY=1\nSTATUS=a MAINPID=1");
}

TEST(SdNotify, Stopping) {
  FakeNotifySocket sock;
  ASSERT_TRUE(NotifyStopping().ok());
  EXPECT_EQ(sock.Receive(), "STOPPING=1");
}

TEST(SdNotify, AbstractNamespace) {
  FakeNotifySocket sock("@bitpush-sd-notify-test-" + std::to_string(getpid()));
  ASSERT_TRUE(NotifyReady("serving").ok());
  EXPECT_EQ(sock.Receive(), "READY=1\nSTATUS=serving");
}

TEST(SdNotify, UnsetIsANoOp) {
  {
    FakeNotifySocket sock;
    unsetenv("NOTIFY_SOCKET");
    EXPECT_TRUE(NotifyReady("x").ok());
    EXPECT_TRUE(NotifyStopping().ok());
    EXPECT_EQ(sock.Receive(50), "<none>");
    setenv("NOTIFY_SOCKET", "", 1);
    EXPECT_TRUE(NotifyReady("x").ok());
    EXPECT_EQ(sock.Receive(50), "<none>");
  }
}

TEST(SdNotify, MissingPathIsAnErrorNamingIt) {
  const std::string path = "/nonexistent-bitpush-dir/notify.sock";
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  const Status s = NotifyReady("x");
  unsetenv("NOTIFY_SOCKET");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find(path), std::string::npos) << s.ToString();
}

TEST(SdNotify, RelativeNameIsInvalid) {
  const Status s = SdNotifySend("relative.sock", "READY=1");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("relative.sock"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace bitpush
