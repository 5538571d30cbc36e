// The network of `bitpush-bench pushpull` between its two sides: the root side (scheduler,
// workers, the driver's end of the raw TCP reference) and the servers' side (servers, the raw
// TCP peer). A Link sets that network up and says where each side listens (NetPlan); every
// cluster, the raw TCP reference and the UCX probe of a run use the same one.
//
// One link kind per file, each behind a factory declared here: loopback (link.cc; both sides on
// 127.0.0.1, nothing to set up) and the emulated link (emulated_link.cc; --link-gbit R: the
// servers in a network namespace behind a veth pair shaped to R Gbit/s each way). A new kind is
// a new file with its factory, and a line in MakeLink.
//
// Owned by the driver (RunPushPullBench), created before anything that runs across it and
// removed after the last thing that did. Thread-safety: none; the driver's thread only.
#pragma once

#include <memory>
#include <string>

#include "bench/pushpull/options.h"
#include "common/status.h"
#include "common/transport/ucx/info.h"

namespace bitpush::bench::pushpull {

// Where the processes listen: loopback, or the two ends of the emulated link.
struct NetPlan {
  std::string root_ip = "127.0.0.1";    // scheduler, workers, the driver's raw TCP end
  std::string server_ip = "127.0.0.1";  // servers, the raw TCP peer
  std::string netns;                    // non-empty: the servers' network namespace (ip netns name)
  std::string ip_tool;                  // path of `ip` (runs the servers: ip netns exec NS ...)
  // cluster.ucx.net_devices: the devices the cluster's addresses are on and the RDMA ports
  // (UCX would otherwise add lanes through every other interface it finds); UCX_NET_DEVICES in
  // the environment wins.
  std::string ucx_net_devices = transport::ucx_backend::LoopbackNetDevices();
};

// What --transport ucx passes as UCX's NET_DEVICES: `net`'s, unless UCX_NET_DEVICES is set.
std::string UcxNetDevices(const NetPlan& net);

class Link {
 public:
  virtual ~Link() = default;

  // Sets the link up and fills *net with where each side listens.
  virtual Status Create(NetPlan* net) = 0;
  // Takes the link down; idempotent (a kind that leaves something behind also does it when
  // destroyed).
  virtual void Remove() = 0;
  // The line of the table's header saying what the servers sit behind; "" when there is
  // nothing to say (loopback).
  virtual std::string Describe(const NetPlan& net) const = 0;
};

// The link the options ask for: the emulated link with --link-gbit R > 0, loopback otherwise.
std::unique_ptr<Link> MakeLink(const Options& opt);

std::unique_ptr<Link> MakeLoopbackLink();
// emulated_link.cc: R Gbit/s each way (tc tbf on a veth pair into a network namespace).
std::unique_ptr<Link> MakeEmulatedLink(double gbit);

}  // namespace bitpush::bench::pushpull
