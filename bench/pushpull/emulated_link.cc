// The emulated link of `bitpush-bench pushpull --link-gbit R`: the servers (and the raw TCP
// peer) run in a network namespace of their own, behind a veth pair shaped to R Gbit/s each way
// (tc tbf), 10.251.X.1 (root namespace: scheduler, workers, driver) <-> 10.251.X.2 (servers).
// The namespace and the veth pair are removed on every exit path (also on SIGINT/SIGTERM/SIGHUP:
// signal_cleanup.h). Needs root, ip and tc.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/pushpull/host_tools.h"
#include "bench/pushpull/link.h"
#include "bench/pushpull/signal_cleanup.h"
#include "common/transport/ucx/info.h"

namespace bitpush::bench::pushpull {
namespace {

std::string Fmt(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// A network namespace bp-bench-<pid> and a veth pair bpb<pid>a (root namespace, 10.251.X.1/30)
// <-> bpb<pid>b (in the namespace, 10.251.X.2/30), each end's egress shaped by tc tbf to
// R Gbit/s, so each direction of the link carries R Gbit/s. Removed by Remove() / the
// destructor, and by a signal handler if the run is interrupted.
class EmulatedLink : public Link {
 public:
  explicit EmulatedLink(double gbit) : gbit_(gbit) {}
  ~EmulatedLink() override { Remove(); }

  Status Create(NetPlan* net) override {
    const double gbit = gbit_;
    if (geteuid() != 0) {
      return FailedPreconditionError("--link-gbit needs root (network namespaces, veth, tc)");
    }
    ip_ = FindTool("ip");
    tc_ = FindTool("tc");
    if (ip_.empty() || tc_.empty()) {
      return FailedPreconditionError(std::string("--link-gbit needs the iproute2 tools: ") +
                                     (ip_.empty() ? "ip " : "") + (tc_.empty() ? "tc " : "") +
                                     "not found in PATH, /usr/sbin or /sbin");
    }
    RemoveStale();
    const long pid = static_cast<long>(getpid());
    netns_ = "bp-bench-" + std::to_string(pid);
    veth_root_ = "bpb" + std::to_string(pid) + "a";
    veth_ns_ = "bpb" + std::to_string(pid) + "b";
    // A /30 in 10.251.0.0/16 that no interface here has yet.
    std::string addrs;
    Shell(ip_ + " -4 -o addr show", &addrs);
    int x = static_cast<int>(pid % 254) + 1;
    for (int tries = 0; addrs.find("10.251." + std::to_string(x) + ".") != std::string::npos;
         x = x % 254 + 1) {
      if (++tries > 254) return UnavailableError("no free 10.251.X.0/30 subnet for --link-gbit");
    }
    const std::string prefix = "10.251." + std::to_string(x) + ".";
    net->root_ip = prefix + "1";
    net->server_ip = prefix + "2";
    net->netns = netns_;
    net->ip_tool = ip_;
    // Each end sees its own veth.
    net->ucx_net_devices = veth_root_ + "," + veth_ns_ +
                           transport::ucx_backend::LoopbackNetDevices().substr(2);  // ",mlx5_0:1"

    RemoveNetnsOnSignal(ip_, netns_, veth_root_);
    created_ = true;

    // tbf: rate R, a bucket of 1 ms at that rate (at least 256 KiB: GSO packets of 64 KiB
    // pass whole), queueing up to 10 ms before dropping.
    const double bytes_per_s = gbit * 1e9 / 8;
    const long long burst = std::max<long long>(256 << 10, std::llround(bytes_per_s / 1000));
    const std::string tbf = " root tbf rate " + Fmt(gbit * 1000, "%.6g") + "mbit burst " +
                            std::to_string(burst) + " latency 10ms";
    const std::string in_ns = ip_ + " netns exec " + netns_ + " ";
    const std::vector<std::string> steps = {
        ip_ + " netns add " + netns_,
        ip_ + " link add " + veth_root_ + " type veth peer name " + veth_ns_,
        ip_ + " link set " + veth_ns_ + " netns " + netns_,
        ip_ + " addr add " + net->root_ip + "/30 dev " + veth_root_,
        ip_ + " link set " + veth_root_ + " up",
        in_ns + ip_ + " addr add " + net->server_ip + "/30 dev " + veth_ns_,
        in_ns + ip_ + " link set " + veth_ns_ + " up",
        in_ns + ip_ + " link set lo up",
        tc_ + " qdisc add dev " + veth_root_ + tbf,
        in_ns + tc_ + " qdisc add dev " + veth_ns_ + tbf,
    };
    for (const std::string& step : steps) {
      std::string out;
      if (Shell(step, &out) != 0) {
        return InternalError(fmt::format("--link-gbit: '{}' failed: {}", step, out));
      }
    }
    return Status::Ok();
  }

  void Remove() override {
    if (!created_) return;
    Shell(ip_ + " link del " + veth_root_);  // both ends of the pair
    Shell(ip_ + " netns del " + netns_);
    ForgetNetnsOnSignal();
    created_ = false;
  }

  std::string Describe(const NetPlan& net) const override {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "servers behind an emulated link of %g Gbit/s each way (%s <-> %s)", gbit_,
                  net.root_ip.c_str(), net.server_ip.c_str());
    return line;
  }

 private:
  // Namespaces bp-bench-<pid> left by a run that was SIGKILLed (its pid no longer exists).
  void RemoveStale() {
    std::string list;
    if (Shell(ip_ + " netns list", &list) != 0) return;
    std::istringstream lines(list);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("bp-bench-", 0) != 0) continue;
      const std::string digits = line.substr(9, line.find_first_not_of("0123456789", 9) - 9);
      if (digits.empty()) continue;
      const long pid = std::stol(digits);
      if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
      Shell(ip_ + " link del bpb" + digits + "a");
      Shell(ip_ + " netns del bp-bench-" + digits);
    }
  }

  const double gbit_;
  bool created_ = false;
  std::string ip_, tc_, netns_, veth_root_, veth_ns_;
};

}  // namespace

std::unique_ptr<Link> MakeEmulatedLink(double gbit) {
  return std::make_unique<EmulatedLink>(gbit);
}

}  // namespace bitpush::bench::pushpull
