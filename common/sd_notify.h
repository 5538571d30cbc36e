// sd_notify: tells systemd (a `Type=notify` unit, deploy/systemd/) that a bitpush daemon is
// ready or stopping, without linking libsystemd. The protocol is one datagram of
// newline-separated `KEY=value` lines on the AF_UNIX SOCK_DGRAM socket named by
// $NOTIFY_SOCKET (a filesystem path, or "@name" for the abstract namespace). Outside systemd
// the variable is unset and both calls do nothing. docs/deploy.md lists when each daemon calls
// them.
//
// Stateless; thread-safe (each call opens and closes its own socket). $NOTIFY_SOCKET is read
// in sd_notify.cc only.
#pragma once

#include <string_view>

#include "common/status.h"

namespace bitpush {

// Sends "READY=1\nSTATUS=<status>" to $NOTIFY_SOCKET (newlines in `status` become spaces).
// OK without sending when it is unset or empty; an error naming the socket when it is set but
// cannot be reached (the daemon should log it and carry on: systemd then times the start out, which
// is the visible symptom).
Status NotifyReady(std::string_view status);

// Sends "STOPPING=1" to $NOTIFY_SOCKET; same rules as NotifyReady.
Status NotifyStopping();

// Sends `message` (KEY=value lines) as one datagram to the socket `socket_name` (a path or
// "@name"); what the two calls above use. OK without sending when `socket_name` is empty.
Status SdNotifySend(std::string_view socket_name, std::string_view message);

}  // namespace bitpush
