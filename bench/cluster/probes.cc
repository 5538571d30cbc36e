#include "bench/cluster/probes.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>

#include "fmt/format.h"

namespace bitpush::bench::cluster {

int64_t ResidentKib() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0;
  int64_t resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int64_t ThreadCount() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::strtoll(line.c_str() + 8, nullptr, 10);
  }
  return 0;
}

int64_t OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int64_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory's own descriptor
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

StatusOr<double> ThreadCpuSeconds(pthread_t thread) {
  clockid_t clock;
  if (const int err = pthread_getcpuclockid(thread, &clock); err != 0) {
    return InternalError(fmt::format("pthread_getcpuclockid: {}", std::strerror(err)));
  }
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) {
    return InternalError(
        fmt::format("clock_gettime of a thread's CPU clock: {}", std::strerror(errno)));
  }
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

bool LoopbackPortFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(fd, 1) == 0;
  close(fd);
  return free;
}

std::vector<pid_t> ThreadIds() {
  std::vector<pid_t> out;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') out.push_back(static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10)));
  }
  closedir(dir);
  return out;
}

StatusOr<double> TidCpuSeconds(pid_t tid) {
  // The thread's CPU-time clock, as pthread_getcpuclockid makes it for a pthread_t: the kernel's
  // clock id for (tid, CPUCLOCK_SCHED, per thread) (linux/posix-timers.h, a stable ABI).
  const auto clock = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6);
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) {
    return InternalError(
        fmt::format("clock_gettime of thread {}'s CPU clock: {}", tid, std::strerror(errno)));
  }
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

StatusOr<int64_t> RaiseFdLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) {
    return InternalError(fmt::format("getrlimit(RLIMIT_NOFILE): {}", std::strerror(errno)));
  }
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return InternalError(fmt::format("raising RLIMIT_NOFILE from {} to {}: {}", r.rlim_cur,
                                       r.rlim_max, std::strerror(errno)));
    }
    r = raised;
  }
  return r.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(r.rlim_cur);
}

}  // namespace bitpush::bench::cluster
