// The ucx transport backend (common/transport/ucx/): what the contract suite
// (transport_contract_test.cc) cannot see. A raw UCP peer (its own context, worker and client
// endpoint, speaking wire.h by hand) checks that a connection is bound to the name its HELLO
// gives, that messages before the HELLO, with a bad AM header, without a reply endpoint or with
// a bad layout are dropped and counted, and that a part above max_message_bytes closes the
// connection; a child process (this binary, re-executed) that is SIGKILLed is reported as
// disconnected within a bound, over TCP and over shared memory. Loopback only.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/factory.h"
#include "common/transport/transport.h"
#include "common/transport/ucx/wire.h"

extern char** environ;

// Not run under ThreadSanitizer (make tsan filters out the ucx cases): UCX is an uninstrumented
// system library with its own async thread, spinlocks and atfork/fini handlers, whose
// synchronisation TSan reports as misuse; suppressing part of it makes the rest mismatch.

namespace bitpush::transport {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using ucx_backend::AmHeader;
using ucx_backend::AmType;

constexpr char kTcpTls[] = "tcp,self";
constexpr char kShmTls[] = "posix,sysv,cma,self,tcp";

Message Text(const std::string& header, std::vector<Buffer> frames = {}) {
  Message m;
  m.header = header;
  m.frames = std::move(frames);
  return m;
}

bool UcxUsable(std::string* why) {
  StatusOr<const TransportBackend*> b = FindTransportBackend("ucx");
  if (!b.ok()) {
    *why = b.status().ToString();
    return false;
  }
  const Status viable = (*b)->viable();
  *why = viable.ToString();
  return viable.ok();
}

#define SKIP_WITHOUT_UCX()                                                       \
  do {                                                                           \
    std::string why;                                                             \
    if (!UcxUsable(&why)) GTEST_SKIP() << "the ucx backend cannot run: " << why; \
  } while (0)

TransportOptions Options(const std::string& name, const std::string& tls = kTcpTls) {
  TransportOptions o;
  o.name = name;
  o.listen_address = "ucx://127.0.0.1:0";
  o.ucx_config = {{"TLS", tls}};
  return o;
}

std::unique_ptr<Transport> Make(const TransportOptions& o) {
  auto t = CreateTransport(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return nullptr;
  return std::move(t).value();
}

// The next message, skipping events (or a failure).
Received NextMessage(Transport* t, milliseconds timeout = milliseconds(10000)) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    StatusOr<Received> r = t->Receive(std::max(left, milliseconds(0)));
    if (!r.ok()) {
      ADD_FAILURE() << t->name() << ": " << r.status().ToString();
      return Received{"", TransportEvent{}};
    }
    if (r->is_message()) return std::move(r).value();
  }
}

