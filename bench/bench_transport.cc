// bitpush-bench transport: the zmq transport (and, with --transport ucx, the ucx transport)
// between two processes on loopback, against a plain TCP socket stream between the same two
// processes (the reference) and memcpy. `transport --list` prints what UCX finds here instead.
//
// The benchmark process (the driver) starts a second copy of itself (`transport --peer ...`,
// not listed in --help) and sends to it:
//   throughput  N messages of one payload frame of msg_bytes each (zero-copy Buffers), then an
//               end marker; the peer counts them and acknowledges; time = first send to ack.
//   rtt         a 64-byte message echoed back; the median of many round trips.
// The raw TCP reference (backend raw_tcp) moves the same bytes between the same two processes
// through one blocking socket: the sender writes each message with one write loop, the receiver
// reads each message whole into one reused buffer of the message's size (the least a transport
// must do: deliver every message into memory of its own), then a 1-byte acknowledgement.
// raw_tcp_ceiling is the iperf-style loopback ceiling: the same writes, but the receiver reads
// 64 KiB at a time into one cache-resident buffer and keeps nothing (the small reads also let
// sender and receiver overlap more); it is reported for context, not as the reference.
// Repetitions of every variant are interleaved so all see the same machine; each reports its
// fastest repetition (bench_util.h). ratio_to_raw_tcp: throughput / raw_tcp throughput at the
// same size; for rtt records, raw_tcp rtt / this rtt (both: higher is better, 1 = as fast as
// raw TCP). Throughput records also carry ratio_to_raw_tcp_ceiling.
// The ucx links (one per --ucx-tls value) run in the same interleaving; each reports what UCX
// chose for the driver's sending endpoint (ucp_ep_print_info's lanes, transport.h
// DescribePeerEndpoint) and its throughput over zmq tcp's of the same run.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/raw_tcp.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "common/transport/ucx/info.h"
#include "common/transport/ucx/transport.h"

namespace bitpush::bench {
namespace {

using transport::Buffer;
using transport::Message;
using transport::Received;
using transport::Transport;
using Clock = std::chrono::steady_clock;

// A private directory for the ipc:// sockets of one run (the driver's and the peer's), removed
// with what is in it on every exit path of the driver.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/bitpush-bench-XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    for (const char* name : {"/transport.sock", "/transport.sock.peer"}) {
      unlink((path_ + name).c_str());
    }
    rmdir(path_.c_str());
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& Path() const { return path_; }

 private:
  std::string path_;
};

constexpr std::chrono::milliseconds kWait{30000};  // every wait in the benchmark is bounded
constexpr size_t kRttBytes = 64;

struct Options {
  bool json = false;
  std::vector<size_t> sizes_kib = {64, 1024, 4096};
  size_t mib_per_rep = 256;
  int reps = 5;
  int rtt_count = 2000;
  bool ipc = true;
  bool zmq = true;   // --transport has zmq (the default)
  bool ucx = false;  // --transport has ucx
  // One ucx link per value: its UCX TLS ("" = UCX_TLS from the environment, or UCX's default).
  std::vector<std::string> ucx_tls;
  bool list = false;
};

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench transport [--json] [--sizes-kib 64,1024,4096] [--mib-per-rep 256]\n"
      "                               [--reps 5] [--rtt-count 2000] [--no-ipc]\n"
      "                               [--transport zmq|ucx|zmq,ucx] [--ucx-tls TLS]...\n"
      "       bitpush-bench transport --list [--json]\n"
      "Two processes on loopback: one-way throughput of the zmq transport (tcp and ipc) for\n"
      "messages of each size and 64-byte round-trip latency, against a plain TCP socket that\n"
      "delivers each message into a buffer of its size (raw_tcp, the reference), the same\n"
      "bytes read 64 KiB at a time and dropped (raw_tcp_ceiling) and memcpy of each size.\n"
      "gbps = payload bytes / best time / 1e9.\n"
      "--transport ucx adds the ucx transport (ucx://127.0.0.1), one link per --ucx-tls value\n"
      "(UCX's TLS, e.g. tcp or sm,self,tcp; none: UCX_TLS from the environment or UCX's\n"
      "default; other UCX_* variables apply); records say what UCX chose (ucx_tls). Without an\n"
      "RDMA device keep tcp in the list (sm,self,tcp): UCX 1.13 then connects through it.\n"
      "--list: the UCX version, the transports and devices UCX finds, and the RDMA devices\n"
      "with their link layer (or why there is none).\n");
}

