#include "common/node/identity.h"

#include <fmt/format.h>

namespace bitpush::node {

std::string_view RoleName(v1::Role role) {
  switch (role) {
    case v1::ROLE_SCHEDULER: return "scheduler";
    case v1::ROLE_SERVER: return "server";
    case v1::ROLE_WORKER: return "worker";
    default: return "unknown";
  }
}

std::string NodePeerId(v1::Role role, uint32_t rank) {
  return fmt::format("{}:{}", RoleName(role), rank);
}

std::optional<NodeIdentity> ParseNodePeerId(std::string_view peer) {
  if (peer == kSchedulerPeerId) return NodeIdentity{v1::ROLE_SCHEDULER, 0};
  v1::Role role;
  std::string_view digits;
  if (peer.rfind("server:", 0) == 0) {
    role = v1::ROLE_SERVER;
    digits = peer.substr(7);
  } else if (peer.rfind("worker:", 0) == 0) {
    role = v1::ROLE_WORKER;
    digits = peer.substr(7);
  } else {
    return std::nullopt;
  }
  // Canonical decimal only ("worker:07" is not worker 7: one node, one name).
  if (digits.empty() || digits.size() > 10 || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > 0xffffffffull) return std::nullopt;
  return NodeIdentity{role, static_cast<uint32_t>(v)};
}

}  // namespace bitpush::node