int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// A UCP client that speaks the backend's wire format by hand: its own context, worker and
// endpoint, progressed by the test's thread.
class RawPeer {
 public:
  ~RawPeer() {
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(ep_, &p);
      if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
        ucp_request_free(r);
      }
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  // Connects to a ucx endpoint's address (ucx://127.0.0.1:PORT).
  bool Connect(const std::string& address) {
    ucp_config_t* cfg = nullptr;
    if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK) return false;
    ucp_config_modify(cfg, "TLS", kTcpTls);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    const ucs_status_t s = ucp_init(&params, cfg, &context_);
    ucp_config_release(cfg);
    if (s != UCS_OK) return false;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(context_, &wp, &worker_) != UCS_OK) return false;
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = ucx_backend::kAmId;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb = [](void* arg, const void* header, size_t header_length, void*, size_t,
               const ucp_am_recv_param_t*) -> ucs_status_t {
      StatusOr<AmHeader> h = ucx_backend::ParseAmHeader(header, header_length);
      if (h.ok() && h->type == AmType::kCredit) static_cast<RawPeer*>(arg)->credits_ += h->seq;
      return UCS_OK;
    };
    am.arg = this;
    if (ucp_worker_set_am_recv_handler(worker_, &am) != UCS_OK) return false;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(PortOf(address)));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    ep.sockaddr.addrlen = sizeof(sa);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
      static_cast<RawPeer*>(arg)->error_ = status;
    };
    ep.err_handler.arg = this;
    return ucp_ep_create(worker_, &ep, &ep_) == UCS_OK;
  }

  // Sends one Active Message and waits (bounded) until UCX completed it; its status.
  ucs_status_t Send(const uint8_t* am_header, size_t am_header_bytes, const std::string& data,
                    bool reply = true) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = reply ? UCP_AM_SEND_FLAG_REPLY : 0;
    void* r = ucp_am_send_nbx(ep_, ucx_backend::kAmId, am_header, am_header_bytes, data.data(),
                              data.size(), &p);
    if (r == nullptr) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    const ucs_status_t s = ucp_request_check_status(r);
    ucp_request_free(r);
    return s;
  }
  ucs_status_t Send(const AmHeader& h, const std::string& data, bool reply = true) {
    uint8_t bytes[ucx_backend::kAmHeaderBytes];
    ucx_backend::EncodeAmHeader(h, bytes);
    return Send(bytes, sizeof(bytes), data, reply);
  }

  ucs_status_t SendHello(const std::string& name) {
    AmHeader h;
    h.type = AmType::kHello;
    return Send(h, ucx_backend::EncodeHello({name, ""}));
  }

  // A kData message laid out as the backend lays it out.
  ucs_status_t SendData(uint64_t seq, const std::string& header,
                        const std::vector<std::string>& frames) {
    std::vector<uint64_t> sizes;
    AmHeader h;
    h.type = AmType::kData;
    h.seq = seq;
    h.header_bytes = static_cast<uint32_t>(header.size());
    h.frame_count = static_cast<uint32_t>(frames.size());
    for (const std::string& f : frames) {
      sizes.push_back(f.size());
      h.largest_part = std::max<uint64_t>(h.largest_part, f.size());
    }
    StatusOr<ucx_backend::DataLayout> l = ucx_backend::ComputeLayout(header.size(), sizes);
    std::string data(l->total, '\0');
    std::memcpy(data.data(), header.data(), header.size());
    for (size_t i = 0; i < frames.size(); ++i) {
      for (int b = 0; b < 8; ++b) {
        data[l->sizes_offset + 8 * i + b] = static_cast<char>(sizes[i] >> (8 * b));
      }
      std::memcpy(data.data() + l->frame_offsets[i], frames[i].data(), frames[i].size());
    }
    return Send(h, data);
  }

  // Progresses until `done` or the deadline; whether `done` became true.
  template <typename F>
  bool ProgressUntil(F done, milliseconds timeout = milliseconds(10000)) {
    const auto deadline = Clock::now() + timeout;
    while (!done() && Clock::now() < deadline) {
      if (ucp_worker_progress(worker_) == 0) std::this_thread::yield();
    }
    return done();
  }

  uint64_t Credits() const { return credits_; }
  ucs_status_t Error() const { return error_; }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  uint64_t credits_ = 0;
  ucs_status_t error_ = UCS_OK;
};

// Waits (bounded) until `t`'s malformed_dropped reaches `n`.
bool WaitMalformed(Transport* t, uint64_t n) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (t->stats().malformed_dropped < n && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  return t->stats().malformed_dropped >= n;
}