bool ParseList(const char* s, std::vector<size_t>* out) {
  out->clear();
  std::string list = s;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = list.find(',', pos);
    const long v = std::strtol(list.substr(pos, comma - pos).c_str(), nullptr, 10);
    if (v <= 0) return false;
    out->push_back(static_cast<size_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return !out->empty();
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "bitpush-bench transport: %s\n", what.c_str());
  return 1;
}

// ---- zmq ----------------------------------------------------------------------------------

Message Make(const std::string& header, std::vector<Buffer> frames = {}) {
  Message m;
  m.header = header;
  m.frames = std::move(frames);
  return m;
}

// The next message (events are logged and skipped).
StatusOr<Received> Next(Transport* t) {
  while (true) {
    StatusOr<Received> r = t->Receive(kWait);
    if (!r.ok() || r->is_message()) return r;
    if (r->event().kind == transport::TransportEvent::Kind::kPeerConnected) continue;
    std::fprintf(stderr, "bitpush-bench transport: %s: event about '%s': %s\n", t->name().c_str(),
                 r->from.c_str(), r->event().status.ToString().c_str());
  }
}

// Seconds to send `count` messages of `frame` and get the peer's acknowledgement.
StatusOr<double> ZmqStream(Transport* t, const std::string& peer, const Buffer& frame,
                           uint64_t count) {
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < count; ++i) BP_RETURN_IF_ERROR(t->Send(peer, Make("d", {frame})));
  BP_RETURN_IF_ERROR(t->Send(peer, Make("end:" + std::to_string(count))));
  BP_ASSIGN_OR_RETURN(Received r, Next(t));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (r.message().header != "ack:" + std::to_string(count)) {
    return InternalError("peer acknowledged '" + r.message().header +
                         "', expected ack:" + std::to_string(count));
  }
  return s;
}

