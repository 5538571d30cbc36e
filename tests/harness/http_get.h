// A minimal HTTP/1.0 client for tests of the metrics exporter (common/metrics/exporter.h): one
// request over a fresh loopback connection, the whole answer read until the server closes it.
// Every step is bounded (connect, send and receive time out), so a test never hangs on a
// server that does not answer.
//
// Owned by tests. Thread-safety: a pure function; any thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace bitpush::testing {

struct HttpAnswer {
  int status = 0;    // 0: no answer (connection refused, timeout, garbage)
  std::string head;  // status line and headers
  std::string body;
};

// Sends `METHOD PATH HTTP/1.0` (plus `extra_headers`, each ending in \r\n) to 127.0.0.1:port.
inline HttpAnswer HttpRequest(int port, const std::string& method, const std::string& path,
                              const std::string& extra_headers = "", int timeout_ms = 5000) {
  HttpAnswer answer;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return answer;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return answer;
  }
  const std::string request =
      method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n" + extra_headers + "\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return answer;
  }
  std::string all;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;  // closed, or timed out
    all.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t end = all.find("\r\n\r\n");
  if (all.rfind("HTTP/1.", 0) != 0 || end == std::string::npos) return answer;
  answer.status = std::atoi(all.c_str() + all.find(' ') + 1);
  answer.head = all.substr(0, end);
  answer.body = all.substr(end + 4);
  return answer;
}

inline HttpAnswer HttpGet(int port, const std::string& path) {
  return HttpRequest(port, "GET", path);
}

// The value of the sample `series` (name and labels exactly as rendered:
// `bitpush_worker_push_pulls_total{result="completed"}`) in Prometheus text, or -1 if absent.
inline double SampleValue(const std::string& text, const std::string& series) {
  size_t at = 0;
  while (at < text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    if (text.compare(at, series.size(), series) == 0 && at + series.size() < eol &&
        text[at + series.size()] == ' ') {
      return std::strtod(text.c_str() + at + series.size() + 1, nullptr);
    }
    at = eol + 1;
  }
  return -1;
}

}  // namespace bitpush::testing