TEST(UcxTransport, TheHelloNamesEveryLaterMessageOfTheConnection) {
  SKIP_WITHOUT_UCX();
  auto b = Make(Options("b"));
  ASSERT_TRUE(b);
  RawPeer raw;
  ASSERT_TRUE(raw.Connect(b->address()));
  ASSERT_EQ(raw.SendHello("worker:7"), UCS_OK);
  ASSERT_TRUE(raw.ProgressUntil([&] { return raw.Credits() > 0; })) << "no credit grant";
  EXPECT_EQ(raw.Credits(), TransportOptions().max_queued_per_peer);
  ASSERT_EQ(raw.SendData(0, "first", {"abc"}), UCS_OK);
  ASSERT_EQ(raw.SendData(1, "second", {}), UCS_OK);
  Received r = NextMessage(b.get());
  EXPECT_EQ(r.from, "worker:7");
  EXPECT_EQ(r.message().header, "first");
  ASSERT_EQ(r.message().frames.size(), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.message().frames[0].data()), 3), "abc");
  r = NextMessage(b.get());
  EXPECT_EQ(r.from, "worker:7");
  EXPECT_EQ(r.message().header, "second");
  EXPECT_EQ(b->stats().malformed_dropped, 0u);

  // A second HELLO does not rename the connection: dropped and counted.
  ASSERT_EQ(raw.SendHello("scheduler"), UCS_OK);
  ASSERT_TRUE(WaitMalformed(b.get(), 1));
  ASSERT_EQ(raw.SendData(2, "third", {}), UCS_OK);
  r = NextMessage(b.get());
  EXPECT_EQ(r.from, "worker:7");
  EXPECT_EQ(r.message().header, "third");

  // Two real endpoints: the receiver names the sender by its endpoint name.
  auto a = Make(Options("server:3"));
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Connect("b", b->address()).ok());
  ASSERT_TRUE(a->Send("b", Text("hi")).ok());
  r = NextMessage(b.get());
  EXPECT_EQ(r.from, "server:3");
  EXPECT_EQ(r.message().header, "hi");
}

TEST(UcxTransport, MessagesBeforeTheHelloAndMalformedOnesAreDroppedAndCounted) {
  SKIP_WITHOUT_UCX();
  auto b = Make(Options("b"));
  ASSERT_TRUE(b);
  RawPeer raw;
  ASSERT_TRUE(raw.Connect(b->address()));
  ASSERT_EQ(raw.SendData(0, "too early", {"x"}), UCS_OK);
  ASSERT_TRUE(WaitMalformed(b.get(), 1));
  EXPECT_EQ(b->Receive(milliseconds(100)).status().code(), StatusCode::kTimeout);

  // Not a bitpush AM header; no reply endpoint.
  const uint8_t junk[7] = {1, 2, 3, 4, 5, 6, 7};
  ASSERT_EQ(raw.Send(junk, sizeof(junk), "payload"), UCS_OK);
  ASSERT_TRUE(WaitMalformed(b.get(), 2));
  AmHeader hello;
  hello.type = AmType::kHello;
  ASSERT_EQ(raw.Send(hello, ucx_backend::EncodeHello({"nameless", ""}), /*reply=*/false), UCS_OK);
  ASSERT_TRUE(WaitMalformed(b.get(), 3));

  // Now properly: HELLO, then a message with a bad layout (its sizes disagree with its data).
  ASSERT_EQ(raw.SendHello("worker:1"), UCS_OK);
  ASSERT_TRUE(raw.ProgressUntil([&] { return raw.Credits() > 0; }));
  AmHeader bad;
  bad.type = AmType::kData;
  bad.seq = 0;
  bad.header_bytes = 4;
  bad.frame_count = 1;
  bad.largest_part = 100;
  std::string data = "head";
  data.append(8, '\0');
  data[4] = 100;  // frame of 100 bytes announced, 3 sent
  data += "abc";
  ASSERT_EQ(raw.Send(bad, data), UCS_OK);
  ASSERT_TRUE(WaitMalformed(b.get(), 4));
  // The dropped message used its place in the order: the next one is delivered.
  ASSERT_EQ(raw.SendData(1, "fine", {"ok"}), UCS_OK);
  Received r = NextMessage(b.get());
  EXPECT_EQ(r.from, "worker:1");
  EXPECT_EQ(r.message().header, "fine");
  EXPECT_EQ(b->stats().malformed_dropped, 4u);
  EXPECT_EQ(b->stats().messages_received, 1u);
}

