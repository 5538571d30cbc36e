// The host's programs `bitpush-bench pushpull` runs for its set-up (ip, tc, rm): where they are
// and how a command line of ours is run.
//
// Thread-safety: plain functions; Shell blocks until the command exits.
#pragma once

#include <string>

namespace bitpush::bench::pushpull {

// The executable `name` in $PATH, then /usr/sbin, /sbin, /usr/bin, /bin; "" when none.
std::string FindTool(const std::string& name);

// Runs a command line of our own making (no user text in it) through the shell; its exit
// status (-1 when it did not exit), its output (stdout and stderr) in *out.
int Shell(const std::string& command, std::string* out = nullptr);

}  // namespace bitpush::bench::pushpull
