// Where the daemon's Unix socket lives, and which directories it may live in
// (docs/local-ipc.md, "Socket directory and peer credentials").
//
// A socket is only as trustworthy as its directory: whoever can write the directory can put a
// listener of their own at the path before the daemon starts (or replace the daemon's), and
// training processes would send it their Hello and name their shared memory. So the default
// path is in a per-user private directory, and every socket directory is checked by both the
// daemon (Listener::Listen) and its clients (Channel::Connect) before use:
//
//  - the default directory (DefaultSocketDirectory()): $RUNTIME_DIRECTORY (systemd's
//    RuntimeDirectory=; its first entry), else $XDG_RUNTIME_DIR/bitpush, else
//    /tmp/bitpush-<uid>. It must be a directory (not a symlink) owned by this user with no
//    permission bits for group or others; the daemon creates it (0700) when it is missing.
//  - any other directory (an explicit worker.socket / --socket / BITPUSH_DAEMON_SOCKET): a
//    directory (symlinks followed) owned by this user or root; when group or others may write
//    it, it must be sticky (like /tmp), so nobody else can remove or rename this user's socket.
//
// This is the only file that reads RUNTIME_DIRECTORY and XDG_RUNTIME_DIR. Pure functions of the
// environment and the file system; any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace bitpush::worker::ipc {

// The directory of the default socket paths (see above), without a trailing slash.
std::string DefaultSocketDirectory();

// Node `rank`'s default socket: DefaultSocketDirectory() + "/worker-<rank>.sock".
std::string DefaultSocketPath(uint32_t rank);

// Checks the directory `socket_path` is in by the rules above (the private rules when it is
// DefaultSocketDirectory(), the shared-directory rules otherwise). `create`: make the default
// directory (mode 0700) when it is missing. FailedPrecondition naming the directory, its owner
// and mode when it breaks a rule; NotFound when it does not exist (and is not created).
Status CheckSocketDirectory(const std::string& socket_path, bool create);

// "uid 65534 (nobody)", or "uid 4242" when the name is unknown: how errors name a user.
std::string DescribeUid(uid_t uid);

// The uid that owns the socket files this process creates and whose peers it accepts
// (geteuid()).
uid_t SocketUser();

}  // namespace bitpush::worker::ipc
