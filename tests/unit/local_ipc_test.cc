// The local IPC layer (worker/ipc/): shared-memory segments and their clean-up on every exit
// path, the framed Unix-socket channel, and the local protocol helpers. Crashes, signals and
// peer deaths use real forked processes.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness/child_process.h"
#include "tests/harness/forked_child.h"
#include "worker/daemon/node_barrier.h"
#include "worker/daemon_client.h"
#include "worker/ipc/channel.h"
#include "worker/ipc/local_protocol.h"
#include "worker/ipc/shm_segment.h"

namespace bitpush::worker::ipc {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

bool ShmExists(const std::string& name) {  // name with the leading '/'
  return access(("/dev/shm" + name).c_str(), F_OK) == 0;
}

// /dev/shm entries created (by name) by process `pid` of this user.
std::vector<std::string> ShmEntriesOf(pid_t pid) {
  std::vector<std::string> out;
  const std::string prefix = fmt::format("bitpush-{}-{}-", getuid(), pid);
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) out.emplace_back(e->d_name);
  }
  closedir(d);
  return out;
}

using bitpush::testing::ForkedChild;

// ---------------------------------------------------------------- shared memory

TEST(ShmSegmentTest, CreateOpenShareBytesAndNameTheCreator) {
  auto created = ShmSegment::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ShmSegment& a = *created;
  EXPECT_TRUE(a.owner());
  EXPECT_EQ(a.size(), 4096u);
  auto creator = ParseSegmentName(a.name());
  ASSERT_TRUE(creator.ok()) << creator.status().ToString();
  EXPECT_EQ(creator->pid, getpid());
  EXPECT_EQ(creator->uid, getuid());
  for (int i = 0; i < 4096; ++i) EXPECT_EQ(static_cast<char*>(a.data())[i], 0);

  std::memset(a.data(), 0x5a, 4096);
  auto opened = ShmSegment::Open(a.name(), 4096);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_FALSE(opened->owner());
  EXPECT_EQ(static_cast<unsigned char*>(opened->data())[4095], 0x5a);
  static_cast<char*>(opened->data())[7] = 1;
  EXPECT_EQ(static_cast<char*>(a.data())[7], 1);
  EXPECT_TRUE(opened->CheckSize().ok());
}

TEST(ShmSegmentTest, OpenChecksTheSizeAndNamesTheSegment) {
  auto a = ShmSegment::Create(4096);
  ASSERT_TRUE(a.ok());
  auto bigger = ShmSegment::Open(a->name(), 8192);
  ASSERT_FALSE(bigger.ok());
  EXPECT_EQ(bigger.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bigger.status().message().find(a->name()), std::string::npos);
  EXPECT_NE(bigger.status().message().find("truncated"), std::string::npos);

  auto smaller = ShmSegment::Open(a->name(), 1024);
  ASSERT_FALSE(smaller.ok());
  EXPECT_EQ(smaller.status().code(), StatusCode::kInvalidArgument);

  auto missing = ShmSegment::Open("/bitpush-no-such-segment", 16);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/bitpush-no-such-segment"), std::string::npos);
}

TEST(ShmSegmentTest, TruncationAfterOpenIsDataLossNotSigbus) {
  auto a = ShmSegment::Create(8192);
  ASSERT_TRUE(a.ok());
  auto b = ShmSegment::Open(a->name(), 8192);
  ASSERT_TRUE(b.ok());
  // Another process (here: another descriptor) shrinks the segment under the mapping.
  int fd = shm_open(a->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  close(fd);
  Status s = b->CheckSize();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(a->name()), std::string::npos);
  EXPECT_NE(s.message().find("truncated"), std::string::npos);
}

