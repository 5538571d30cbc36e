#include "bench/pushpull/signal_cleanup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

namespace bitpush::bench::pushpull {
namespace {

// For the signal handler: what to remove if the run is interrupted (async-signal-safe: fork,
// execv, waitpid only). Empty: nothing of that kind to remove.
char g_ip_tool[512];
char g_netns[64];
char g_veth[32];
char g_rm_tool[512];
char g_keys_dir[512];

void RunOnSignal(const char* const* argv) {
  const pid_t p = fork();
  if (p == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  if (p > 0) waitpid(p, nullptr, 0);
}

void CleanUpOnSignal(int sig) {
  if (g_keys_dir[0] != '\0') {
    const char* const argv[] = {g_rm_tool, "-rf", g_keys_dir, nullptr};
    RunOnSignal(argv);
  }
  if (g_netns[0] != '\0') {
    const char* const link[] = {g_ip_tool, "link", "del", g_veth, nullptr};
    const char* const netns[] = {g_ip_tool, "netns", "del", g_netns, nullptr};
    RunOnSignal(link);
    RunOnSignal(netns);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void CleanUpOnSignals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, CleanUpOnSignal);
}

}  // namespace

void RemoveNetnsOnSignal(const std::string& ip_tool, const std::string& netns,
                         const std::string& veth) {
  std::snprintf(g_ip_tool, sizeof(g_ip_tool), "%s", ip_tool.c_str());
  std::snprintf(g_netns, sizeof(g_netns), "%s", netns.c_str());
  std::snprintf(g_veth, sizeof(g_veth), "%s", veth.c_str());
  CleanUpOnSignals();
}

void ForgetNetnsOnSignal() {
  g_netns[0] = '\0';
}

bool RemoveDirOnSignal(const std::string& rm_tool, const std::string& dir) {
  if (rm_tool.empty() || dir.size() >= sizeof(g_keys_dir) || rm_tool.size() >= sizeof(g_rm_tool)) {
    return false;
  }
  std::snprintf(g_rm_tool, sizeof(g_rm_tool), "%s", rm_tool.c_str());
  std::snprintf(g_keys_dir, sizeof(g_keys_dir), "%s", dir.c_str());
  CleanUpOnSignals();
  return true;
}

void ForgetDirOnSignal() {
  g_keys_dir[0] = '\0';
}

}  // namespace bitpush::bench::pushpull
