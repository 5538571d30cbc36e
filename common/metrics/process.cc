#include "common/metrics/process.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <string_view>

#include "common/config/knob.h"

namespace bitpush::metrics {

namespace {

// /proc/self/statm: size resident shared text lib data dt, in pages.
bool ReadStatm(uint64_t* virtual_pages, uint64_t* resident_pages) {
  std::FILE* f = std::fopen("/proc/self/statm", "re");
  if (f == nullptr) return false;
  char text[256];
  const size_t n = std::fread(text, 1, sizeof(text) - 1, f);
  std::fclose(f);
  const std::string_view line(text, n);
  const size_t first = line.find(' ');
  if (first == std::string_view::npos) return false;
  const size_t second = line.find(' ', first + 1);
  if (second == std::string_view::npos) return false;
  return config::ParseUint(line.substr(0, first), virtual_pages) &&
         config::ParseUint(line.substr(first + 1, second - first - 1), resident_pages);
}

// Entries of /proc/self/fd less ".", ".." and the directory's own descriptor; -1 unreadable.
int64_t OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int64_t n = 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;
}

uint64_t PageBytes() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uint64_t>(page) : 4096;
}

}  // namespace

uint64_t ResidentBytes() {
  uint64_t virtual_pages = 0;
  uint64_t resident_pages = 0;
  if (!ReadStatm(&virtual_pages, &resident_pages)) return 0;
  return resident_pages * PageBytes();
}

void AddProcessMetrics(MetricSet& set) {
  uint64_t virtual_pages = 0;
  uint64_t resident_pages = 0;
  if (ReadStatm(&virtual_pages, &resident_pages)) {
    set.Gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
              resident_pages * PageBytes());
    set.Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.",
              virtual_pages * PageBytes());
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    const double seconds =
        static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
        static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    set.Counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                seconds);
  }
  if (const int64_t fds = OpenFds(); fds >= 0) {
    set.Gauge("process_open_fds", "Number of open file descriptors.", static_cast<uint64_t>(fds));
  }
}

void AddNodeInfo(MetricSet& set, const std::string& role, const std::string& rank) {
  Labels labels = {{"role", role}};
  if (!rank.empty()) labels.emplace_back("rank", rank);
  set.Gauge("bitpush_node_info", "The bitpush node this process is (always 1).", uint64_t{1},
            labels);
}

}  // namespace bitpush::metrics
