// The UCP context and the addresses of the ucx backend: the context an endpoint is built on
// (Active Messages and wake-up, TransportOptions::ucx_config over the UCX_* environment and
// bitpush's defaults; refused when its transports cannot reach an IP address at all),
// `ucx://HOST:PORT` parsed into a socket address and a bound one written back, and what UCX says
// about a client endpoint (ucp_ep_print_info's text, and whether its Active Messages go through
// shared memory). The endpoint (ucx_transport.h) and UcxViable use them; nothing here keeps state.
//
// Thread-safety: NewContext, ParseAddress and FormatAddress may run on any thread; EpInfo and
// AmOverSharedMemory read a UCP endpoint, so only the thread that owns its worker (the
// endpoint's progress thread) calls them.
#pragma once

#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace bitpush::transport::ucx_backend {

inline constexpr char kScheme[] = "ucx://";

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* Addr() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// ucx://HOST:PORT (HOST an IPv4 literal, [IPv6] or a name, resolved here: its first IPv4
// address, else its first IPv6 one).
StatusOr<SockAddr> ParseAddress(const std::string& address);

// The ucx:// address of a bound socket address (the listener's, with its real port).
std::string FormatAddress(const sockaddr_storage& ss);

// What a context is for: an endpoint's (which must reach ucx:// addresses), or a probe of
// whether UCX runs here at all (UcxViable; an endpoint's ucx_config may still change TLS).
enum class ContextUse { kEndpoint, kProbe };

// A UCP context configured for bitpush: Active Messages and wake-up, `config` applied over the
// UCX_* environment. For kEndpoint, InvalidArgument when none of the context's transports is on
// a network device (UCX_TLS=sm,self): no ucx:// address could be connected, and the error names
// TLS / NET_DEVICES, their knobs and what to add.
StatusOr<ucp_context_h> NewContext(const std::map<std::string, std::string>& config,
                                   ContextUse use);

// ucp_ep_print_info's text for `ep` (info.h ParseEpLanes reads it); nullopt when no memory
// stream could be opened.
std::optional<std::string> EpInfo(ucp_ep_h ep);

// Whether the Active Messages of `ep` go through shared memory (the peer is on this host).
bool AmOverSharedMemory(ucp_ep_h ep);

}  // namespace bitpush::transport::ucx_backend