TEST(ShmSegmentTest, BadNamesAndExistingNamesAreRefusedWithoutTouchingTheOther) {
  EXPECT_EQ(ShmSegment::Create("no-slash", 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmSegment::Create("/a/b", 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmSegment::Create(NextSegmentName(), 0).status().code(), StatusCode::kInvalidArgument);
  auto a = ShmSegment::Create(64);
  ASSERT_TRUE(a.ok());
  auto dup = ShmSegment::Create(a->name(), 64);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find(a->name()), std::string::npos);
  EXPECT_TRUE(ShmExists(a->name()));  // the failed Create did not unlink the existing one
}

TEST(ShmSegmentTest, DestructionAndMovesUnlinkExactlyOnce) {
  std::string name;
  {
    auto a = ShmSegment::Create(64);
    ASSERT_TRUE(a.ok());
    name = a->name();
    ShmSegment moved = std::move(*a);
    EXPECT_TRUE(ShmExists(name));
    ShmSegment assigned;
    assigned = std::move(moved);
    EXPECT_TRUE(ShmExists(name));
    bool listed = false;
    for (const std::string& n : LiveSegmentNames()) listed |= ("/" + n == name);
    EXPECT_TRUE(listed);
  }
  EXPECT_FALSE(ShmExists(name));
  for (const std::string& n : LiveSegmentNames()) EXPECT_NE("/" + n, name);
}

TEST(ShmSegmentTest, FailedCreateAfterShmOpenUnlinksTheName) {
  // A petabyte: shm_open and ftruncate succeed, reserving the pages fails.
  const std::string name = NextSegmentName();
  auto huge = ShmSegment::Create(name, size_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find(name), std::string::npos) << huge.status().ToString();
  EXPECT_FALSE(ShmExists(name));
  for (const std::string& n : LiveSegmentNames()) EXPECT_NE("/" + n, name);
}

TEST(ShmCleanupTest, NothingLeftAfterNormalExitEvenWithoutDestructors) {
  ForkedChild child(
      [](ForkedChild& self) {
        auto a = ShmSegment::Create(4096);
        // Never destroyed: exit() does not run heap destructors; the atexit handler unlinks.
        // (Held by a static pointer, so LeakSanitizer sees it as reachable.)
        static ShmSegment* never_destroyed = new ShmSegment(ShmSegment::Create(4096).value());
        ShmSegment* leaked = never_destroyed;
        self.Tell(a->name());
        self.Tell(leaked->name());
        return 0;
      },
      /*run_atexit=*/true);
  std::string first = child.NextLine();
  std::string second = child.NextLine();
  EXPECT_FALSE(first.empty());
  EXPECT_FALSE(second.empty());
  int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(ShmEntriesOf(child.pid()).empty());
}

TEST(ShmCleanupTest, NothingLeftAfterAnErrorPath) {
  ForkedChild child(
      [](ForkedChild& self) {
        auto work = [&]() -> Status {
          BP_ASSIGN_OR_RETURN(ShmSegment in, ShmSegment::Create(4096));
          BP_ASSIGN_OR_RETURN(ShmSegment out, ShmSegment::Create(4096));
          self.Tell(in.name());
          // Fails: the two segments unwind with the error.
          BP_ASSIGN_OR_RETURN(ShmSegment peer, ShmSegment::Open("/bitpush-missing-peer", 16));
          return Status::Ok();
        };
        Status s = work();
        return s.code() == StatusCode::kNotFound ? 3 : 1;
      },
      /*run_atexit=*/false);  // _exit: only the error path's unwinding cleans up
  EXPECT_FALSE(child.NextLine().empty());
  int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_TRUE(ShmEntriesOf(child.pid()).empty());
}

class ShmSignalTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmSignalTest, HandlerUnlinksEverythingAndTheChildStillDiesOfTheSignal) {
  const int sig = GetParam();
  ForkedChild child([](ForkedChild& self) -> int {
    if (!InstallShmCleanupSignalHandlers().ok()) return 1;
    std::vector<ShmSegment> held;
    for (int i = 0; i < 5; ++i) held.push_back(ShmSegment::Create(1 << 16).value());
    self.Tell("ready");
    for (;;) pause();
  });
  ASSERT_EQ(child.NextLine(), "ready");
  EXPECT_EQ(ShmEntriesOf(child.pid()).size(), 5u);
  ASSERT_EQ(kill(child.pid(), sig), 0);
  int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), sig);
  EXPECT_TRUE(ShmEntriesOf(child.pid()).empty());
}

INSTANTIATE_TEST_SUITE_P(TermAndInt, ShmSignalTest, ::testing::Values(SIGTERM, SIGINT));

TEST(ShmCleanupTest, SweepStaleRemovesOnlyTheSegmentsOfDeadProcesses) {
  auto mine = ShmSegment::Create(64);  // this process is alive: never swept
  ASSERT_TRUE(mine.ok());
  ForkedChild child([](ForkedChild& self) -> int {
    std::vector<ShmSegment> held;
    for (int i = 0; i < 3; ++i) held.push_back(ShmSegment::Create(4096).value());
    self.Tell("ready");
    for (;;) pause();
  });
  ASSERT_EQ(child.NextLine(), "ready");
  ASSERT_EQ(kill(child.pid(), SIGKILL), 0);
  int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  std::vector<std::string> left = ShmEntriesOf(child.pid());
  EXPECT_EQ(left.size(), 3u);  // SIGKILL runs no handler

  auto swept = SweepStaleSegments();
  ASSERT_TRUE(swept.ok()) << swept.status().ToString();
  for (const std::string& n : left) {
    EXPECT_NE(std::find(swept->begin(), swept->end(), n), swept->end()) << n;
  }
  EXPECT_TRUE(ShmEntriesOf(child.pid()).empty());
  EXPECT_TRUE(ShmExists(mine->name()));
}

TEST(ShmCleanupTest, AForkedChildNeverUnlinksItsParentsSegments) {
  auto mine = ShmSegment::Create(64);
  ASSERT_TRUE(mine.ok());
  ForkedChild child(
      [](ForkedChild&) {
        UnlinkAllSegments();
        return 0;
      },
      /*run_atexit=*/true);
  int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_TRUE(ShmExists(mine->name()));
}