TEST(UcxTransport, APartAboveMaxMessageBytesClosesTheConnection) {
  SKIP_WITHOUT_UCX();
  TransportOptions ob = Options("b");
  ob.max_message_bytes = 1024;
  auto b = Make(ob);
  ASSERT_TRUE(b);
  RawPeer raw;
  ASSERT_TRUE(raw.Connect(b->address()));
  ASSERT_EQ(raw.SendHello("worker:1"), UCS_OK);
  ASSERT_TRUE(raw.ProgressUntil([&] { return raw.Credits() > 0; }));
  ASSERT_EQ(raw.SendData(0, "small", {std::string(1024, 's')}), UCS_OK);
  EXPECT_EQ(NextMessage(b.get()).message().header, "small");
  raw.SendData(1, "big", {std::string(1025, 'b')});
  ASSERT_TRUE(WaitMalformed(b.get(), 1));
  EXPECT_TRUE(raw.ProgressUntil([&] { return raw.Error() != UCS_OK; }))
      << "the connection was not closed";
  EXPECT_EQ(b->Receive(milliseconds(100)).status().code(), StatusCode::kTimeout);

  // A real endpoint sending a frame above the limit: its peer drops it and closes; the sender
  // is told (the connection ends), and a message within the limit gets through afterwards.
  auto a = Make(Options("a"));
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Connect("b", b->address()).ok());
  ASSERT_TRUE(a->Send("b", Text("ok")).ok());
  EXPECT_EQ(NextMessage(b.get()).message().header, "ok");
  const std::string big(64 * 1024, 'z');
  ASSERT_TRUE(a->Send("b", Text("big", {Buffer::Copy(big.data(), big.size())})).ok());
  bool disconnected = false;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!disconnected && Clock::now() < deadline) {
    StatusOr<Received> e = a->Receive(milliseconds(50));
    disconnected =
        e.ok() && !e->is_message() && e->event().kind == TransportEvent::Kind::kPeerDisconnected;
  }
  EXPECT_TRUE(disconnected);
  EXPECT_EQ(b->stats().malformed_dropped, 2u);
  EXPECT_EQ(b->Receive(milliseconds(100)).status().code(), StatusCode::kTimeout);
}

TEST(UcxTransport, ConnectionsBeyondMaxConnectionsAreRefused) {
  SKIP_WITHOUT_UCX();
  TransportOptions ob = Options("b");
  ob.max_connections = 2;
  auto b = Make(ob);
  ASSERT_TRUE(b);
  std::vector<std::unique_ptr<Transport>> senders;
  for (int i = 0; i < 2; ++i) {
    senders.push_back(Make(Options("s" + std::to_string(i))));
    ASSERT_TRUE(senders.back());
    ASSERT_TRUE(senders.back()->Connect("b", b->address()).ok());
    ASSERT_TRUE(senders.back()->Send("b", Text("m" + std::to_string(i))).ok());
    EXPECT_EQ(NextMessage(b.get()).from, "s" + std::to_string(i));
  }
  auto third = Make(Options("s2"));
  ASSERT_TRUE(third);
  ASSERT_TRUE(third->Connect("b", b->address()).ok());
  ASSERT_TRUE(third->Send("b", Text("refused")).ok());  // queued while it tries to connect
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (b->stats().connections_refused == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_GE(b->stats().connections_refused, 1u);
  EXPECT_EQ(b->Receive(milliseconds(300)).status().code(), StatusCode::kTimeout);
  // A slot frees up: the third one gets in (it keeps retrying) and its message arrives.
  senders[0]->Close();
  Received r = NextMessage(b.get());
  EXPECT_EQ(r.from, "s2");
  EXPECT_EQ(r.message().header, "refused");
}

TEST(UcxTransport, LargeFramesArriveAlignedInOneReceivedBlock) {
  SKIP_WITHOUT_UCX();
  auto a = Make(Options("a"));
  auto b = Make(Options("b"));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Connect("b", b->address()).ok());
  std::vector<Buffer> frames;
  for (size_t size : {size_t{3}, size_t{8} << 20, size_t{5000}, size_t{1} << 20}) {
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 7 + size);
    frames.push_back(Buffer::Take(std::move(bytes)));
  }
  ASSERT_TRUE(a->Send("b", Text("big", frames)).ok());
  Received r = NextMessage(b.get());
  ASSERT_EQ(r.message().frames.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const Buffer& got = r.message().frames[i];
    ASSERT_EQ(got.size(), frames[i].size());
    EXPECT_EQ(std::memcmp(got.data(), frames[i].data(), got.size()), 0) << "frame " << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data()) % ucx_backend::FrameAlignment(got.size()), 0u)
        << "frame " << i;
    EXPECT_EQ(got.owner(), r.message().frames[0].owner()) << "one block per message";
  }
}

