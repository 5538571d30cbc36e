#include "common/transport/ucx/context.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/transport/ucx/info.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

// Whether `config`'s TLS (if any) allows UCX's shared-memory transports: no TLS, an exclusion
// list ("^tcp"), or one naming them or an alias that includes them.
bool MayUseSharedMemory(const std::map<std::string, std::string>& config) {
  auto tls = config.find("TLS");
  if (tls == config.end() || tls->second.empty() || tls->second[0] == '^') return true;
  size_t start = 0;
  while (start <= tls->second.size()) {
    size_t end = tls->second.find(',', start);
    if (end == std::string::npos) end = tls->second.size();
    const std::string name = tls->second.substr(start, end - start);
    for (const char* shm : {"all", "sm", "shm", "mm", "posix", "sysv"}) {
      if (name == shm) return true;
    }
    start = end + 1;
  }
  return false;
}

// What `print` writes to a stream, as text; nullopt when no memory stream could be opened.
template <typename Print>
std::optional<std::string> Printed(Print print) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return std::nullopt;
  print(f);
  std::fclose(f);
  std::string out(text, size);
  std::free(text);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  return out;
}

// The value of UCX_<name> in `cfg` (the UCX_* environment with ucx_config applied), as
// ucp_config_print writes it.
std::string ConfigValue(const ucp_config_t* cfg, const std::string& name) {
  auto print = [&](FILE* f) { ucp_config_print(cfg, f, nullptr, UCS_CONFIG_PRINT_CONFIG); };
  const std::string text = Printed(print).value_or("");
  const std::string prefix = "UCX_" + name + "=";
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (text.compare(at, prefix.size(), prefix) == 0) {
      return text.substr(at + prefix.size(), end - at - prefix.size());
    }
    at = end + 1;
  }
  return "";
}

// OK when `context` has a transport on a network device: a ucx:// address is an IP address
// and port, which UCX's connection managers (tcp, rdmacm) connect only through a transport on
// the device the address routes to (tcp on an interface, or an RDMA device's). Shared memory
// and self alone (UCX_TLS=sm,self) would leave every connection unreachable: UCX creates the
// listener, then fails each connection attempt with "Destination is unreachable", which the
// endpoint retries until its caller's wait runs out. InvalidArgument naming the knobs instead.
// (Which device a peer's address routes to is known only when connecting; this checks that
// some peer can be reached at all.) UCT's device types decide "network device"; when UCT
// cannot list them, nothing is checked.
Status CheckReachesSockaddrs(ucp_context_h context, const ucp_config_t* cfg) {
  StatusOr<UcxInventory> inventory = QueryUcxInventory();
  const std::optional<std::string> info =
      Printed([&](FILE* f) { ucp_context_print_info(context, f); });
  if (!inventory.ok() || !info) return Status::Ok();
  const std::vector<UcxResource> used = ParseContextResources(*info);
  std::string names;
  for (const UcxResource& r : used) {
    for (const UcxResource& known : inventory->resources) {
      if (known.transport == r.transport && known.device == r.device && known.type == "net") {
        return Status::Ok();
      }
    }
    names += (names.empty() ? "" : ", ") + r.transport + "/" + r.device;
  }
  const std::string tls = ConfigValue(cfg, "TLS");
  const std::string devices = ConfigValue(cfg, "NET_DEVICES");
  std::string fix = "set cluster.ucx.tls (or UCX_TLS) to include tcp, e.g. \"sm,self,tcp\"";
  if (!devices.empty() && devices != "all") {
    fix += ", and let cluster.ucx.net_devices (or UCX_NET_DEVICES) name a network interface";
  }
  return InvalidArgumentError(fmt::format(
      "UCX's transports here cannot reach any ucx:// address: with UCX_TLS={} and "
      "UCX_NET_DEVICES={} UCX uses {}, none on a network device (a ucx:// address is an IP "
      "address and port, which UCX connects through tcp or an RDMA device): {}",
      tls.empty() ? "(unset)" : tls, devices.empty() ? "(unset)" : devices,
      names.empty() ? "no transport" : names, fix));
}

}  // namespace

std::optional<std::string> EpInfo(ucp_ep_h ep) {
  return Printed([&](FILE* f) { ucp_ep_print_info(ep, f); });
}

bool AmOverSharedMemory(ucp_ep_h ep) {
  const std::optional<std::string> info = EpInfo(ep);
  if (!info) return false;
  for (const UcxLane& lane : ParseEpLanes(*info)) {
    const bool shm = lane.transport == "sysv" || lane.transport == "posix" ||
                     lane.transport == "xpmem" || lane.transport == "knem";
    if (shm && (" " + lane.ops + " ").find(" am ") != std::string::npos) return true;
  }
  return false;
}

