// What `bitpush-bench pushpull` leaves on the host and must remove when it is interrupted
// (SIGINT, SIGTERM, SIGHUP): the emulated link's network namespace and veth pair, the curve
// keys' directory. The owners (EmulatedLink, CurveKeys) remove them themselves on every other
// exit path; while they exist, they are registered here.
//
// Process-wide by nature: the state is what a signal handler reads, kept in fixed-size buffers.
// The handler removes what is registered by running `ip link del`, `ip netns del` and `rm -rf`
// (fork, execv and waitpid only: async-signal-safe), then re-raises the signal with its default
// action. Thread-safety: register and forget from the driver's thread only.
#pragma once

#include <string>

namespace bitpush::bench::pushpull {

// On a signal: `ip_tool link del veth` and `ip_tool netns del netns` (names cut to the buffers'
// sizes). Installs the handler.
void RemoveNetnsOnSignal(const std::string& ip_tool, const std::string& netns,
                         const std::string& veth);
void ForgetNetnsOnSignal();

// On a signal: `rm_tool -rf dir`. Registers nothing (false) when rm_tool is empty or a path does
// not fit its buffer. Installs the handler.
bool RemoveDirOnSignal(const std::string& rm_tool, const std::string& dir);
void ForgetDirOnSignal();

}  // namespace bitpush::bench::pushpull
