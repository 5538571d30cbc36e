// Exporter: serves a Registry as Prometheus text over HTTP (`GET /metrics`), with
// libmicrohttpd (docs/metrics.md).
//
// Bounded by construction: one thread (libmicrohttpd's internal polling thread, epoll) serves
// every connection and runs the registry's collectors; at most `max_connections` connections
// at once (more are accepted and closed at once); a connection idle for `idle_timeout` is
// closed; a request's line and headers must fit in `request_memory_bytes` (else 431/414).
// `GET /metrics` (any query string) answers 200 with the rendered registry; any other path
// 404; any other method 405 (with `Allow: GET`), its body never read.
//
// The listening socket is bound by Start itself, so a port that is taken fails Start with the
// address and the system's reason (the caller names the YAML key).
//
// Ownership: the caller owns the Exporter and the Registry, which must outlive it.
// Thread-safety: Start/Stop/the destructor from the owning thread; port() and url() from any.
// After Stop (or the destructor) returns, no collector runs on the exporter's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/metrics/registry.h"
#include "common/status.h"

struct MHD_Daemon;

namespace bitpush::metrics {

struct ExporterOptions {
  // An IPv4 or IPv6 literal to listen on ("127.0.0.1", "0.0.0.0", "::1", "::").
  std::string bind_address = "127.0.0.1";
  // The TCP port; 0 = any free port (the kernel's choice; see port()).
  uint16_t port = 0;
  // Connections served at once (>= 1).
  uint32_t max_connections = 8;
  // A connection idle (no request in progress, or a request not advancing) this long is
  // closed. Whole seconds, >= 1.
  std::chrono::seconds idle_timeout{5};
  // Memory per connection for the request line, headers and reading (bytes, >= 4096).
  size_t request_memory_bytes = 16384;
  // Names the exporter in messages ("server 0 metrics").
  std::string label = "metrics";
};

class Exporter {
 public:
  // Binds and starts serving. InvalidArgument for bad options (naming the field); Unavailable
  // "LABEL: cannot listen at ADDR:PORT: <reason>" when the socket cannot be bound.
  static StatusOr<std::unique_ptr<Exporter>> Start(ExporterOptions options,
                                                   const Registry* registry);

  ~Exporter();  // Stop()
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  // Closes the socket and every connection, joins the thread. Idempotent.
  void Stop();

  // The port it listens on (the kernel's choice when the options said 0).
  uint16_t port() const { return port_; }
  // "http://ADDR:PORT/metrics" (IPv6 bracketed).
  std::string url() const;

 private:
  Exporter(ExporterOptions options, const Registry* registry);

  const ExporterOptions options_;
  const Registry* const registry_;
  MHD_Daemon* daemon_ = nullptr;
  uint16_t port_ = 0;
};

}  // namespace bitpush::metrics