StatusOr<SockAddr> ParseAddress(const std::string& address) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(
        fmt::format("address '{}' is not ucx://HOST:PORT ({})", address, why));
  };
  if (address.rfind(kScheme, 0) != 0) return bad("scheme");
  const std::string rest = address.substr(sizeof(kScheme) - 1);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) return bad("no port");
  std::string host = rest.substr(0, colon);
  const std::string port_text = rest.substr(colon + 1);
  if (port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return bad("port");
  const int port = std::stoi(port_text);
  if (port > 65535) return bad("port above 65535");
  if (host.front() == '[') {
    if (host.back() != ']') return bad("unterminated [");
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int err = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (err != 0 || found == nullptr) {
    return bad(fmt::format("host '{}' does not resolve: {}", host, gai_strerror(err)));
  }
  const addrinfo* pick = nullptr;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
    if (a->ai_family == AF_INET6 && pick == nullptr) pick = a;
  }
  SockAddr out;
  if (pick != nullptr) {
    std::memcpy(&out.storage, pick->ai_addr, pick->ai_addrlen);
    out.length = pick->ai_addrlen;
  }
  freeaddrinfo(found);
  if (pick == nullptr) return bad(fmt::format("host '{}' has no IP address", host));
  if (out.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&out.storage)->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in6*>(&out.storage)->sin6_port = htons(static_cast<uint16_t>(port));
  }
  return out;
}

std::string FormatAddress(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return fmt::format("{}{}:{}", kScheme, text, ntohs(in->sin_port));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
  return fmt::format("{}[{}]:{}", kScheme, text, ntohs(in6->sin6_port));
}

StatusOr<ucp_context_h> NewContext(const std::map<std::string, std::string>& config,
                                   ContextUse use) {
  ucp_config_t* cfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
  if (s != UCS_OK)
    return UnavailableError(fmt::format("ucp_config_read: {}", ucs_status_string(s)));
  // A restarted endpoint listens on its old port again at once (ZeroMQ does the same), even
  // while connections of its previous life linger in TIME_WAIT; a port that a live endpoint
  // listens on stays refused. `config` may say otherwise.
  // UCX 1.13 leaves its shared-memory transports (posix, sysv) out of endpoints that need peer
  // failure handling unless MM_ERROR_HANDLING is on (openucx/ucx#8477): without it, two
  // endpoints on one host would talk over TCP loopback. (Not set when TLS rules them out: UCX
  // would warn about a setting no transport reads.)
  // Shared-memory segments of 32 KiB instead of UCX's 8 KiB: without a zero-copy transport
  // (CMA, KNEM, XPMEM) UCX moves a rendezvous message through the FIFO in segment-sized
  // fragments, and a fourth of the fragments is 1.3-1.5x the push/pull goodput (1 worker x 1
  // server, 100 MB; docs/transport-ucx.md). 64 KiB and above trip an assertion in UCX 1.13 (a
  // fragment's length is 16 bits wide).
  // Each of these defaults yields to its UCX_* environment variable and to `config`.
  // (RNDV_THRESH stays UCX's: eager sends of large messages stream one way faster over tcp and
  // shared memory here, but a push/pull cluster, both ways at once, runs at 0.4x of rendezvous.)
  std::map<std::string, std::string> defaults = {{"CM_REUSEADDR", "y"}};
  if (MayUseSharedMemory(config)) {
    defaults["MM_ERROR_HANDLING"] = "y";
    defaults["MM_SEG_SIZE"] = "32k";
  }
  std::map<std::string, std::string> entries;
  for (const auto& [key, value] : defaults) {
    if (std::getenv(("UCX_" + key).c_str()) == nullptr) entries[key] = value;
  }
  for (const auto& [key, value] : config) entries[key] = value;
  for (const auto& [key, value] : entries) {
    s = ucp_config_modify(cfg, key.c_str(), value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(cfg);
      return InvalidArgumentError(
          fmt::format("ucx_config {}={}: {}", key, value, ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "bitpush";
  ucp_context_h context = nullptr;
  s = ucp_init(&params, cfg, &context);
  if (s != UCS_OK) {
    ucp_config_release(cfg);
    return UnavailableError(fmt::format("ucp_init: {}", ucs_status_string(s)));
  }
  const Status reaches =
      use == ContextUse::kEndpoint ? CheckReachesSockaddrs(context, cfg) : Status::Ok();
  ucp_config_release(cfg);
  if (!reaches.ok()) {
    ucp_cleanup(context);
    return reaches;
  }
  return context;
}

}  // namespace bitpush::transport::ucx_backend