TEST(UcxTransport, SecurityModeCurveIsRefusedNotFaked) {
  SKIP_WITHOUT_UCX();
  TransportOptions o = Options("a");
  o.security.mode = TransportSecurity::Mode::kCurve;
  auto t = CreateTransport(o);
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition) << t.status().ToString();
  EXPECT_NE(t.status().message().find("ucx backend: security mode curve is not supported yet"),
            std::string::npos)
      << t.status().ToString();
}

TEST(UcxTransport, BadUcxConfigAndAddressesAreInvalidArgument) {
  SKIP_WITHOUT_UCX();
  TransportOptions o = Options("a");
  // UCX 1.13 accepts unknown names (kept for its transports, warned about later), but not a
  // value that does not parse.
  o.ucx_config = {{"RNDV_THRESH", "not-a-size"}};
  auto t = CreateTransport(o);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
  EXPECT_NE(t.status().message().find("RNDV_THRESH=not-a-size"), std::string::npos)
      << t.status().ToString();
  o = Options("a");
  o.listen_address = "ucx://127.0.0.1";
  EXPECT_EQ(CreateTransport(o).status().code(), StatusCode::kInvalidArgument);
  auto a = Make(Options("a"));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->Connect("x", "ucx://127.0.0.1:99999").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Connect("x", "tcp://127.0.0.1:5").code(), StatusCode::kInvalidArgument);
}

TEST(UcxWire, LayoutAlignsFramesAndParseRefusesWhatDoesNotAddUp) {
  StatusOr<ucx_backend::DataLayout> l = ucx_backend::ComputeLayout(5, {3, 5000, 0, 1});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->sizes_offset, 5u);
  EXPECT_EQ(l->frame_offsets[0], 40u);  // 5 + 32 bytes of sizes, aligned to 8
  EXPECT_EQ(l->frame_offsets[1], 64u);  // 43 aligned to 64 (a frame of 4 KiB or more)
  EXPECT_EQ(l->frame_offsets[2], 5064u);
  EXPECT_EQ(l->frame_offsets[3], 5064u);
  EXPECT_EQ(l->total, 5065u);

  AmHeader h;
  h.type = AmType::kData;
  h.header_bytes = 2;
  h.frame_count = 1;
  h.largest_part = 4;
  std::string data = "hi";
  data.append(8, '\0');
  data[2] = 4;
  data.append(6, '\0');  // pad to 16
  data += "abcd";
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  ASSERT_TRUE(ucx_backend::ParseData(h, p, data.size(), 1024).ok());
  EXPECT_FALSE(ucx_backend::ParseData(h, p, data.size() - 1, 1024).ok());  // truncated
  EXPECT_FALSE(ucx_backend::ParseData(h, p, data.size(), 3).ok());         // above the limit
  std::string padded = data;
  padded[12] = 1;  // a padding byte that is not 0
  EXPECT_FALSE(ucx_backend::ParseData(h, reinterpret_cast<const uint8_t*>(padded.data()),
                                      padded.size(), 1024)
                   .ok());
  h.largest_part = 3;  // the frame is larger than the header said
  EXPECT_FALSE(ucx_backend::ParseData(h, p, data.size(), 1024).ok());

  EXPECT_FALSE(ucx_backend::ParseHello("\x01\0\0\0", 4).ok());
  const std::string hello = ucx_backend::EncodeHello({"server:0", ""});
  StatusOr<ucx_backend::HelloPayload> parsed = ucx_backend::ParseHello(hello.data(), hello.size());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->name, "server:0");
  EXPECT_FALSE(ucx_backend::ParseHello(hello.data(), hello.size() - 1).ok());
}

