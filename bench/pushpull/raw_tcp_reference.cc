#include "bench/pushpull/raw_tcp_reference.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench/pushpull/options.h"

namespace bitpush::bench::pushpull {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void AddRawTcpFields(JsonRecord& rec, const RawTcpFigures& raw, double goodput_gbps,
                     double link_gbit) {
  rec.Add("raw_tcp_gbps", raw.best_gbps)
      .Add("raw_tcp_median_gbps", raw.median_gbps)
      .Add("ratio_to_raw_tcp", goodput_gbps / raw.best_gbps)
      .Add("raw_tcp_duplex_gbps", raw.duplex_best_gbps)
      .Add("raw_tcp_duplex_median_gbps", raw.duplex_median_gbps)
      .Add("ratio_to_raw_tcp_duplex", goodput_gbps / raw.duplex_best_gbps)
      .Add("link_gbit", link_gbit);
}

Status RawTcpReference::Start(const NetPlan& net) {
  int port = 0;
  std::string error;
  const int listener = ListenTcp(net.root_ip, &port, &error);
  if (listener < 0) return UnavailableError(error);
  pid_ = fork();
  if (pid_ < 0) {
    close(listener);
    return InternalError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    close(listener);
    if (!net.netns.empty()) {
      const std::string path = "/var/run/netns/" + net.netns;
      const int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
        std::fprintf(stderr, "%s: raw TCP peer: cannot enter %s: %s\n", kName, path.c_str(),
                     std::strerror(errno));
        _exit(1);
      }
      close(ns);
    }
    const int fd = ConnectTcp(net.root_ip, port, &error);
    if (fd >= 0) RawPeer(fd);
    _exit(fd >= 0 ? 0 : 1);
  }
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, 10000) != 1) {
    close(listener);
    return TimeoutError("the raw TCP peer did not connect within 10 s");
  }
  fd_ = accept(listener, nullptr, nullptr);
  close(listener);
  if (fd_ < 0) return UnavailableError(std::string("accept: ") + std::strerror(errno));
  SetNoDelay(fd_);
  return Status::Ok();
}

Status RawTcpReference::Measure(uint64_t total, uint64_t message, int reps, bool warmup,
                                RawMode mode) {
  message = std::max<uint64_t>(1, std::min(message, total));
  if (src_.size() != message) {
    src_.resize(message);
    for (size_t i = 0; i < message; ++i) src_[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  }
  const uint64_t count = (total + message - 1) / message;
  Series& series = mode == kRawDuplex ? duplex_ : stream_;
  for (int rep = 0; rep < reps; ++rep) {
    const double s = mode == kRawDuplex ? RawDuplex(fd_, src_, count, &scratch_)
                                        : RawStream(fd_, kRawStream, src_, count);
    if (std::isnan(s)) {
      return UnavailableError(
          std::string(mode == kRawDuplex ? "raw TCP duplex exchange" : "raw TCP stream") +
          ": the peer went away");
    }
    const double gbps = static_cast<double>(count * message) / s / 1e9;
    if (warmup) continue;
    series.best = std::max(series.best, gbps);
    series.all.push_back(gbps);
  }
  return Status::Ok();
}

Status RawTcpReference::MeasureBoth(uint64_t total, uint64_t message, int reps, bool warmup) {
  for (RawMode mode : {kRawStream, kRawDuplex}) {
    if (warmup) BP_RETURN_IF_ERROR(Measure(total, message, 1, /*warmup=*/true, mode));
    BP_RETURN_IF_ERROR(Measure(total, message, reps, /*warmup=*/false, mode));
  }
  return Status::Ok();
}

RawTcpFigures RawTcpReference::Figures() const {
  RawTcpFigures f;
  f.best_gbps = stream_.best;
  f.median_gbps = stream_.Median();
  f.duplex_best_gbps = duplex_.best;
  f.duplex_median_gbps = duplex_.Median();
  return f;
}

void RawTcpReference::Stop() {
  if (fd_ >= 0) {
    const RawHeader quit{kRawQuit, 0, 0};
    (void)WriteAll(fd_, &quit, sizeof(quit));
    close(fd_);
    fd_ = -1;
  }
  if (pid_ > 0) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    pid_ = -1;
  }
}

double RawTcpReference::Series::Median() const {
  std::vector<double> v = all;
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

}  // namespace bitpush::bench::pushpull
