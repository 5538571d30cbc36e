// CURVE keys of the nodes of a cluster (docs/security.md): generating them, and reading and
// writing the two files an operator handles.
//
//  - A node's key file ("worker-0.key", mode 0600): its name and its key pair,
//        node: worker:0
//        public: <40 characters of Z85>
//        secret: <40 characters of Z85>
//    A key file that its group or others may read or write is refused, naming the file.
//  - The cluster's public keys ("public_keys"; public, any mode): one line per node,
//        scheduler <Z85>
//        server:0 <Z85>
//    (a line starting with '#' is a comment). Each name and each key appears once.
//
// Pure functions over files; thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace bitpush::security {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// A fresh key pair (libzmq's CURVE, libsodium's random source).
StatusOr<CurveKeyPair> GenerateCurveKeyPair();

// The file name of a node's key: "worker:0" -> "worker-0.key", "scheduler" -> "scheduler.key".
std::string KeyFileName(const std::string& node);

// Reads and checks the key file of `node`: the mode (nothing for group or others), the
// format, that the file is `node`'s, and that its secret key belongs to its public key.
// Errors name the file and the problem (NotFound when it does not exist).
StatusOr<CurveKeyPair> ReadNodeKeyFile(const std::string& path, const std::string& node);

// Reads the cluster's public keys (name -> Z85 key). Errors name the file and line.
StatusOr<std::map<std::string, std::string>> ReadPublicKeys(const std::string& path);

// The text of the two files.
std::string FormatNodeKeyFile(const std::string& node, const CurveKeyPair& pair);
std::string FormatPublicKeys(const std::map<std::string, std::string>& keys,
                             const std::vector<std::string>& order);

// Writes a key pair for each of `nodes` into `dir` (created 0700 if missing) and the
// public_keys file listing them in that order. An existing key file is kept unless
// `overwrite` (FailedPrecondition naming it otherwise), so that rerunning does not break a
// deployed cluster by accident. Returns the paths written.
StatusOr<std::vector<std::string>> WriteClusterKeys(const std::string& dir,
                                                    const std::vector<std::string>& nodes,
                                                    bool overwrite);

// The name of the public-key list inside a keys directory.
inline constexpr char kPublicKeysFileName[] = "public_keys";

}  // namespace bitpush::security
