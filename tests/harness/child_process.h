// Real child processes for multi-process tests and benchmarks that run a cluster of the real
// binaries on loopback (tests/unit/scheduler_process_test.cc, pushpull_process_test.cc,
// `bitpush-bench pushpull`): spawn with output captured in a log file, poll and reap without
// blocking, bounded waits, peak RSS from wait4(), free loopback ports, a temp directory.
//
// Ownership: a Child owns its process. The destructor SIGKILLs and reaps a child that still
// runs, and every child gets PR_SET_PDEATHSIG = SIGKILL, so nothing outlives its parent even
// when the parent crashes. Header-only (tests and bitpush-bench both include it).
//
// Thread-safety: none; use a Child from one thread (the one that created it: the death signal
// follows the creating thread).
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace bitpush::testing {

using ProcessClock = std::chrono::steady_clock;

inline int64_t MsBetween(ProcessClock::time_point a, ProcessClock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last `lines` lines of `text`.
inline std::string TailLines(const std::string& text, int lines) {
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (int n = 0; n < lines && pos != std::string::npos && pos > 0; ++n) {
    pos = text.rfind('\n', pos - 1);
  }
  return pos == std::string::npos || pos == 0 ? text : text.substr(pos + 1);
}

// A fresh directory under /tmp (short path: ipc:// addresses must fit sun_path), removed with
// its contents by the destructor unless Keep() was called.
class TempDir {
 public:
  explicit TempDir(const char* prefix = "bp-proc") {
    std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
    const char* p = mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  ~TempDir() {
    if (!path_.empty() && !keep_) {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

// True when `port` of 127.0.0.1 binds now (then released).
inline bool TcpPortBinds(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return free;
}

// Reserves `port` for this process among every process of this user on this machine that
// takes ports through FreeTcpPort or bitpush.testing.free_ports (the Python side keeps the same
// files): under an flock of <dir>/lock, <dir>/<port> names the pid that holds it, and a port
// whose holder no longer lives is taken over. Concurrent test processes (ctest -j, pytest beside
// them) thus never hand out the same port while the first one's cluster may still be starting;
// a bind probe alone cannot promise that, because the port stays free until the child binds it.
// <dir> is /tmp/bitpush-ports-<uid> (BITPUSH_PORT_DIR overrides). True when reserved (or when
// the directory cannot be used: then the bind probe is all there is).
inline bool ReserveTcpPort(int port) {
  const char* env = getenv("BITPUSH_PORT_DIR");
  const std::string dir = env != nullptr && *env != '\0'
                              ? std::string(env)
                              : "/tmp/bitpush-ports-" + std::to_string(getuid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return true;
  const int lock = open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) return true;
  if (flock(lock, LOCK_EX) != 0) {
    close(lock);
    return true;
  }
  const std::string path = dir + "/" + std::to_string(port);
  bool ours = true;
  {
    std::ifstream in(path);
    long holder = 0;
    if (in >> holder && holder > 0 && holder != static_cast<long>(getpid()) &&
        (kill(static_cast<pid_t>(holder), 0) == 0 || errno == EPERM)) {
      ours = false;  // a live process holds it
    }
  }
  if (ours) std::ofstream(path, std::ios::trunc) << getpid() << "\n";
  flock(lock, LOCK_UN);
  close(lock);
  return ours;
}

// A free TCP port on 127.0.0.1 below Linux's ephemeral range (32768-60999), so it never
// collides with the kernel's outgoing connections: the next port of a per-process walk of
// 20000-32767 that binds now (then released) and that ReserveTcpPort reserves for this process.
// With `also_offset` > 0, port + also_offset must be below 32768, bind and be reserved too (a
// ucx node's data port). -1 when none is left.
inline int FreeTcpPort(int also_offset = 0) {
  constexpr int kFirst = 20000;
  constexpr int kCount = 32768 - kFirst;
  static std::atomic<int> next{static_cast<int>((getpid() * 7919u) % kCount)};
  for (int tries = 0; tries < kCount; ++tries) {
    const int port = kFirst + next.fetch_add(1) % kCount;
    if (also_offset > 0 && (port + also_offset >= 32768 || !TcpPortBinds(port + also_offset) ||
                            !ReserveTcpPort(port + also_offset))) {
      continue;
    }
    if (TcpPortBinds(port) && ReserveTcpPort(port)) return port;
  }
  return -1;
}

// One child process (execv of argv[0]) with stdout and stderr in one log file.
class Child {
 public:
  Child(std::string label, const std::vector<std::string>& argv, std::string log)
      : label_(std::move(label)), log_(std::move(log)) {
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const char* log_path = log_.c_str();
    pid_ = fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent
      const int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
      execv(args[0], args.data());
      static const char kMsg[] = "execv failed\n";
      (void)!write(2, kMsg, sizeof(kMsg) - 1);
      _exit(127);
    }
    started_ = ProcessClock::now();
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  const std::string& label() const { return label_; }
  pid_t pid() const { return pid_; }
  bool spawned() const { return pid_ > 0; }
  bool exited() const { return exited_; }
  ProcessClock::time_point started_at() const { return started_; }
  ProcessClock::time_point exited_at() const { return exited_at_; }
  // The exit status, or 128 + the signal that ended it; -1 while it runs.
  int exit_code() const { return exit_code_; }
  // "exit 3", "killed by signal 9", "running".
  std::string ExitDescription() const {
    if (!exited_) return "running";
    if (exit_code_ > 128) return "killed by signal " + std::to_string(exit_code_ - 128);
    return "exit " + std::to_string(exit_code_);
  }
  // Peak resident set size in KiB (wait4's ru_maxrss); 0 until reaped.
  int64_t peak_rss_kib() const { return peak_rss_kib_; }
  const std::string& log_path() const { return log_; }
  std::string output() const { return ReadFile(log_); }

  void Signal(int sig) {
    if (pid_ > 0 && !exited_) kill(pid_, sig);
  }

  // Reaps the child if it exited (non-blocking); true once it has.
  bool Poll() {
    if (exited_ || pid_ <= 0) return exited_;
    int status = 0;
    rusage usage{};
    const pid_t r = wait4(pid_, &status, WNOHANG, &usage);
    if (r == pid_) {
      exited_ = true;
      exited_at_ = ProcessClock::now();
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      peak_rss_kib_ = usage.ru_maxrss;
    }
    return exited_;
  }

  // SIGKILLs the child if it runs and reaps it (blocking: a SIGKILLed process exits).
  void Kill() {
    Signal(SIGKILL);
    while (!Poll()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  std::string label_;
  std::string log_;
  pid_t pid_ = -1;
  ProcessClock::time_point started_;
  bool exited_ = false;
  ProcessClock::time_point exited_at_;
  int exit_code_ = -1;
  int64_t peak_rss_kib_ = 0;
};

// Polls (every 5 ms) until every child exited or `deadline`; true if all exited.
inline bool WaitAll(const std::vector<Child*>& children, ProcessClock::time_point deadline) {
  for (;;) {
    bool all = true;
    for (Child* c : children) all = c->Poll() && all;
    if (all) return true;
    if (ProcessClock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// For a failed test's report: each child's label, how it ended, and its output (the last
// `tail_lines` lines; 0 = all of it).
inline std::string DescribeChildren(const std::vector<std::unique_ptr<Child>>& children,
                                    int tail_lines = 0) {
  std::string out;
  for (const auto& c : children) {
    out += "---- " + c->label() + " (" + c->ExitDescription() + ") ----\n" +
           (tail_lines > 0 ? TailLines(c->output(), tail_lines) : c->output());
  }
  return out;
}

// Polls `child`'s output until it contains `text`, at most `timeout`.
inline bool WaitForOutput(const Child& child, const std::string& text,
                          std::chrono::milliseconds timeout) {
  const ProcessClock::time_point deadline = ProcessClock::now() + timeout;
  while (ProcessClock::now() < deadline) {
    if (child.output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace bitpush::testing
