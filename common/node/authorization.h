// Who may send what: the one table of every message type a node receives, the roles that may
// send it and what the receiver checks beyond the role (docs/security.md "Who may send what"
// is generated from it). NodeEndpoint::OnControl / OnData take a handler's senders from here,
// so a component cannot register a message type without saying who may send it, and the
// endpoint refuses and counts a message from any other role before a handler sees it. The
// sender's role is the transport's: under security.mode curve the node whose key
// authenticated the connection (common/transport/transport.h), never a payload field.
//
// Immutable tables and pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/node/identity.h"
#include "proto/bitpush/v1/control.pb.h"

namespace bitpush::node {

struct MessageRule {
  v1::Role receiver;             // the role whose endpoint takes the message
  bool control;                  // true: a v1::ControlMessage body case; false: a v1::DataHeader op
  int type;                      // the body case or the op
  std::string_view name;         // "Shutdown", "OP_PUSH"
  RoleSet senders;               // who may send it
  std::string_view senders_doc;  // the same, for the docs ("scheduler")
  std::string_view checks;       // what the receiver's handler checks beyond the role
};

// Every rule, grouped by receiver (scheduler, server, worker), in wire order.
const std::vector<MessageRule>& MessageRules();

// The rule for a control message / data op received by `receiver`; nullptr when the table
// has none (the receiver takes no such message).
const MessageRule* FindControlRule(v1::Role receiver, v1::ControlMessage::BodyCase kind);
const MessageRule* FindDataRule(v1::Role receiver, v1::DataHeader::Op op);

// The table as markdown (docs/security.md, between its `authorization` markers).
std::string AuthorizationTable();

}  // namespace bitpush::node
