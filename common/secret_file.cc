#include "common/secret_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "fmt/format.h"

namespace bitpush {

namespace {

// Closes the descriptor on every return path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int Get() const { return fd_; }

 private:
  const int fd_;
};

}  // namespace

StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view what) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.Get() < 0) {
    return NotFoundError(fmt::format("{} {}: cannot open: {}", what, path, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.Get(), &st) != 0) {
    return UnavailableError(fmt::format("{} {}: fstat: {}", what, path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(
        fmt::format("{} {}: not a regular file (a secret is read from a plain file)", what, path));
  }
  const unsigned mode = static_cast<unsigned>(st.st_mode) & 07777u;
  if ((mode & 077u) != 0) {
    return FailedPreconditionError(fmt::format(
        "{} {} has mode {:04o}: its group or others may access it (a secret file must be its "
        "owner's alone: no bit of mode & 077); fix it with `chmod 600 {}`",
        what, path, mode, path));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxSecretFileBytes) {
    return InvalidArgumentError(
        fmt::format("{} {}: {} bytes, more than a secret file holds (at "
                    "most {} bytes); is it the right file?",
                    what, path, st.st_size, kMaxSecretFileBytes));
  }
  std::string content;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.Get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return UnavailableError(fmt::format("{} {}: read: {}", what, path, std::strerror(errno)));
    }
    if (n == 0) break;
    content.append(buf, static_cast<size_t>(n));
    if (content.size() > kMaxSecretFileBytes) {  // it grew after fstat
      return InvalidArgumentError(fmt::format(
          "{} {}: more than {} bytes, more than a secret file holds; is it the right file?", what,
          path, kMaxSecretFileBytes));
    }
  }
  return content;
}

}  // namespace bitpush