TEST(ShmSegmentTest, ParseSegmentNameRejectsOtherForms) {
  EXPECT_TRUE(ParseSegmentName("/bitpush-1000-42-7").ok());
  EXPECT_TRUE(ParseSegmentName("bitpush-1000-42-7").ok());
  EXPECT_FALSE(ParseSegmentName("/bitpush-1000-42").ok());
  EXPECT_FALSE(ParseSegmentName("/bitpush-x-42-7").ok());
  EXPECT_FALSE(ParseSegmentName("/other-1000-42-7").ok());
  EXPECT_FALSE(ParseSegmentName("/bitpush-1000-0-7").ok());
  EXPECT_FALSE(ParseSegmentName("/bitpush-1000-42-7-8").ok());
  auto c = ParseSegmentName("/bp-test-5-6-0", "bp-test");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->uid, 5u);
  EXPECT_EQ(c->pid, 6);
}

// ---------------------------------------------------------------- channel

class ChannelTest : public ::testing::Test {
 protected:
  std::string SocketPath() const { return dir_.path() + "/worker.sock"; }
  // A DaemonClient connected to a fake daemon at SocketPath() that answered its Hello as local
  // protocol 1.`minor`; *daemon_side is that daemon's end of the connection.
  StatusOr<std::unique_ptr<DaemonClient>> ConnectToOlderDaemon(
      uint32_t minor, std::unique_ptr<Channel>* daemon_side) {
    BP_ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener, Listener::Listen(SocketPath()));
    std::thread fake([&] {
      auto ch = listener->Accept(milliseconds(5000));
      if (!ch.ok()) return;
      auto hello = ReceiveLocalMessage(**ch, milliseconds(5000));
      if (!hello.ok() || !hello->has_hello()) return;
      v1::LocalMessage m;
      v1::LocalHelloReply* r = m.mutable_hello_reply();
      r->mutable_version()->set_major(kLocalProtocolMajor);
      r->mutable_version()->set_minor(minor);
      r->set_num_nodes(1);
      r->set_op_timeout_ms(1000);
      (void)SendLocalMessage(**ch, m);
      *daemon_side = std::move(ch).value();
    });
    DaemonClientOptions o;
    o.socket_path = SocketPath();
    o.startup_timeout = milliseconds(5000);
    StatusOr<std::unique_ptr<DaemonClient>> client = DaemonClient::Connect(o);
    fake.join();
    return client;
  }
  bitpush::testing::TempDir dir_{"bp-ipc"};
};

TEST_F(ChannelTest, RoundTripBothWaysWithPeerCredentials) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  auto client = Channel::Connect(SocketPath(), milliseconds(1000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto server = (*listener)->Accept(milliseconds(1000));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->peer().pid, getpid());
  EXPECT_EQ((*client)->peer().pid, getpid());
  EXPECT_EQ((*server)->peer().uid, getuid());

  ASSERT_TRUE((*client)->Send("hello").ok());
  ASSERT_TRUE((*client)->Send("").ok());
  const std::string big(ChannelOptions{}.max_frame_bytes, 'x');
  ASSERT_TRUE((*client)->Send(big).ok());
  auto r1 = (*server)->Receive(milliseconds(1000));
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(*r1, "hello");
  auto r2 = (*server)->Receive(milliseconds(1000));
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(*r2, "");
  auto r3 = (*server)->Receive(milliseconds(1000));
  ASSERT_TRUE(r3.ok()) << r3.status().ToString();
  EXPECT_EQ(*r3, big);
  ASSERT_TRUE((*server)->Send("back").ok());
  auto r4 = (*client)->Receive(milliseconds(1000));
  ASSERT_TRUE(r4.ok());
  EXPECT_EQ(*r4, "back");
}

TEST_F(ChannelTest, PeerCredentialsNameTheConnectingProcess) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok());
  const std::string path = SocketPath();
  ForkedChild child([path](ForkedChild& self) -> int {
    auto c = Channel::Connect(path, milliseconds(2000));
    if (!c.ok()) return 1;
    if (!(*c)->Send(std::to_string(getpid())).ok()) return 2;
    self.Tell("sent");
    for (;;) pause();
  });
  auto server = (*listener)->Accept(milliseconds(2000));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->peer().pid, child.pid());
  EXPECT_NE((*server)->peer_name().find(std::to_string(child.pid())), std::string::npos);
  auto msg = (*server)->Receive(milliseconds(2000));
  ASSERT_TRUE(msg.ok());
  EXPECT_EQ(*msg, std::to_string(child.pid()));
}

TEST_F(ChannelTest, DeadTrainingProcessIsUnavailableNamingItsPidWithinTheBound) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok());
  const std::string path = SocketPath();
  ForkedChild child([path](ForkedChild& self) -> int {
    auto c = Channel::Connect(path, milliseconds(2000));
    if (!c.ok()) return 1;
    self.Tell("connected");
    for (;;) pause();
  });
  auto server = (*listener)->Accept(milliseconds(2000));
  ASSERT_TRUE(server.ok());
  (*server)->set_peer_name(DescribeLocalProcess(1, (*server)->peer().pid));
  ASSERT_EQ(child.NextLine(), "connected");

  // The daemon waits in Receive when the process dies mid-wait.
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    kill(child.pid(), SIGKILL);
  });
  const Clock::time_point start = Clock::now();
  auto r = (*server)->Receive(milliseconds(5000));
  const int64_t took = MsSince(start);
  killer.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("local rank 1 (pid " + std::to_string(child.pid()) + ")"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_LT(took, 1000);
  EXPECT_EQ((*server)->Send("x").code(), StatusCode::kUnavailable);
}