// ---- a peer process killed with SIGKILL ----------------------------------------------------

constexpr char kChildParentEnv[] = "BITPUSH_UCX_TEST_CHILD_PARENT";
constexpr char kChildTlsEnv[] = "BITPUSH_UCX_TEST_CHILD_TLS";

// Runs only as the child process of KilledPeerProcessIsReportedDisconnected (this binary,
// re-executed): an endpoint that tells the parent its address and answers "ping" with "pong"
// until it is killed (or 60 s have passed).
// DISABLED_: a normal run leaves it out; the parent runs it with --gtest_also_run_disabled_tests.
TEST(UcxChildProcess, DISABLED_ServeUntilKilled) {
  const char* parent = std::getenv(kChildParentEnv);
  const char* tls = std::getenv(kChildTlsEnv);
  ASSERT_TRUE(parent != nullptr && tls != nullptr)
      << "runs only as the child of KilledPeerProcessIsReportedDisconnected";
  auto child = Make(Options("child", tls));
  ASSERT_TRUE(child);
  ASSERT_TRUE(child->Connect("parent", parent).ok());
  ASSERT_TRUE(child->Send("parent", Text("up " + child->address())).ok());
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    StatusOr<Received> r = child->Receive(milliseconds(500));
    if (r.ok() && r->is_message() && r->message().header == "ping") {
      ASSERT_TRUE(child->Send("parent", Text("pong")).ok());
    }
  }
}

class UcxKilledPeer : public ::testing::TestWithParam<const char*> {};

TEST_P(UcxKilledPeer, KilledPeerProcessIsReportedDisconnectedWithinABound) {
  SKIP_WITHOUT_UCX();
  auto parent = Make(Options("parent", GetParam()));
  ASSERT_TRUE(parent);
  // The child's environment and arguments, built before fork (only exec runs after it).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kChildParentEnv) + "=" + parent->address());
  env_strings.push_back(std::string(kChildTlsEnv) + "=" + GetParam());
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", arg0 = "transport_ucx_test",
              filter = "--gtest_filter=UcxChildProcess.DISABLED_ServeUntilKilled",
              disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {arg0.data(), filter.data(), disabled.data(), nullptr};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execve(exe.c_str(), argv, envp.data());
    _exit(127);
  }
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reaper{pid};

  Received up = NextMessage(parent.get(), milliseconds(30000));
  ASSERT_EQ(up.from, "child");
  ASSERT_EQ(up.message().header.rfind("up ucx://", 0), 0u) << up.message().header;
  ASSERT_TRUE(parent->Connect("child", up.message().header.substr(3)).ok());
  ASSERT_TRUE(parent->Send("child", Text("ping")).ok());
  Received pong = NextMessage(parent.get(), milliseconds(10000));
  ASSERT_EQ(pong.from, "child");
  ASSERT_EQ(pong.message().header, "pong");

  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const auto killed = Clock::now();
  bool reported = false;
  while (!reported && Clock::now() - killed < std::chrono::seconds(30)) {
    StatusOr<Received> r = parent->Receive(milliseconds(100));
    if (!r.ok()) continue;
    ASSERT_FALSE(r->is_message()) << "a message from " << r->from;
    if (r->event().kind == TransportEvent::Kind::kPeerDisconnected) {
      EXPECT_EQ(r->event().peer, "child");
      EXPECT_NE(r->event().status.message().find("'child'"), std::string::npos)
          << r->event().status.ToString();
      reported = true;
    }
  }
  const auto elapsed = Clock::now() - killed;
  ASSERT_TRUE(reported) << "no kPeerDisconnected for the killed child within 30 s";
  EXPECT_LT(elapsed, std::chrono::seconds(5))
      << std::chrono::duration_cast<milliseconds>(elapsed).count() << " ms";
  const Status s = parent->Send("child", Text("late"));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("'child'"), std::string::npos) << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxKilledPeer, ::testing::Values(kTcpTls, kShmTls),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param == kTcpTls ? "tcp" : "shm");
                         });

}  // namespace
}  // namespace bitpush::transport
