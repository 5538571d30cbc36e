#include "common/node/authorization.h"

#include "fmt/format.h"

namespace bitpush::node {
namespace {

using v1::ControlMessage;
using v1::DataHeader;

constexpr v1::Role kScheduler = v1::ROLE_SCHEDULER;
constexpr v1::Role kServer = v1::ROLE_SERVER;
constexpr v1::Role kWorker = v1::ROLE_WORKER;

MessageRule Control(v1::Role receiver, ControlMessage::BodyCase kind, std::string_view name,
                    RoleSet senders, std::string_view senders_doc, std::string_view checks) {
  return MessageRule{receiver, true, static_cast<int>(kind), name, senders, senders_doc, checks};
}

MessageRule Data(v1::Role receiver, DataHeader::Op op, std::string_view name, RoleSet senders,
                 std::string_view senders_doc, std::string_view checks) {
  return MessageRule{receiver, false, static_cast<int>(op), name, senders, senders_doc, checks};
}

std::string_view ReceiverName(v1::Role r) {
  return r == kScheduler ? "scheduler" : r == kServer ? "server" : "worker";
}

}  // namespace

// What the scheduler sends to every node, received alike by servers and workers (the scheduler
// client of each).
std::vector<MessageRule> FromScheduler(v1::Role receiver) {
  const RoleSet scheduler = RoleSet::Of(kScheduler);
  auto rule = [&](ControlMessage::BodyCase kind, std::string_view name, std::string_view checks) {
    return Control(receiver, kind, name, scheduler, "scheduler", checks);
  };
  return {
      rule(ControlMessage::kRegisterAccepted, "RegisterAccepted",
           "answers this node's pending registration"),
      rule(ControlMessage::kRegisterRefused, "RegisterRefused",
           "answers this node's pending registration"),
      rule(ControlMessage::kAssignment, "Assignment", "after this node registered"),
      rule(ControlMessage::kHeartbeat, "Heartbeat", "—"),
      rule(ControlMessage::kBarrierRelease, "BarrierRelease",
           "releases a barrier this node waits in"),
      rule(ControlMessage::kNodeFailed, "NodeFailed",
           "a server's failure under cluster.server_rejoin_timeout_s drops the job's data-plane "
           "state of the old generation instead of ending the node"),
      rule(ControlMessage::kNodeRejoined, "NodeRejoined",
           "only a newer generation than this node's counts"),
      rule(ControlMessage::kShutdown, "Shutdown",
           receiver == kWorker
               ? "fails every pending and later operation at once, naming the shutdown"
               : "—"),
      rule(ControlMessage::kWorkerFinished, "WorkerFinished", "—"),
  };
}

const std::vector<MessageRule>& MessageRules() {
  static const RoleSet kNodes = RoleSet::Of(kServer, kWorker);
  static const RoleSet kWorkers = RoleSet::Of(kWorker);
  static const RoleSet kServers = RoleSet::Of(kServer);
  static const std::vector<MessageRule> kRules = [] {
    std::vector<MessageRule> rules = {
        // ---- received by the scheduler ----
        Control(kScheduler, ControlMessage::kRegisterRequest, "RegisterRequest", RoleSet::AnyPeer(),
                "anyone (refused unless a node)",
                "protocol version; cluster token; the (role, rank) it registers is the sender's "
                "own; the address is that rank's in the YAML; no other live registration of the "
                "slot; config agreement"),
        Control(kScheduler, ControlMessage::kHeartbeat, "Heartbeat", kNodes, "server, worker",
                "the sender is registered and alive"),
        Control(kScheduler, ControlMessage::kBarrierRequest, "BarrierRequest", kNodes,
                "server, worker", "the sender is registered; counts for the sender's own slot"),
        Control(kScheduler, ControlMessage::kDone, "Done", kWorkers, "worker",
                "the sender is registered and assigned; marks the sender's own slot done (a "
                "worker cannot finish another)"),
        Control(kScheduler, ControlMessage::kShutdownAck, "ShutdownAck", kNodes, "server, worker",
                "the sender is a node the shutdown was sent to"),
    };
    for (v1::Role node : {kServer, kWorker}) {
      for (MessageRule& r : FromScheduler(node)) rules.push_back(r);
    }
    const std::vector<MessageRule> data = {
        // ---- received by servers (data plane) ----
        Data(kServer, DataHeader::OP_DECLARE, "OP_DECLARE", kWorkers, "worker",
             "server 0 only; the header's sender is the authenticated worker's rank"),
        Data(kServer, DataHeader::OP_INIT_KEY, "OP_INIT_KEY", kWorkers, "worker",
             "the header's sender is the authenticated rank; the key belongs to this server under "
             "the key mapping"),
        Data(kServer, DataHeader::OP_PUSH, "OP_PUSH", kWorkers, "worker",
             "the header's sender is the authenticated rank; a declared key of this server; the "
             "worker's next round (each worker's rounds in order, a bounded number in flight); one "
             "push per worker and round; the payload matches the key's compressor, size and "
             "dtype"),
        Data(kServer, DataHeader::OP_STATE_READ, "OP_STATE_READ", kWorkers, "worker",
             "the header's sender is the authenticated rank; a declared key of this server"),
        Data(kServer, DataHeader::OP_STATE_WRITE, "OP_STATE_WRITE", kWorkers, "worker",
             "as OP_STATE_READ; refused while a round of the key is open (a residual, an "
             "optimizer state, rounds)"),
        // ---- received by workers (data plane) ----
        Data(kWorker, DataHeader::OP_PULL_REPLY, "OP_PULL_REPLY", kServers, "server",
             "answers a push this worker has outstanding (key, round) at that server"),
        Data(kWorker, DataHeader::OP_STATE_REPLY, "OP_STATE_REPLY", kServers, "server",
             "answers a state request this worker has outstanding"),
        Data(kWorker, DataHeader::OP_ERROR, "OP_ERROR", kServers, "server",
             "names a request this worker has outstanding"),
        Data(kWorker, DataHeader::OP_DECLARE_REPLY, "OP_DECLARE_REPLY", kServers, "server",
             "answers this worker's declaration"),
    };
    rules.insert(rules.end(), data.begin(), data.end());
    return rules;
  }();
  return kRules;
}

const MessageRule* FindControlRule(v1::Role receiver, v1::ControlMessage::BodyCase kind) {
  for (const MessageRule& r : MessageRules()) {
    if (r.control && r.receiver == receiver && r.type == static_cast<int>(kind)) return &r;
  }
  return nullptr;
}

const MessageRule* FindDataRule(v1::Role receiver, v1::DataHeader::Op op) {
  for (const MessageRule& r : MessageRules()) {
    if (!r.control && r.receiver == receiver && r.type == static_cast<int>(op)) return &r;
  }
  return nullptr;
}

std::string AuthorizationTable() {
  std::string out =
      "| received by | message | may be sent by | the receiver also checks |\n"
      "|---|---|---|---|";
  for (const MessageRule& r : MessageRules()) {
    out += fmt::format("\n| {} | `{}` | {} | {} |", ReceiverName(r.receiver), r.name, r.senders_doc,
                       r.checks);
  }
  return out;
}

}  // namespace bitpush::node