TEST_F(ChannelTest, DeadDaemonFailsPendingAndLaterCallsNamingIt) {
  const std::string path = SocketPath();
  ForkedChild daemon([path](ForkedChild& self) -> int {
    auto l = Listener::Listen(path);
    if (!l.ok()) return 1;
    self.Tell("listening");
    auto c = (*l)->Accept(milliseconds(5000));
    if (!c.ok()) return 2;
    self.Tell("accepted");
    for (;;) pause();
  });
  ASSERT_EQ(daemon.NextLine(), "listening");
  auto client = Channel::Connect(path, milliseconds(2000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->peer().pid, daemon.pid());
  ASSERT_EQ(daemon.NextLine(), "accepted");

  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    kill(daemon.pid(), SIGKILL);
  });
  const Clock::time_point start = Clock::now();
  auto r = (*client)->Receive(milliseconds(5000));
  const int64_t took = MsSince(start);
  killer.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("daemon at " + path + " (pid " +
                                      std::to_string(daemon.pid()) + ")"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_LT(took, 1000);
  Status s = (*client)->Send("after");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
}

TEST_F(ChannelTest, EveryWaitIsBoundedAndNamesWhomItWaitedFor) {
  // Connect to a path where nobody listens.
  Clock::time_point start = Clock::now();
  auto none = Channel::Connect(SocketPath(), milliseconds(150));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout);
  EXPECT_NE(none.status().message().find(SocketPath()), std::string::npos);
  EXPECT_GE(MsSince(start), 140);
  EXPECT_LT(MsSince(start), 1000);

  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok());
  start = Clock::now();
  auto acc = (*listener)->Accept(milliseconds(100));
  EXPECT_EQ(acc.status().code(), StatusCode::kTimeout);
  EXPECT_GE(MsSince(start), 95);

  ChannelOptions small;
  small.send_timeout = milliseconds(100);
  auto client = Channel::Connect(SocketPath(), milliseconds(1000), small);
  ASSERT_TRUE(client.ok());
  auto server = (*listener)->Accept(milliseconds(1000));
  ASSERT_TRUE(server.ok());
  start = Clock::now();
  auto r = (*server)->Receive(milliseconds(100));
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_NE(r.status().message().find("pid " + std::to_string(getpid())), std::string::npos);
  EXPECT_GE(MsSince(start), 95);
  EXPECT_LT(MsSince(start), 1000);

  // The daemon never reads: sends fill the socket and then time out.
  const std::string frame(small.max_frame_bytes, 'y');
  Status s;
  start = Clock::now();
  for (int i = 0; i < 10000 && s.ok(); ++i) s = (*client)->Send(frame);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_NE(s.message().find("not accepted within 100 ms"), std::string::npos);
  EXPECT_LT(MsSince(start), 2000);
}

TEST_F(ChannelTest, OversizeAndMalformedFramesAreDataLossAndTheChannelGoesOn) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok());
  ChannelOptions big;
  big.max_frame_bytes = 256 * 1024;
  auto client = Channel::Connect(SocketPath(), milliseconds(1000), big);
  ASSERT_TRUE(client.ok());
  auto server = (*listener)->Accept(milliseconds(1000));  // default limit: 64 KiB
  ASSERT_TRUE(server.ok());

  EXPECT_EQ((*server)->Send(std::string(64 * 1024 + 1, 'z')).code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE((*client)->Send(std::string(100 * 1024, 'o')).ok());
  auto r = (*server)->Receive(milliseconds(1000));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("exceeds"), std::string::npos) << r.status().ToString();

  // A frame whose prefix states 100 payload bytes but carries 10.
  std::string truncated(kFramePrefixBytes + 10, 't');
  const uint32_t magic = kFrameMagic;
  const uint32_t stated = 100;
  std::memcpy(truncated.data(), &magic, 4);
  std::memcpy(truncated.data() + 4, &stated, 4);
  ASSERT_TRUE((*client)->SendRawForTesting(truncated).ok());
  r = (*server)->Receive(milliseconds(1000));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("states 100 payload bytes but carries 10"), std::string::npos)
      << r.status().ToString();

  ASSERT_TRUE((*client)->SendRawForTesting("abc").ok());  // no prefix at all
  r = (*server)->Receive(milliseconds(1000));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);

  ASSERT_TRUE((*client)->Send("still fine").ok());
  r = (*server)->Receive(milliseconds(1000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "still fine");
}

