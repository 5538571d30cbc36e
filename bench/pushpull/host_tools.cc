#include "bench/pushpull/host_tools.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace bitpush::bench::pushpull {

std::string FindTool(const std::string& name) {
  std::string path = getenv("PATH") != nullptr ? getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t colon = path.find(':', pos);
    const std::string dir = path.substr(pos, colon == std::string::npos ? colon : colon - pos);
    if (dir.empty()) {
      if (colon == std::string::npos) break;
      pos = colon + 1;
      continue;
    }
    std::string candidate = dir;
    candidate += "/";
    candidate += name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return "";
}

int Shell(const std::string& command, std::string* out) {
  FILE* f = popen((command + " 2>&1").c_str(), "r");  // NOLINT(bugprone-command-processor)
  if (f == nullptr) return -1;
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), f) != nullptr) text += buf;
  const int status = pclose(f);
  if (out != nullptr) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace bitpush::bench::pushpull
