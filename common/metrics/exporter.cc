#include "common/metrics/exporter.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>

#include "common/logging.h"
#include "fmt/format.h"

namespace bitpush::metrics {

namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr int kListenBacklog = 16;

void LogFromMhd(void* cls, const char* format, va_list args) {
  char line[512];
  std::vsnprintf(line, sizeof(line), format, args);
  size_t n = std::strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  BP_LOG_DEBUG("{}: {}", static_cast<const ExporterOptions*>(cls)->label, line);
}

MHD_Result Answer(MHD_Connection* connection, unsigned int code, const std::string& body,
                  bool allow_get) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;  // out of memory: MHD closes the connection
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                          code == MHD_HTTP_OK ? kContentType : "text/plain; charset=utf-8");
  if (allow_get) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET");
  const MHD_Result queued = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return queued;
}

// Runs on libmicrohttpd's thread; nothing may throw into the C library.
MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* /*upload_data*/,
                         size_t* /*upload_data_size*/, void** /*con_cls*/) {
  const auto* registry = static_cast<const Registry*>(cls);
  try {
    if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0) {
      return Answer(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET is served\n", true);
    }
    if (std::strcmp(url, "/metrics") != 0) {
      return Answer(connection, MHD_HTTP_NOT_FOUND, "not found; metrics are at /metrics\n", false);
    }
    return Answer(connection, MHD_HTTP_OK, registry->Render(), false);
  } catch (const std::exception& e) {
    BP_LOG_WARN("metrics: rendering failed: {}", e.what());
    return MHD_NO;
  } catch (...) {
    return MHD_NO;
  }
}

struct BoundSocket {
  int fd = -1;
  uint16_t port = 0;
};

StatusOr<BoundSocket> Listen(const ExporterOptions& o) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, o.bind_address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(o.port);
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, o.bind_address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(o.port);
    len = sizeof(sockaddr_in6);
  } else {
    return InvalidArgumentError(fmt::format("{}: bind address '{}' is not an IPv4 or IPv6 literal",
                                            o.label, o.bind_address));
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return UnavailableError(fmt::format("{}: socket: {}", o.label, std::strerror(errno)));
  }
  const int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restart after TIME_WAIT
  if (addr.ss_family == AF_INET6)
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, kListenBacklog) != 0) {
    const int err = errno;
    close(fd);
    return UnavailableError(fmt::format("{}: cannot listen at {}:{}: {}", o.label, o.bind_address,
                                        o.port, std::strerror(err)));
  }
  BoundSocket s{fd, o.port};
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) == 0) {
    s.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  return s;
}

}  // namespace

Exporter::Exporter(ExporterOptions options, const Registry* registry)
    : options_(std::move(options)), registry_(registry) {}

StatusOr<std::unique_ptr<Exporter>> Exporter::Start(ExporterOptions options,
                                                    const Registry* registry) {
  if (registry == nullptr) return InvalidArgumentError(options.label + ": no registry");
  if (options.max_connections < 1) {
    return InvalidArgumentError(options.label + ": max_connections must be at least 1");
  }
  if (options.idle_timeout.count() < 1) {
    return InvalidArgumentError(options.label + ": idle_timeout must be at least 1 s");
  }
  if (options.request_memory_bytes < 4096) {
    return InvalidArgumentError(options.label + ": request_memory_bytes must be at least 4096");
  }
  BP_ASSIGN_OR_RETURN(BoundSocket socket, Listen(options));
  std::unique_ptr<Exporter> e(new Exporter(std::move(options), registry));
  e->port_ = socket.port;
  const ExporterOptions& o = e->options_;
  // The listening socket is handed over: MHD closes it on MHD_stop_daemon (and on failure).
  e->daemon_ = MHD_start_daemon(
      MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, /*port=*/0, /*apc=*/nullptr,
      /*apc_cls=*/nullptr, &HandleRequest, const_cast<Registry*>(registry),
      MHD_OPTION_LISTEN_SOCKET, socket.fd, MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned int>(o.max_connections), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned int>(o.idle_timeout.count()), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      o.request_memory_bytes, MHD_OPTION_EXTERNAL_LOGGER, &LogFromMhd,
      const_cast<ExporterOptions*>(&o), MHD_OPTION_END);
  if (e->daemon_ == nullptr) {
    // Not closed here: whether a failed start closed the handed-over socket is not documented,
    // and closing a number another thread may have reused is worse than one leaked descriptor
    // on a path that ends the process.
    return InternalError(fmt::format("{}: libmicrohttpd did not start at {}:{}", o.label,
                                     o.bind_address, socket.port));
  }
  BP_LOG_INFO("{}: serving {}", o.label, e->url());
  return e;
}

Exporter::~Exporter() {
  Stop();
}

void Exporter::Stop() {
  if (daemon_ != nullptr) {
    MHD_stop_daemon(daemon_);
    daemon_ = nullptr;
  }
}

std::string Exporter::url() const {
  const bool v6 = options_.bind_address.find(':') != std::string::npos;
  return fmt::format(v6 ? "http://[{}]:{}/metrics" : "http://{}:{}/metrics", options_.bind_address,
                     port_);
}

}  // namespace bitpush::metrics