TEST_F(ChannelTest, ShutdownWakesWaitersWithCancelled) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok());
  auto client = Channel::Connect(SocketPath(), milliseconds(1000));
  ASSERT_TRUE(client.ok());
  auto server = (*listener)->Accept(milliseconds(1000));
  ASSERT_TRUE(server.ok());

  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(50));
    (*server)->Shutdown();
    (*listener)->Shutdown();
  });
  const Clock::time_point start = Clock::now();
  auto r = (*server)->Receive(milliseconds(5000));
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  EXPECT_LT(MsSince(start), 1000);
  stopper.join();
  auto a = (*listener)->Accept(milliseconds(5000));
  EXPECT_EQ(a.status().code(), StatusCode::kCancelled);
  // The other end sees the connection closed.
  auto c = (*client)->Receive(milliseconds(1000));
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
}

TEST_F(ChannelTest, ListenRefusesALiveDaemonsPathAndReplacesAStaleOne) {
  EXPECT_EQ(Listener::Listen(std::string(200, 'p')).status().code(), StatusCode::kInvalidArgument);
  {
    auto first = Listener::Listen(SocketPath());
    ASSERT_TRUE(first.ok());
    auto second = Listener::Listen(SocketPath());
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("another process is listening"), std::string::npos);
  }
  EXPECT_NE(access(SocketPath().c_str(), F_OK), 0);  // the destructor unlinked the path

  // A socket file left by a crashed daemon.
  const std::string path = SocketPath();
  ForkedChild crashed([path](ForkedChild& self) -> int {
    auto l = Listener::Listen(path);
    self.Tell(l.ok() ? "listening" : "failed");
    for (;;) pause();
  });
  ASSERT_EQ(crashed.NextLine(), "listening");
  kill(crashed.pid(), SIGKILL);
  crashed.Wait();
  EXPECT_EQ(access(SocketPath().c_str(), F_OK), 0);
  auto again = Listener::Listen(SocketPath());
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

// ---------------------------------------------------------------- local protocol

TEST(LocalProtocolTest, HelloVerdictsNameBothSides) {
  v1::LocalHello h = MakeHello(1, 3);
  EXPECT_EQ(h.pid(), static_cast<uint32_t>(getpid()));
  EXPECT_EQ(JudgeHello(h, 77, 3, {}).refusal(), v1::LocalHelloReply::REFUSAL_NONE);
  EXPECT_EQ(JudgeHello(h, 77, 0, {}).refusal(), v1::LocalHelloReply::REFUSAL_NONE);

  v1::LocalHello old = h;
  old.mutable_version()->set_major(kLocalProtocolMajor + 1);
  old.mutable_version()->set_minor(4);
  v1::LocalHelloReply r = JudgeHello(old, 77, 3, {});
  EXPECT_EQ(r.refusal(), v1::LocalHelloReply::REFUSAL_VERSION_MISMATCH);
  EXPECT_EQ(r.version().major(), kLocalProtocolMajor);
  const std::string theirs = fmt::format("speaks {}.4", kLocalProtocolMajor + 1);
  const std::string ours = fmt::format("speaks {}.{}", kLocalProtocolMajor, kLocalProtocolMinor);
  EXPECT_NE(r.reason().find(theirs), std::string::npos) << r.reason();
  EXPECT_NE(r.reason().find(ours), std::string::npos) << r.reason();
  EXPECT_NE(r.reason().find("pid 77"), std::string::npos) << r.reason();
  Status s = HelloReplyStatus(r, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("refused local rank 1: local protocol version mismatch"),
            std::string::npos)
      << s.ToString();

  r = JudgeHello(h, 77, 3, {{1, 55}});
  EXPECT_EQ(r.refusal(), v1::LocalHelloReply::REFUSAL_DUPLICATE_RANK);
  EXPECT_NE(r.reason().find("already held by local rank 1 (pid 55)"), std::string::npos)
      << r.reason();

  r = JudgeHello(h, 77, 4, {});
  EXPECT_EQ(r.refusal(), v1::LocalHelloReply::REFUSAL_LOCAL_SIZE_MISMATCH);
  EXPECT_NE(r.reason().find("runs 3 training processes, but this bitpush-worker serves 4"),
            std::string::npos)
      << r.reason();

  r = JudgeHello(MakeHello(3, 3), 77, 3, {});
  EXPECT_EQ(r.refusal(), v1::LocalHelloReply::REFUSAL_BAD_RANK);
  EXPECT_NE(r.reason().find("outside 0..2"), std::string::npos) << r.reason();

  v1::LocalHello liar = h;
  liar.set_pid(12);
  r = JudgeHello(liar, 77, 3, {{1, 55}});
  EXPECT_NE(r.reason().find("pid 77 (says pid 12)"), std::string::npos) << r.reason();
}

TEST(LocalProtocolTest, DeclarationDifferenceNamesTheFirstFieldAndBothProcesses) {
  v1::LocalDeclare a;
  a.set_index(3);
  a.set_name("fc.weight");
  a.set_elements(4096);
  a.set_dtype(0);
  a.set_priority(2);
  a.set_compression("onebit");
  EXPECT_FALSE(DeclarationDifference(a, "local rank 0 (pid 11)", a, "local rank 1 (pid 12)"));
  v1::LocalDeclare b = a;
  b.set_elements(4095);
  b.set_sum(true);
  auto d = DeclarationDifference(a, "local rank 0 (pid 11)", b, "local rank 1 (pid 12)");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d,
            "tensor #3 differs in elements: local rank 0 (pid 11) declared 'fc.weight' (4096 x "
            "float32, priority 2, compression 'onebit', average) but local rank 1 (pid 12) "
            "declared 'fc.weight' (4095 x float32, priority 2, compression 'onebit', sum)");
  b = a;
  b.set_priority(5);
  d = DeclarationDifference(a, "x", b, "y");
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("tensor #3 differs in priority: x declared"), std::string::npos);
}

