#include "common/security/keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "common/secret_file.h"
#include "fmt/format.h"

namespace bitpush::security {
namespace {

bool IsZ85Key(const std::string& s) {
  if (s.size() != 40) return false;
  uint8_t out[32];
  return zmq_z85_decode(out, s.c_str()) != nullptr;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The public key list: public, so any mode; read like a secret file otherwise (one open,
// a regular file, at most 1 MiB).
StatusOr<std::string> ReadPublicFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return NotFoundError(
        fmt::format("cannot open public key list {}: {}", path, std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) {
    close(fd);
    return InvalidArgumentError(
        fmt::format("public key list {} is not a regular file of at most 1 MiB", path));
  }
  std::string text;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || text.size() > (1u << 20)) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

Status WriteFile(const std::string& path, const std::string& text, mode_t mode, bool overwrite) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (overwrite ? O_TRUNC : O_EXCL);
  const int fd = open(path.c_str(), flags, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return FailedPreconditionError(fmt::format(
          "{} exists: keys are not replaced unless asked (bitpush keygen --force); replacing a "
          "node's key means giving every node the new public_keys",
          path));
    }
    return FailedPreconditionError(fmt::format("cannot write {}: {}", path, std::strerror(err)));
  }
  fchmod(fd, mode);  // O_CREAT's mode is masked by the umask; an overwritten file kept its own
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return InternalError(fmt::format("writing {}: {}", path, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0)
    return InternalError(fmt::format("writing {}: {}", path, std::strerror(errno)));
  return Status::Ok();
}

}  // namespace

StatusOr<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    return UnavailableError(
        fmt::format("cannot generate a CURVE key pair: {} (libzmq without "
                    "CURVE support?)",
                    zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{pub, sec};
}

std::string KeyFileName(const std::string& node) {
  std::string name = node;
  for (char& c : name) {
    if (c == ':' || c == '/') c = '-';
  }
  return name + ".key";
}

std::string FormatNodeKeyFile(const std::string& node, const CurveKeyPair& pair) {
  return fmt::format(
      "# bitpush CURVE key of {}: keep it readable by its owner only (mode 0600)\n"
      "node: {}\npublic: {}\nsecret: {}\n",
      node, node, pair.public_key, pair.secret_key);
}

std::string FormatPublicKeys(const std::map<std::string, std::string>& keys,
                             const std::vector<std::string>& order) {
  std::string out = "# bitpush public keys: one line per node, `name key` (Z85)\n";
  for (const std::string& n : order) {
    auto it = keys.find(n);
    if (it != keys.end()) out += fmt::format("{} {}\n", n, it->second);
  }
  return out;
}

// Calls fn(line_no, line) for every line of `text` that is neither empty nor a comment (a
// line starting with '#': '#' is a Z85 digit, so comments are whole lines), trimmed; stops at
// the first error fn returns.
template <typename F>
Status ForEachLine(const std::string& text, F fn) {
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    line = Trim(line);
    if (line.empty() || line[0] == '#') continue;
    BP_RETURN_IF_ERROR(fn(line_no, line));
  }
  return Status::Ok();
}

StatusOr<CurveKeyPair> ReadNodeKeyFile(const std::string& path, const std::string& node) {
  BP_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(path, "key file"));
  std::map<std::string, std::string> fields;
  BP_RETURN_IF_ERROR(ForEachLine(text, [&](int line_no, const std::string& line) -> Status {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      return InvalidArgumentError(
          fmt::format("key file {}:{}: expected `name: value`", path, line_no));
    }
    const std::string key = Trim(line.substr(0, colon));
    if (key != "node" && key != "public" && key != "secret") {
      return InvalidArgumentError(fmt::format(
          "key file {}:{}: unknown field '{}' (valid: node, public, secret)", path, line_no, key));
    }
    fields[key] = Trim(line.substr(colon + 1));
    return Status::Ok();
  }));
  for (const char* f : {"node", "public", "secret"}) {
    if (fields.count(f) == 0) {
      return InvalidArgumentError(fmt::format("key file {}: no `{}:` line", path, f));
    }
  }
  if (fields["node"] != node) {
    return InvalidArgumentError(fmt::format("key file {} is the key of '{}', not of this node '{}'",
                                            path, fields["node"], node));
  }
  CurveKeyPair pair{fields["public"], fields["secret"]};
  if (!IsZ85Key(pair.public_key) || !IsZ85Key(pair.secret_key)) {
    return InvalidArgumentError(
        fmt::format("key file {}: keys must be Z85 text of 40 characters", path));
  }
  char derived[41] = {};
  if (zmq_curve_public(derived, pair.secret_key.c_str()) != 0 || pair.public_key != derived) {
    return InvalidArgumentError(
        fmt::format("key file {}: the secret key does not belong to the public key", path));
  }
  return pair;
}

StatusOr<std::map<std::string, std::string>> ReadPublicKeys(const std::string& path) {
  BP_ASSIGN_OR_RETURN(std::string text, ReadPublicFile(path));
  std::map<std::string, std::string> keys;
  std::set<std::string> seen_keys;
  BP_RETURN_IF_ERROR(ForEachLine(text, [&](int line_no, const std::string& line) -> Status {
    std::istringstream words(line);
    std::string name, key, extra;
    words >> name >> key >> extra;
    if (key.empty() || !extra.empty()) {
      return InvalidArgumentError(
          fmt::format("public key list {}:{}: expected `name key`", path, line_no));
    }
    if (!IsZ85Key(key)) {
      return InvalidArgumentError(
          fmt::format("public key list {}:{}: the key of '{}' is not Z85 text of 40 characters",
                      path, line_no, name));
    }
    if (!keys.emplace(name, key).second) {
      return InvalidArgumentError(
          fmt::format("public key list {}:{}: '{}' is listed twice", path, line_no, name));
    }
    if (!seen_keys.insert(key).second) {
      return InvalidArgumentError(fmt::format(
          "public key list {}:{}: the key of '{}' is another node's too; each node needs its own",
          path, line_no, name));
    }
    return Status::Ok();
  }));
  return keys;
}

StatusOr<std::vector<std::string>> WriteClusterKeys(const std::string& dir,
                                                    const std::vector<std::string>& nodes,
                                                    bool overwrite) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return FailedPreconditionError(
        fmt::format("cannot create the keys directory {}: {}", dir, std::strerror(errno)));
  }
  std::map<std::string, std::string> public_keys;
  std::vector<std::string> written;
  for (const std::string& node : nodes) {
    const std::string path = dir + "/" + KeyFileName(node);
    CurveKeyPair pair;
    if (!overwrite && access(path.c_str(), F_OK) == 0) {
      // Kept: the list must carry the key it holds.
      BP_ASSIGN_OR_RETURN(pair, ReadNodeKeyFile(path, node));
    } else {
      BP_ASSIGN_OR_RETURN(pair, GenerateCurveKeyPair());
      BP_RETURN_IF_ERROR(WriteFile(path, FormatNodeKeyFile(node, pair), 0600, overwrite));
      written.push_back(path);
    }
    public_keys[node] = pair.public_key;
  }
  const std::string list = dir + "/" + kPublicKeysFileName;
  BP_RETURN_IF_ERROR(WriteFile(list, FormatPublicKeys(public_keys, nodes), 0644, true));
  written.push_back(list);
  return written;
}

}  // namespace bitpush::security
