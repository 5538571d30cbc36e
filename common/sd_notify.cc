#include "common/sd_notify.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bitpush {

namespace {

std::string NotifySocketFromEnv() {
  const char* v = std::getenv("NOTIFY_SOCKET");
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace

Status SdNotifySend(std::string_view socket_name, std::string_view message) {
  if (socket_name.empty()) return Status();
  const std::string name(socket_name);
  if (name[0] != '/' && name[0] != '@') {
    return InvalidArgumentError("NOTIFY_SOCKET '" + name +
                                "' is neither an absolute path nor an @abstract name");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.size() > sizeof(addr.sun_path) - (name[0] == '/' ? 1 : 0)) {
    return InvalidArgumentError("NOTIFY_SOCKET '" + name + "' is too long for a Unix socket");
  }
  std::memcpy(addr.sun_path, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (name[0] == '@') {
    addr.sun_path[0] = '\0';  // abstract namespace: no trailing NUL counted
  } else {
    len += 1;  // the path's terminating NUL
  }

  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return InternalError(std::string("sd_notify: socket(): ") + std::strerror(errno));
  const ssize_t sent = sendto(fd, message.data(), message.size(), MSG_NOSIGNAL,
                              reinterpret_cast<const sockaddr*>(&addr), len);
  const int err = errno;
  close(fd);
  if (sent < 0) {
    return UnavailableError("sd_notify to NOTIFY_SOCKET '" + name + "': " + std::strerror(err));
  }
  if (static_cast<size_t>(sent) != message.size()) {
    return InternalError("sd_notify to NOTIFY_SOCKET '" + name + "': short send");
  }
  return Status();
}

Status NotifyReady(std::string_view status) {
  std::string message = "READY=1\nSTATUS=";
  for (char c : status) message.push_back(c == '\n' ? ' ' : c);  // one STATUS= line
  return SdNotifySend(NotifySocketFromEnv(), message);
}

Status NotifyStopping() {
  return SdNotifySend(NotifySocketFromEnv(), "STOPPING=1");
}

}  // namespace bitpush