TEST(LocalProtocolTest, SlicesMustBelongToTheSenderAndFitTheirSegment) {
  v1::ShmSlice s;
  s.set_segment(fmt::format("/bitpush-{}-{}-0", getuid(), 4242));
  s.set_segment_bytes(1024);
  s.set_offset(512);
  s.set_bytes(512);
  EXPECT_TRUE(ValidateSlice(s, 4242, 512, "input").ok());
  Status other = ValidateSlice(s, 4243, 512, "input");
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("belongs to pid 4242"), std::string::npos) << other.ToString();
  EXPECT_EQ(ValidateSlice(s, 4242, 256, "input").code(), StatusCode::kInvalidArgument);
  s.set_offset(~uint64_t{0} - 100);  // offset + bytes overflows
  Status overflow = ValidateSlice(s, 4242, 512, "output");
  EXPECT_EQ(overflow.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overflow.message().find("output: bytes"), std::string::npos) << overflow.ToString();
  s.set_segment("/etc-passwd");
  EXPECT_EQ(ValidateSlice(s, 4242, 512, "input").code(), StatusCode::kInvalidArgument);
}

// Minor version 3 added LocalErrorFeedback: a client must not send it to an older daemon (which
// would take the unknown body for garbage and fail the node); it answers Unimplemented naming the
// daemon and both versions, and nothing reaches the daemon.
TEST_F(ChannelTest, ErrorFeedbackStateIsUnimplementedAgainstAnOlderDaemonAndSendsNothing) {
  ASSERT_GE(kLocalProtocolMinor, kLocalMinorErrorFeedback);
  std::unique_ptr<Channel> daemon_side;
  StatusOr<std::unique_ptr<DaemonClient>> client =
      ConnectToOlderDaemon(kLocalMinorErrorFeedback - 1, &daemon_side);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_NE(daemon_side, nullptr);
  const std::string old_version =
      fmt::format("speaks local protocol {}.{}", kLocalProtocolMajor, kLocalMinorErrorFeedback - 1);
  StatusOr<std::vector<float>> read = (*client)->ErrorFeedbackState(TensorId{0});
  EXPECT_EQ(read.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(read.status().message().find(old_version), std::string::npos)
      << read.status().ToString();
  EXPECT_NE(read.status().message().find("bitpush-worker daemon at " + SocketPath()),
            std::string::npos)
      << read.status().ToString();
  const std::vector<float> saved(4, 1.0f);
  const Status restore = (*client)->RestoreErrorFeedbackState(TensorId{0}, saved);
  EXPECT_EQ(restore.code(), StatusCode::kUnimplemented) << restore.ToString();
  EXPECT_EQ(ReceiveLocalMessage(*daemon_side, milliseconds(200)).status().code(),
            StatusCode::kTimeout);
  (*client)->Close();
}

// Minor version 5 added LocalErrorFeedback's `state` (the servers' residual, the rounds): an
// older daemon would take such a request for one about the worker residual, so a client sends
// none to it; each call answers Unimplemented naming both versions, and nothing reaches the
// daemon.
TEST_F(ChannelTest, ServerResidualAndRoundsAreUnimplementedAgainstAnOlderDaemonAndSendNothing) {
  ASSERT_GT(kLocalMinorJobState, kLocalMinorErrorFeedback);
  std::unique_ptr<Channel> daemon_side;
  StatusOr<std::unique_ptr<DaemonClient>> client =
      ConnectToOlderDaemon(kLocalMinorJobState - 1, &daemon_side);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_NE(daemon_side, nullptr);
  const std::string old_version =
      fmt::format("speaks local protocol {}.{}", kLocalProtocolMajor, kLocalMinorJobState - 1);
  const std::string needs = fmt::format("needs {}.{}", kLocalProtocolMajor, kLocalMinorJobState);
  const std::vector<float> saved(4, 1.0f);
  const std::vector<Status> answers = {
      (*client)->ServerErrorFeedbackState(TensorId{0}).status(),
      (*client)->RestoreServerErrorFeedbackState(TensorId{0}, saved),
      (*client)->TensorRounds(TensorId{0}).status(),
      (*client)->RestoreTensorRounds(TensorId{0}, 7),
  };
  for (const Status& s : answers) {
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
    EXPECT_NE(s.message().find(old_version), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(needs), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(ReceiveLocalMessage(*daemon_side, milliseconds(200)).status().code(),
            StatusCode::kTimeout);
  (*client)->Close();
}

// The daemon's node collective (worker/daemon/node_barrier.h): a gathering of wait_for_servers
// runs the engine's wait once for the node, bounded by the smallest timeout given, and not the
// cluster's barrier; a barrier gathering runs the barrier; a mix of the two at one seq fails every
// process of it with FailedPrecondition naming both, and the next gathering works.
TEST_F(ChannelTest, NodeCollectiveRunsTheWaitOnceAndRefusesAMixNamingBoth) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  std::vector<std::unique_ptr<Channel>> procs;
  std::vector<std::shared_ptr<Channel>> daemon_side;
  for (int i = 0; i < 2; ++i) {
    auto c = Channel::Connect(SocketPath(), milliseconds(1000));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto d = (*listener)->Accept(milliseconds(1000));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    procs.push_back(std::move(c).value());
    daemon_side.push_back(std::shared_ptr<Channel>(std::move(d).value()));
  }
  std::atomic<int> barriers{0};
  std::atomic<int> waits{0};
  std::atomic<int64_t> waited_ms{-1};
  NodeBarrierOptions o;
  o.label = "bitpush-worker node 0";
  o.cluster_barrier = [&] {
    ++barriers;
    return Status::Ok();
  };
  o.wait_for_servers = [&](milliseconds timeout) {
    ++waits;
    waited_ms = timeout.count();
    return Status::Ok();
  };
  o.node_error = [] { return Status::Ok(); };
  NodeBarrier barrier(std::move(o));
  auto done = [&](int p) -> StatusOr<v1::LocalBarrierDone> {
    BP_ASSIGN_OR_RETURN(v1::LocalMessage m, ReceiveLocalMessage(*procs[p], milliseconds(5000)));
    if (!m.has_barrier_done()) return InternalError("not a LocalBarrierDone");
    return m.barrier_done();
  };

  // seq 0: both wait for the servers; the smallest timeout bounds the one wait.
  barrier.Enter(daemon_side[0], "local rank 0", 0, 2, milliseconds(5000));
  barrier.Enter(daemon_side[1], "local rank 1", 0, 2, milliseconds(3000));
  for (int p = 0; p < 2; ++p) {
    StatusOr<v1::LocalBarrierDone> d = done(p);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->seq(), 0u);
    EXPECT_EQ(d->status_code(), 0u) << d->message();
  }
  EXPECT_EQ(waits.load(), 1);
  EXPECT_EQ(waited_ms.load(), 3000);
  EXPECT_EQ(barriers.load(), 0);

  // seq 1: a barrier and a wait — both are refused, naming both processes.
  barrier.Enter(daemon_side[0], "local rank 0", 1, 2);
  barrier.Enter(daemon_side[1], "local rank 1", 1, 2, milliseconds(3000));
  for (int p = 0; p < 2; ++p) {
    StatusOr<v1::LocalBarrierDone> d = done(p);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->seq(), 1u);
    EXPECT_EQ(d->status_code(), static_cast<uint32_t>(StatusCode::kFailedPrecondition));
    EXPECT_NE(d->message().find("local rank 1 entered wait_for_servers as its node collective 1 "
                                "while local rank 0 entered barrier"),
              std::string::npos)
        << d->message();
  }

  // seq 2: a barrier of both passes, through the cluster's barrier only.
  barrier.Enter(daemon_side[1], "local rank 1", 2, 2);
  barrier.Enter(daemon_side[0], "local rank 0", 2, 2);
  for (int p = 0; p < 2; ++p) {
    StatusOr<v1::LocalBarrierDone> d = done(p);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->seq(), 2u);
    EXPECT_EQ(d->status_code(), 0u) << d->message();
  }
  EXPECT_EQ(barriers.load(), 1);
  EXPECT_EQ(waits.load(), 1);
  barrier.Stop();
}