StatusOr<double> ZmqRtt(Transport* t, const std::string& peer, int count) {
  const Buffer ping = Buffer::Take(std::vector<uint8_t>(kRttBytes, 2));
  std::vector<double> us;
  for (int i = 0; i < count; ++i) {
    const auto t0 = Clock::now();
    BP_RETURN_IF_ERROR(t->Send(peer, Make("ping", {ping})));
    BP_ASSIGN_OR_RETURN(Received r, Next(t));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (r.message().header != "pong") return InternalError("expected pong");
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// The peer side of one zmq endpoint: counts data messages, acknowledges end markers, echoes
// pings, stops on "quit".
Status ZmqPeer(Transport* t, const std::string& driver) {
  uint64_t count = 0;
  while (true) {
    BP_ASSIGN_OR_RETURN(Received r, Next(t));
    Message& m = r.message();
    if (m.header == "d") {
      ++count;
    } else if (m.header.rfind("end:", 0) == 0) {
      BP_RETURN_IF_ERROR(t->Send(driver, Make("ack:" + std::to_string(count))));
      count = 0;
    } else if (m.header == "ping") {
      BP_RETURN_IF_ERROR(t->Send(driver, Make("pong", std::move(m.frames))));
    } else if (m.header == "quit") {
      return Status::Ok();
    }
  }
}

// A zmq endpoint, or a ucx one when `address` is ucx:// (`tls`: its UCX TLS, "" = UCX's).
StatusOr<std::unique_ptr<Transport>> NewEndpoint(const std::string& name,
                                                 const std::string& address,
                                                 const std::string& tls = "") {
  transport::TransportOptions o;
  o.backend = address.rfind("ucx://", 0) == 0 ? "ucx" : "zmq";
  o.name = name;
  o.listen_address = address;
  o.send_block_timeout = kWait;
  if (!tls.empty()) o.ucx_config["TLS"] = tls;
  // Both ends are on loopback: without this UCX adds a lane through every other interface's
  // address (tcp/eth0) as a second rendezvous rail. UCX_NET_DEVICES in the environment wins.
  if (std::getenv("UCX_NET_DEVICES") == nullptr) {
    o.ucx_config["NET_DEVICES"] = transport::ucx_backend::LoopbackNetDevices();
  }
  return transport::CreateTransport(o);
}

// `transport --peer --tcp-port P [--zmq ADDR]... [--ucx ADDR --ucx-tls TLS]...`: the second
// process.
int RunPeer(int argc, char** argv) {
  int port = 0;
  std::vector<std::string> drivers;
  std::vector<std::string> tls;  // per driver address: the ucx link's TLS
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--tcp-port")) {
      port = static_cast<int>(ParsePositive("transport", "--tcp-port", argv[++i], 65535));
    }
    if (!std::strcmp(argv[i], "--zmq") || !std::strcmp(argv[i], "--ucx")) {
      drivers.emplace_back(argv[++i]);
      tls.emplace_back();
    }
    if (!std::strcmp(argv[i], "--ucx-tls") && !tls.empty()) tls.back() = argv[++i];
  }
  std::string error;
  const int fd = ConnectLoopback(port, &error);
  if (fd < 0) return Fail("peer: " + error);
  std::thread raw([fd] { RawPeer(fd); });
  std::vector<std::thread> threads;
  threads.reserve(drivers.size());
  std::vector<Status> results(drivers.size());
  std::vector<std::unique_ptr<Transport>> endpoints;
  for (size_t i = 0; i < drivers.size(); ++i) {
    // Listen on the same kind of address as the driver.
    const std::string& d = drivers[i];
    const std::string listen = d.rfind("ipc://", 0) == 0   ? d + ".peer"
                               : d.rfind("ucx://", 0) == 0 ? "ucx://127.0.0.1:0"
                                                           : "tcp://127.0.0.1:0";
    auto t = NewEndpoint("bench:peer", listen, tls[i]);
    if (!t.ok()) return Fail("peer: " + t.status().ToString());
    Status s = (*t)->Connect("bench:driver", d);
    if (s.ok())
      s = (*t)->Send("bench:driver",
                     Make("hello", {Buffer::Copy((*t)->address().data(), (*t)->address().size())}));
    if (!s.ok()) return Fail("peer: " + s.ToString());
    endpoints.push_back(std::move(t).value());
  }
  for (size_t i = 0; i < drivers.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = ZmqPeer(endpoints[i].get(), "bench:driver"); });
  }
  for (std::thread& t : threads) t.join();
  raw.join();
  close(fd);
  for (const Status& s : results) {
    if (!s.ok()) return Fail("peer: " + s.ToString());
  }
  return 0;
}

// ---- driver -------------------------------------------------------------------------------

struct Link {
  std::string backend = "zmq";  // "zmq" or "ucx"
  std::string link;             // zmq: "tcp" or "ipc"; ucx: its TLS as given, or "default"
  std::unique_ptr<Transport> t;
  std::string tls;  // ucx: the TLS configured ("" = the environment's or UCX's default)
  // ucx: what UCX chose for the driver's endpoint to the peer (info.h LaneTransports), and
  // its lanes ("0 tcp/lo am am_bw#0 wireup; ...").
  std::string chosen;
  std::string lanes;
};

Link MakeLink(std::string backend, std::string link, std::unique_ptr<Transport> t,
              std::string tls = "") {
  Link l;
  l.backend = std::move(backend);
  l.link = std::move(link);
  l.t = std::move(t);
  l.tls = std::move(tls);
  return l;
}

std::string Name(const Link& l) {
  return l.backend + " " + l.link;
}

// Asks the ucx endpoint which lanes UCX chose for its connection to the peer.
Status DescribeUcxLink(Link* l) {
  BP_ASSIGN_OR_RETURN(std::string info, transport::ucx_backend::DescribePeerEndpoint(
                                            l->t.get(), "bench:peer", kWait));
  const std::vector<transport::ucx_backend::UcxLane> lanes =
      transport::ucx_backend::ParseEpLanes(info);
  if (lanes.empty()) return InternalError("ucp_ep_print_info shows no lane:\n" + info);
  l->chosen = transport::ucx_backend::LaneTransports(lanes);
  l->lanes.clear();
  for (const auto& lane : lanes) {
    if (!l->lanes.empty()) l->lanes += "; ";
    l->lanes +=
        std::to_string(lane.index) + " " + lane.transport + "/" + lane.device + " " + lane.ops;
  }
  return Status::Ok();
}

