#include "worker/ipc/socket_dir.h"

#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace bitpush::worker::ipc {
namespace {

std::string WithoutTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string EnvDirectory(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return "";
  std::string s(v);
  // systemd joins several RuntimeDirectory= entries with ':'; the first is ours.
  if (size_t colon = s.find(':'); colon != std::string::npos) s.resize(colon);
  return WithoutTrailingSlashes(s);
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return WithoutTrailingSlashes(path.substr(0, slash));
}

std::string Mode(const struct stat& st) {
  return fmt::format("{:04o}", st.st_mode & 07777);
}

Status CheckPrivateDirectory(const std::string& dir, bool create) {
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err != ENOENT) {
      return FailedPreconditionError(
          fmt::format("cannot use the socket directory {}: {}", dir, std::strerror(err)));
    }
    if (!create) {
      return NotFoundError(fmt::format("the socket directory {} does not exist yet", dir));
    }
    // 0700 whatever the umask leaves; a directory someone else made meanwhile is checked below.
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return FailedPreconditionError(
          fmt::format("cannot create the socket directory {}: {}", dir, std::strerror(errno)));
    }
    if (lstat(dir.c_str(), &st) != 0) {
      return FailedPreconditionError(
          fmt::format("cannot use the socket directory {}: {}", dir, std::strerror(errno)));
    }
  }
  const std::string refuse = fmt::format("refusing the private socket directory {}", dir);
  if (S_ISLNK(st.st_mode)) {
    return FailedPreconditionError(
        fmt::format("{}: it is a symbolic link (owned by {}); it must be a real directory", refuse,
                    DescribeUid(st.st_uid)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(fmt::format("{}: it is not a directory", refuse));
  }
  if (st.st_uid != SocketUser()) {
    return FailedPreconditionError(fmt::format(
        "{}: it is owned by {} with mode {}, not by this process's {}; someone else made it "
        "(remove it, or set worker.socket to a path in a directory of yours)",
        refuse, DescribeUid(st.st_uid), Mode(st), DescribeUid(SocketUser())));
  }
  if ((st.st_mode & 077) != 0) {
    return FailedPreconditionError(fmt::format(
        "{} (owner {}): its mode {} lets group or others in; it must be 0700 (chmod 0700 {})",
        refuse, DescribeUid(st.st_uid), Mode(st), dir));
  }
  return Status::Ok();
}

Status CheckSharedDirectory(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return NotFoundError(fmt::format("the socket directory {} does not exist", dir));
    }
    return FailedPreconditionError(
        fmt::format("cannot use the socket directory {}: {}", dir, std::strerror(err)));
  }
  const std::string refuse = fmt::format("refusing the socket directory {}", dir);
  if (!S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(fmt::format("{}: it is not a directory", refuse));
  }
  if (st.st_uid != SocketUser() && st.st_uid != 0) {
    return FailedPreconditionError(fmt::format(
        "{}: it is owned by {} with mode {}, neither this process's {} nor root, so its owner "
        "could replace the socket",
        refuse, DescribeUid(st.st_uid), Mode(st), DescribeUid(SocketUser())));
  }
  if ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return FailedPreconditionError(fmt::format(
        "{} (owner {}): its mode {} lets group or others write it and it is not sticky, so "
        "anyone could replace the socket (use a directory only you can write, or the default)",
        refuse, DescribeUid(st.st_uid), Mode(st)));
  }
  return Status::Ok();
}

}  // namespace

std::string DescribeUid(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(4096);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return fmt::format("uid {} ({})", uid, found->pw_name);
  }
  return fmt::format("uid {}", uid);
}

uid_t SocketUser() {
  return geteuid();
}

std::string DefaultSocketDirectory() {
  if (std::string d = EnvDirectory("RUNTIME_DIRECTORY"); !d.empty()) return d;
  if (std::string d = EnvDirectory("XDG_RUNTIME_DIR"); !d.empty()) {
    return d == "/" ? "/bitpush" : d + "/bitpush";
  }
  return fmt::format("/tmp/bitpush-{}", SocketUser());
}

std::string DefaultSocketPath(uint32_t rank) {
  return fmt::format("{}/worker-{}.sock", DefaultSocketDirectory(), rank);
}

Status CheckSocketDirectory(const std::string& socket_path, bool create) {
  const std::string dir = DirectoryOf(socket_path);
  if (dir == DefaultSocketDirectory()) return CheckPrivateDirectory(dir, create);
  return CheckSharedDirectory(dir);
}

}  // namespace bitpush::worker::ipc
