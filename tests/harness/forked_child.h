// ForkedChild: a forked copy of the test process running one function, optionally as another
// user, with a pipe for lines to the parent (local IPC tests: a second process of the same or
// another uid talking to a socket). Unlike testing::Child (child_process.h) it execs nothing:
// the body is a lambda of the test.
//
// Ownership: the child dies with the parent (PR_SET_PDEATHSIG) and is SIGKILLed and reaped by
// the destructor. Header-only. Thread-safety: none; one test thread uses it.
#pragma once

#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace bitpush::testing {

class ForkedChild {
 public:
  using Body = std::function<int(ForkedChild&)>;

  // `body` runs in the child; its return value is the exit code, passed to `exit` (atexit
  // handlers run) when `run_atexit`, else to `_exit`.
  explicit ForkedChild(const Body& body, bool run_atexit = false)
      : ForkedChild(std::nullopt, body, run_atexit) {}
  // The same as user `as` (setgroups, setgid, setuid to it first; exit code 100 if that fails:
  // the test must run as root).
  ForkedChild(std::optional<uid_t> as, const Body& body, bool run_atexit = false) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(fds[0]);
      write_fd_ = fds[1];
      if (as && (setgroups(0, nullptr) != 0 || setgid(*as) != 0 || setuid(*as) != 0)) _exit(100);
      const int code = body(*this);
      if (run_atexit) exit(code);
      _exit(code);
    }
    close(fds[1]);
    read_fd_ = fds[0];
  }
  ~ForkedChild() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (read_fd_ >= 0) close(read_fd_);
  }
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;

  pid_t pid() const { return pid_; }

  // Child side: one line to the parent.
  void Tell(const std::string& line) {
    const std::string l = line + "\n";
    (void)!write(write_fd_, l.data(), l.size());
  }
  // Parent side: the next line (empty on EOF or after `timeout`).
  std::string NextLine(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline = Clock::now() + timeout;
    for (;;) {
      if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
        std::string line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return line;
      }
      pollfd p{read_fd_, POLLIN, 0};
      const int left = static_cast<int>(std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
      if (poll(&p, 1, left) <= 0) return "";
      char buf[256];
      const ssize_t n = read(read_fd_, buf, sizeof(buf));
      if (n <= 0) return "";
      buffered_.append(buf, static_cast<size_t>(n));
    }
  }
  // Parent side: waits (bounded) for the exit; the raw wait status, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }
  // The same as an exit code: the child's, 128 + the signal that killed it, or -1 on timeout.
  int WaitExitCode(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    const int status = Wait(timeout);
    if (status == -1) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int read_fd_ = -1;
  int write_fd_ = -1;
  bool reaped_ = false;
  std::string buffered_;
};

}  // namespace bitpush::testing