int RunDriver(const Options& opt) {
  // Raw TCP listener.
  int port = 0;
  std::string error;
  const int listener = ListenLoopback(&port, &error);
  if (listener < 0) return Fail(error);

  ScratchDir scratch;  // declared before the links: removed after their sockets close
  std::vector<Link> links;
  std::string ipc_path;
  if (opt.zmq) {
    auto t = NewEndpoint("bench:driver", "tcp://127.0.0.1:0");
    if (!t.ok()) return Fail(t.status().ToString());
    links.push_back(MakeLink("zmq", "tcp", std::move(t).value()));
  }
  if (opt.zmq && opt.ipc) {
    if (scratch.Path().empty()) return Fail(std::string("mkdtemp: ") + std::strerror(errno));
    ipc_path = scratch.Path() + "/transport.sock";
    auto t = NewEndpoint("bench:driver", "ipc://" + ipc_path);
    if (!t.ok()) return Fail(t.status().ToString());
    links.push_back(MakeLink("zmq", "ipc", std::move(t).value()));
  }
  if (opt.ucx) {
    const std::vector<std::string> tls_list =
        opt.ucx_tls.empty() ? std::vector<std::string>{""} : opt.ucx_tls;
    for (const std::string& tls : tls_list) {
      auto t = NewEndpoint("bench:driver", "ucx://127.0.0.1:0", tls);
      if (!t.ok()) return Fail("ucx: " + t.status().ToString());
      links.push_back(MakeLink("ucx", tls.empty() ? "default" : tls, std::move(t).value(), tls));
    }
  }

  // Start the peer: this binary, hidden mode.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return Fail("readlink /proc/self/exe failed");
  exe[n] = '\0';
  std::vector<std::string> args = {exe, "transport", "--peer", "--tcp-port", std::to_string(port)};
  for (const Link& l : links) {
    args.push_back(l.backend == "ucx" ? "--ucx" : "--zmq");
    args.push_back(l.t->address());
    if (l.backend == "ucx") {
      args.push_back("--ucx-tls");
      args.push_back(l.tls);
    }
  }
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t child = fork();
  if (child < 0) return Fail(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    execv(exe, argv.data());
    _exit(127);
  }
  auto cleanup = [&] {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  };

  const int fd = accept(listener, nullptr, nullptr);
  close(listener);
  if (fd < 0) {
    cleanup();
    return Fail(std::string("accept: ") + std::strerror(errno));
  }
  SetNoDelay(fd);
  for (Link& l : links) {
    StatusOr<Received> hello = Next(l.t.get());
    Status s = hello.status();
    if (s.ok()) {
      const Buffer& b = hello->message().frames.at(0);
      s = l.t->Connect("bench:peer",
                       std::string(reinterpret_cast<const char*>(b.data()), b.size()));
    }
    if (!s.ok()) {
      cleanup();
      return Fail(Name(l) + ": " + s.ToString());
    }
  }

  std::vector<JsonRecord> records;
  if (!opt.json) {
    std::printf("two processes on loopback; gbps = payload GB/s (best of %d reps of %zu MiB)\n",
                opt.reps, opt.mib_per_rep);
    std::printf("%-16s %-6s %-10s %9s %8s %9s %9s %8s\n", "backend", "link", "mode", "msg_bytes",
                "GB/s", "x raw_tcp", "x ceiling", "rtt_us");
  }
  // zmq tcp's throughput at each size, for the ucx records' ratio_to_zmq_tcp.
  std::vector<double> zmq_tcp_gbps;
  auto emit = [&](const char* backend, const std::string& link, const char* mode, size_t bytes,
                  double gbps, double ratio, double rtt_us, double seconds, uint64_t messages,
                  double ratio_ceiling, const Link* of = nullptr) {
    JsonRecord rec;
    rec.Add("backend", backend)
        .Add("link", link)
        .Add("mode", mode)
        .Add("msg_bytes", bytes)
        .Add("gbps", gbps)
        .Add("ratio_to_raw_tcp", ratio)
        .Add("rtt_us", rtt_us)
        .Add("seconds", seconds)
        .Add("messages", static_cast<long long>(messages))
        .Add("reps", opt.reps);
    if (!std::isnan(ratio_ceiling)) rec.Add("ratio_to_raw_tcp_ceiling", ratio_ceiling);
    if (of != nullptr) {
      rec.Add("transport", of->backend);
      if (of->backend == "ucx") {
        rec.Add("ucx_tls", of->chosen)
            .Add("ucx_tls_configured", of->tls)
            .Add("ucx_lanes", of->lanes);
        if (!std::isnan(gbps) && !zmq_tcp_gbps.empty()) {
          rec.Add("ratio_to_zmq_tcp", gbps / zmq_tcp_gbps.back());
        }
      }
    }
    records.push_back(rec);
    if (!opt.json) {
      std::printf("%-16s %-6s %-10s %9zu %8.2f %9.2f %9.2f %8.1f\n", backend, link.c_str(), mode,
                  bytes, gbps, ratio, ratio_ceiling, rtt_us);
    }
  };

  int rc = 0;
  for (size_t kib : opt.sizes_kib) {
    const size_t bytes = kib << 10;
    auto src = std::make_shared<std::vector<uint8_t>>(bytes);
    for (size_t i = 0; i < bytes; ++i) (*src)[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
    const Buffer frame = Buffer::Borrow(src->data(), bytes, src);
    const uint64_t count = std::max<uint64_t>(1, (opt.mib_per_rep << 20) / bytes);
    double raw_best = INFINITY, ceiling_best = INFINITY;
    std::vector<double> zmq_best(links.size(), INFINITY);
    // One warm-up repetition each (page faults, TCP window growth), then interleaved reps.
    for (int rep = -1; rep < opt.reps && rc == 0; ++rep) {
      const double raw = RawStream(fd, kRawStream, *src, count);
      const double ceiling = RawStream(fd, kRawCeiling, *src, count);
      if (std::isnan(raw) || std::isnan(ceiling)) rc = Fail("raw TCP stream: the peer went away");
      if (rep >= 0) {
        raw_best = std::min(raw_best, raw);
        ceiling_best = std::min(ceiling_best, ceiling);
      }
      for (size_t i = 0; i < links.size() && rc == 0; ++i) {
        StatusOr<double> z = ZmqStream(links[i].t.get(), "bench:peer", frame, count);
        if (!z.ok()) {
          rc = Fail(Name(links[i]) + ": " + z.status().ToString());
        } else if (rep >= 0) {
          zmq_best[i] = std::min(zmq_best[i], *z);
        } else if (links[i].backend == "ucx" && links[i].chosen.empty()) {
          // After the warm-up: the connection is up and has carried messages of this size.
          const Status d = DescribeUcxLink(&links[i]);
          if (!d.ok()) rc = Fail(Name(links[i]) + ": " + d.ToString());
        }
      }
    }
    if (rc) break;
    const double payload = static_cast<double>(count * bytes);
    const double raw_gbps = payload / raw_best / 1e9;
    const double ceiling_gbps = payload / ceiling_best / 1e9;
    emit("raw_tcp", "tcp", "throughput", bytes, raw_gbps, 1.0, NAN, raw_best, count,
         raw_gbps / ceiling_gbps);
    emit("raw_tcp_ceiling", "tcp", "throughput", bytes, ceiling_gbps, ceiling_gbps / raw_gbps, NAN,
         ceiling_best, count, 1.0);
    for (size_t i = 0; i < links.size(); ++i) {
      const double g = payload / zmq_best[i] / 1e9;
      if (links[i].backend == "zmq" && links[i].link == "tcp") zmq_tcp_gbps.push_back(g);
      emit(links[i].backend.c_str(), links[i].link, "throughput", bytes, g, g / raw_gbps, NAN,
           zmq_best[i], count, g / ceiling_gbps, &links[i]);
    }
    std::vector<uint8_t> dst(bytes);
    const Timing mem = TimeIt([&] { std::memcpy(dst.data(), src->data(), bytes); }, 0.05, 10);
    const double mem_gbps = bytes / mem.best_seconds / 1e9;
    emit("memcpy", "memory", "throughput", bytes, mem_gbps, mem_gbps / raw_gbps, NAN,
         mem.best_seconds, 1, mem_gbps / ceiling_gbps);
  }

  if (rc == 0) {
    const int warm = std::max(10, opt.rtt_count / 10);
    double raw_rtt = RawRtt(fd, warm, kRttBytes);
    if (!std::isnan(raw_rtt)) raw_rtt = RawRtt(fd, opt.rtt_count, kRttBytes);
    if (std::isnan(raw_rtt)) rc = Fail("raw TCP ping-pong: the peer went away");
    if (rc == 0) {
      emit("raw_tcp", "tcp", "rtt", kRttBytes, NAN, 1.0, raw_rtt, raw_rtt * 1e-6,
           static_cast<uint64_t>(opt.rtt_count), NAN);
    }
    for (size_t i = 0; i < links.size() && rc == 0; ++i) {
      StatusOr<double> z = ZmqRtt(links[i].t.get(), "bench:peer", warm);
      if (z.ok()) z = ZmqRtt(links[i].t.get(), "bench:peer", opt.rtt_count);
      if (!z.ok()) {
        rc = Fail(Name(links[i]) + " ping-pong: " + z.status().ToString());
      } else {
        emit(links[i].backend.c_str(), links[i].link, "rtt", kRttBytes, NAN, raw_rtt / *z, *z,
             *z * 1e-6, static_cast<uint64_t>(opt.rtt_count), NAN, &links[i]);
      }
    }
  }

  // Stop the peer.
  const RawHeader quit{kRawQuit, 0, 0};
  (void)WriteAll(fd, &quit, sizeof(quit));
  for (Link& l : links) (void)l.t->Send("bench:peer", Make("quit"));
  int status = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  pid_t done = 0;
  while ((done = waitpid(child, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    cleanup();
    if (rc == 0) rc = Fail("the peer process did not exit");
  } else if (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    rc = Fail("the peer process failed");
  }
  close(fd);
  for (Link& l : links) l.t->Close();
  if (rc == 0 && opt.json) std::fputs(JsonArray(records).c_str(), stdout);
  if (rc == 0 && !opt.json) {
    for (const Link& l : links) {
      if (l.backend != "ucx") continue;
      std::printf("ucx %s: UCX chose %s (lanes: %s)\n", l.link.c_str(), l.chosen.c_str(),
                  l.lanes.c_str());
    }
  }
  return rc;
}

// ---- --list -------------------------------------------------------------------------------

std::string QuoteList(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + JsonQuote(v[i]);
  return out + "]";
}

// `transport --list [--json]`: what UCX finds on this machine.
int RunList(bool json) {
  StatusOr<transport::ucx_backend::UcxInventory> inv = transport::ucx_backend::QueryUcxInventory();
  if (!inv.ok()) return Fail(inv.status().ToString());
  const Status viable = transport::ucx_backend::UcxViable();
  if (json) {
    std::string out =
        "{\"ucx_version\": " + JsonQuote(inv->version) +
        ",\n \"ucx_viable\": " + (viable.ok() ? "true" : "false") +
        ",\n \"ucx_viable_reason\": " + JsonQuote(viable.ok() ? "" : viable.ToString()) +
        ",\n \"components\": " + QuoteList(inv->components) +
        ",\n \"components_without_device\": " + QuoteList(inv->components_without_md) +
        ",\n \"resources\": [";
    for (size_t i = 0; i < inv->resources.size(); ++i) {
      const auto& r = inv->resources[i];
      out += std::string(i ? "," : "") + "\n  {\"transport\": " + JsonQuote(r.transport) +
             ", \"device\": " + JsonQuote(r.device) + ", \"type\": " + JsonQuote(r.type) +
             ", \"component\": " + JsonQuote(r.component) + ", \"md\": " + JsonQuote(r.md) + "}";
    }
    out += "],\n \"rdma_devices\": [";
    for (size_t i = 0; i < inv->rdma_ports.size(); ++i) {
      const auto& p = inv->rdma_ports[i];
      out += std::string(i ? "," : "") + "\n  {\"device\": " + JsonQuote(p.device) +
             ", \"port\": " + JsonQuote(p.port) + ", \"link_layer\": " + JsonQuote(p.link_layer) +
             ", \"state\": " + JsonQuote(p.state) + "}";
    }
    out += "],\n \"rdma_absent_reason\": " + JsonQuote(inv->rdma_absent_reason) + "}\n";
    std::fputs(out.c_str(), stdout);
    return 0;
  }
  std::printf("UCX %s (%s)\n", inv->version.c_str(),
              viable.ok() ? "usable: a UCP context with Active Messages and wake-up"
                          : viable.ToString().c_str());
  std::printf("transports and devices (UCT components and their memory domains):\n");
  for (const auto& r : inv->resources) {
    std::printf("  %-24s %-5s (component %s, md %s)\n", (r.transport + "/" + r.device).c_str(),
                r.type.c_str(), r.component.c_str(), r.md.c_str());
  }
  for (const std::string& c : inv->components_without_md) {
    std::printf("  component %s: loaded, no device\n", c.c_str());
  }
  std::printf("RDMA devices:\n");
  for (const auto& p : inv->rdma_ports) {
    const char* kind = p.link_layer == "Ethernet"     ? " (RoCE)"
                       : p.link_layer == "InfiniBand" ? " (InfiniBand)"
                                                      : "";
    std::printf("  %s port %s: link_layer %s%s, state %s\n", p.device.c_str(), p.port.c_str(),
                p.link_layer.c_str(), kind, p.state.c_str());
  }
  if (inv->rdma_ports.empty()) std::printf("  %s\n", inv->rdma_absent_reason.c_str());
  return 0;
}

int ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bitpush-bench transport: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto positive = [&](const char* v) {
      const long x = std::strtol(v, nullptr, 10);
      if (x <= 0) {
        std::fprintf(stderr, "bitpush-bench transport: bad value '%s' for %s\n", v, a.c_str());
        std::exit(2);
      }
      return x;
    };
    if (a == "--json") {
      o->json = true;
    } else if (a == "--sizes-kib") {
      const char* v = next();
      if (!ParseList(v, &o->sizes_kib)) {
        std::fprintf(stderr, "bitpush-bench transport: bad --sizes-kib '%s'\n", v);
        return 2;
      }
    } else if (a == "--mib-per-rep") {
      o->mib_per_rep = static_cast<size_t>(positive(next()));
    } else if (a == "--reps") {
      o->reps = static_cast<int>(positive(next()));
    } else if (a == "--rtt-count") {
      o->rtt_count = static_cast<int>(positive(next()));
    } else if (a == "--no-ipc") {
      o->ipc = false;
    } else if (a == "--transport") {
      const std::string v = next();
      o->zmq = o->ucx = false;
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        const std::string name = v.substr(pos, comma - pos);
        if (name == "zmq") {
          o->zmq = true;
        } else if (name == "ucx") {
          o->ucx = true;
        } else {
          std::fprintf(stderr, "bitpush-bench transport: bad --transport '%s' (zmq, ucx)\n",
                       v.c_str());
          return 2;
        }
        pos = comma + 1;
      }
    } else if (a == "--ucx-tls") {
      o->ucx_tls.emplace_back(next());
    } else if (a == "--list") {
      o->list = true;
    } else if (a == "--help" || a == "-h") {
      PrintHelp();
      std::exit(0);
    } else {
      std::fprintf(stderr, "bitpush-bench transport: unknown option '%s'\n", a.c_str());
      PrintHelp();
      return 2;
    }
  }
  return 0;
}

}  // namespace

int RunTransportBench(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a peer that dies shows up as a failed write, not a signal
  if (argc >= 2 && !std::strcmp(argv[1], "--peer")) return RunPeer(argc, argv);
  Options opt;
  if (int rc = ParseArgs(argc, argv, &opt)) return rc;
  if (opt.list) return RunList(opt.json);
  if (!opt.ucx_tls.empty() && !opt.ucx) {
    std::fprintf(stderr, "bitpush-bench transport: --ucx-tls needs --transport ucx\n");
    return 2;
  }
  return RunDriver(opt);
}

}  // namespace bitpush::bench
