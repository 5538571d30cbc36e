// Node identity: how the processes of a cluster name each other. Every node's transport
// endpoint is named after its role and rank (its PeerId): "scheduler", "server:0",
// "worker:3". The transport reports the sender of each message by that name; NodeEndpoint
// turns it into a NodeIdentity so handlers check roles and ranks, never names or payload
// fields.
//
// Pure functions and values; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proto/bitpush/v1/control.pb.h"

namespace bitpush::node {

// The scheduler's PeerId.
inline constexpr char kSchedulerPeerId[] = "scheduler";

// "server", "worker", "scheduler" ("unknown" otherwise).
std::string_view RoleName(v1::Role role);

// The PeerId of a server or worker: "server:0", "worker:3" (the scheduler's is
// kSchedulerPeerId).
std::string NodePeerId(v1::Role role, uint32_t rank);

// Who a node is: its role and, for servers and workers, its rank.
struct NodeIdentity {
  v1::Role role = v1::ROLE_UNSPECIFIED;
  uint32_t rank = 0;

  bool operator==(const NodeIdentity& o) const { return role == o.role && rank == o.rank; }
};

// The identity a PeerId names: "scheduler", "server:N", "worker:N" with N a rank below 2^32
// in canonical decimal (no sign, spaces or leading zeros). nullopt for any other name (an anonymous
// or foreign peer).
std::optional<NodeIdentity> ParseNodePeerId(std::string_view peer);

// A set of roles (a bit per v1::Role), for "who may send this message". ROLE_UNSPECIFIED
// stands for a sender whose name is no node's (AnyPeer includes it: the scheduler hears
// registration requests from nodes it does not know yet).
class RoleSet {
 public:
  constexpr RoleSet() = default;
  static constexpr RoleSet Of(v1::Role a) { return RoleSet(Bit(a)); }
  static constexpr RoleSet Of(v1::Role a, v1::Role b) { return RoleSet(Bit(a) | Bit(b)); }
  // Every node (scheduler, servers, workers).
  static constexpr RoleSet AnyNode() {
    return RoleSet(Bit(v1::ROLE_SCHEDULER) | Bit(v1::ROLE_SERVER) | Bit(v1::ROLE_WORKER));
  }
  // Every node, and senders whose name is no node's.
  static constexpr RoleSet AnyPeer() {
    return RoleSet(AnyNode().bits_ | Bit(v1::ROLE_UNSPECIFIED));
  }
  constexpr bool Contains(v1::Role r) const { return (bits_ & Bit(r)) != 0; }

 private:
  constexpr explicit RoleSet(uint32_t bits) : bits_(bits) {}
  static constexpr uint32_t Bit(v1::Role r) {
    return r >= 0 && r < 32 ? 1u << static_cast<uint32_t>(r) : 0u;
  }
  uint32_t bits_ = 0;
};

}  // namespace bitpush::node
