// ReadSecretFile: reads a secret (the cluster token, a key) from a file that only its owner may
// access — the one place a secret file's permissions are checked, for every secret bitpush reads.
//
// Contract of ReadSecretFile(path, what):
//  - opens `path` once (O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK) and checks the opened file
//    with fstat, so the mode checked is that of the very bytes read: no stat-then-open race. A
//    symbolic link is followed (secret stores such as Kubernetes mount secrets as links); the
//    link's own mode means nothing, its target's is checked;
//  - refuses, before reading a byte: anything but a regular file (a FIFO would block, a
//    directory or device is a mistake), a file with any group or other permission bit
//    (mode & 077, read, write or execute: a secret others can read or replace is no secret), a
//    file larger than kMaxSecretFileBytes;
//  - returns the content unchanged (no trimming; the caller decides what the secret is);
//  - does not check the owner (a file the process can open and nobody else may access is its
//    owner's business) and never prints the content.
// Errors name `what` (e.g. "cluster.token_file") and the path: NotFound when the file cannot be
// opened (with the system's reason), FailedPrecondition for group/other permission bits (with
// the mode in octal and the fix, `chmod 600 PATH`), InvalidArgument for a file that is not
// regular or too large, Unavailable for a read error.
//
// Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace bitpush {

// Secrets are short (a token, a 40-character key); anything larger is the wrong file.
inline constexpr size_t kMaxSecretFileBytes = 64 * 1024;

StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view what);

}  // namespace bitpush