// Minor version 6 added LocalBarrier.wait_for_servers: an older daemon would take it for a
// barrier, so the client answers Unimplemented naming both versions and sends nothing.
TEST_F(ChannelTest, WaitForServersIsUnimplementedAgainstAnOlderDaemonAndSendsNothing) {
  std::unique_ptr<Channel> daemon_side;
  StatusOr<std::unique_ptr<DaemonClient>> client =
      ConnectToOlderDaemon(kLocalMinorWaitForServers - 1, &daemon_side);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_NE(daemon_side, nullptr);
  const Status s = (*client)->WaitForServers(milliseconds(1000));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
  EXPECT_NE(s.message().find(fmt::format("speaks local protocol {}.{}", kLocalProtocolMajor,
                                         kLocalMinorWaitForServers - 1)),
            std::string::npos)
      << s.ToString();
  EXPECT_EQ(ReceiveLocalMessage(*daemon_side, milliseconds(200)).status().code(),
            StatusCode::kTimeout);
  (*client)->Close();
}

// A training process (child) and a daemon (this process) through the whole layer: Hello,
// a push_pull whose tensor lives in the child's segment, then the child dies and the daemon
// names it and frees its segment.
TEST_F(ChannelTest, TrainingProcessAndDaemonEndToEnd) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok());
  const std::string path = SocketPath();
  constexpr size_t kFloats = 1024;
  ForkedChild trainer([path](ForkedChild& self) -> int {
    auto ch = Channel::Connect(path, milliseconds(2000));
    if (!ch.ok()) return 1;
    auto seg = ShmSegment::Create(2 * kFloats * sizeof(float));
    if (!seg.ok()) return 2;
    auto* f = static_cast<float*>(seg->data());
    for (size_t i = 0; i < kFloats; ++i) f[i] = static_cast<float>(i);
    v1::LocalMessage m;
    *m.mutable_hello() = MakeHello(0, 1);
    if (!SendLocalMessage(**ch, m).ok()) return 3;
    auto reply = ReceiveLocalMessage(**ch, milliseconds(2000));
    if (!reply.ok() || !HelloReplyStatus(reply->hello_reply(), 0).ok()) return 4;
    m.Clear();
    v1::LocalPushPull* pp = m.mutable_push_pull();
    pp->set_tensor(0);
    pp->set_round(0);
    for (v1::ShmSlice* s : {pp->mutable_input(), pp->mutable_output()}) {
      s->set_segment(seg->name());
      s->set_segment_bytes(seg->size());
      s->set_bytes(kFloats * sizeof(float));
    }
    pp->mutable_output()->set_offset(kFloats * sizeof(float));
    if (!SendLocalMessage(**ch, m).ok()) return 5;
    auto done = ReceiveLocalMessage(**ch, milliseconds(2000));
    if (!done.ok() || done->push_pull_done().status_code() != 0) return 6;
    for (size_t i = 0; i < kFloats; ++i) {
      if (f[kFloats + i] != 2.0f * static_cast<float>(i)) return 7;
    }
    self.Tell("verified");
    for (;;) pause();  // then dies of SIGKILL, leaving the segment
  });

  auto ch = (*listener)->Accept(milliseconds(2000));
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  Channel& c = **ch;
  auto hello = ReceiveLocalMessage(c, milliseconds(2000));
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  ASSERT_EQ(hello->body_case(), v1::LocalMessage::kHello);
  v1::LocalMessage reply;
  *reply.mutable_hello_reply() = JudgeHello(hello->hello(), c.peer().pid, 1, {});
  ASSERT_EQ(reply.hello_reply().refusal(), v1::LocalHelloReply::REFUSAL_NONE);
  c.set_peer_name(DescribeLocalProcess(hello->hello().local_rank(), c.peer().pid));
  ASSERT_TRUE(SendLocalMessage(c, reply).ok());

  auto push = ReceiveLocalMessage(c, milliseconds(2000));
  ASSERT_TRUE(push.ok()) << push.status().ToString();
  const v1::LocalPushPull& pp = push->push_pull();
  ASSERT_TRUE(ValidateSlice(pp.input(), c.peer().pid, kFloats * 4, "input").ok());
  ASSERT_TRUE(ValidateSlice(pp.output(), c.peer().pid, kFloats * 4, "output").ok());
  auto seg = ShmSegment::Open(pp.input().segment(), pp.input().segment_bytes());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  ASSERT_TRUE(seg->CheckSize().ok());
  const auto* in =
      reinterpret_cast<const float*>(static_cast<char*>(seg->data()) + pp.input().offset());
  auto* out = reinterpret_cast<float*>(static_cast<char*>(seg->data()) + pp.output().offset());
  for (size_t i = 0; i < kFloats; ++i) out[i] = 2.0f * in[i];
  v1::LocalMessage done;
  done.mutable_push_pull_done()->set_tensor(pp.tensor());
  done.mutable_push_pull_done()->set_round(pp.round());
  ASSERT_TRUE(SendLocalMessage(c, done).ok());
  ASSERT_EQ(trainer.NextLine(), "verified");

  kill(trainer.pid(), SIGKILL);
  auto gone = ReceiveLocalMessage(c, milliseconds(2000));
  ASSERT_EQ(gone.status().code(), StatusCode::kUnavailable) << gone.status().ToString();
  EXPECT_NE(gone.status().message().find(fmt::format("local rank 0 (pid {})", trainer.pid())),
            std::string::npos)
      << gone.status().ToString();
  // The daemon frees the dead process's segment.
  EXPECT_TRUE(ShmExists(seg->name()));
  EXPECT_TRUE(UnlinkSegment(seg->name()).ok());
  EXPECT_FALSE(ShmExists(seg->name()));
  trainer.Wait();
  EXPECT_TRUE(ShmEntriesOf(trainer.pid()).empty());
}

TEST_F(ChannelTest, AFrameThatIsNotALocalMessageIsDataLoss) {
  auto listener = Listener::Listen(SocketPath());
  ASSERT_TRUE(listener.ok());
  auto client = Channel::Connect(SocketPath(), milliseconds(1000));
  ASSERT_TRUE(client.ok());
  auto server = (*listener)->Accept(milliseconds(1000));
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*client)->Send("").ok());  // parses, but has no body
  auto r = ReceiveLocalMessage(**server, milliseconds(1000));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("no body"), std::string::npos) << r.status().ToString();
  ASSERT_TRUE((*client)->Send(std::string("\xff\xff\xff", 3)).ok());
  r = ReceiveLocalMessage(**server, milliseconds(1000));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace bitpush::worker::ipc
