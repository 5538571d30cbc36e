// What UCX is and finds on this machine, and what it chose for a connection: the library's
// version, the transports and devices its UCT components offer (what `ucx_info -d` lists), the
// RDMA devices the kernel exposes under /sys/class/infiniband with their link layer
// (InfiniBand, or Ethernet = RoCE), and the lanes of a UCP endpoint as ucp_ep_print_info
// prints them (transport.h DescribePeerEndpoint). For `bitpush-bench transport --list` and
// for reporting which path a connection took, and for checking at an endpoint's start that its
// context can reach a ucx:// address at all (context.h NewContext).
//
// Pure functions, or queries that open and close their own UCT objects; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace bitpush::transport::ucx_backend {

// One transport on one device, as a UCT memory domain offers it ("tcp" on "lo").
struct UcxResource {
  std::string component;  // the UCT component ("tcp", "ib", "posix", ...)
  std::string md;         // its memory domain ("tcp", "mlx5_0", "posix", ...)
  std::string transport;  // "tcp", "rc_mlx5", "posix", "cma", "self", ...
  std::string device;     // "lo", "eth0", "mlx5_0:1", "memory", ...
  std::string type;       // "net", "shm", "acc" (accelerator), "self"
};

// One port of an RDMA device (/sys/class/infiniband/DEV/ports/PORT).
struct RdmaPort {
  std::string device;      // "mlx5_0"
  std::string port;        // "1"
  std::string link_layer;  // "InfiniBand" or "Ethernet" (RoCE); "" when unreadable
  std::string state;       // "4: ACTIVE"; "" when unreadable
};

struct UcxInventory {
  std::string version;                             // ucp_get_version_string(): "1.13.1"
  std::vector<std::string> components;             // every UCT component UCX loaded
  std::vector<std::string> components_without_md;  // loaded, but no memory domain (no device)
  std::vector<UcxResource> resources;
  std::vector<RdmaPort> rdma_ports;
  // Empty when rdma_ports is not; otherwise why there is none, e.g. "no RDMA device:
  // /sys/class/infiniband is absent".
  std::string rdma_absent_reason;
};

// Queries UCT (components, memory domains, their transport resources; UCX_* environment
// applies to the memory domains' configuration) and reads `sysfs_infiniband`. Unavailable
// when UCT cannot list its components.
StatusOr<UcxInventory> QueryUcxInventory(
    const std::string& sysfs_infiniband = "/sys/class/infiniband");

// The RDMA ports under `sysfs_infiniband`; `*why_none` says why there are none.
std::vector<RdmaPort> ReadRdmaPorts(const std::string& sysfs_infiniband, std::string* why_none);

// UCX's NET_DEVICES for endpoints whose peers are on this host: "lo" and every RDMA port under
// `sysfs_infiniband` ("lo,mlx5_0:1"), so UCX neither adds a rendezvous rail through another
// interface's address (tcp/eth0, which loopback tests must not use) nor loses the RDMA device.
std::string LoopbackNetDevices(const std::string& sysfs_infiniband = "/sys/class/infiniband");

// The resources a UCP context uses, from ucp_context_print_info's "resource N : md M dev D
// flags -- TL/DEV" lines: transport and device set, the other fields empty. What UCX_TLS and
// UCX_NET_DEVICES left of QueryUcxInventory's resources.
std::vector<UcxResource> ParseContextResources(std::string_view context_info);

// One lane of a UCP endpoint, from ucp_ep_print_info's "lane[N]:  R:TL/DEV.P md[M] ... OPS".
// The connection manager's lane ("lane[0]: cm rdmacm": it carries no data) is left out.
struct UcxLane {
  int index = 0;
  std::string transport;  // "tcp", "posix", "cma", "rc_mlx5"
  std::string device;     // "lo", "memory", "mlx5_0:1"
  std::string ops;        // what UCP uses the lane for, as printed: "am am_bw#0 wireup"
};
std::vector<UcxLane> ParseEpLanes(std::string_view ep_info);
// The distinct "transport/device" of `lanes`, in lane order, comma-separated ("tcp/lo",
// "posix/memory,cma/memory,tcp/lo").
std::string LaneTransports(const std::vector<UcxLane>& lanes);

}  // namespace bitpush::transport::ucx_backend
