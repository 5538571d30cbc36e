#include "common/node/endpoint_metrics.h"

namespace bitpush::node {

void AddEndpointMetrics(const EndpointStats& stats, metrics::MetricSet& set) {
  // One node, one set of counters: the data transport's (cluster.transport ucx) add to the
  // main transport's.
  EndpointStats s = stats;
  const transport::TransportStats& d = stats.data_transport;
  s.transport.messages_sent += d.messages_sent;
  s.transport.messages_received += d.messages_received;
  s.transport.bytes_sent += d.bytes_sent;
  s.transport.bytes_received += d.bytes_received;
  s.transport.malformed_dropped += d.malformed_dropped;
  s.transport.identity_refused += d.identity_refused;
  s.transport.auth_refused += d.auth_refused;
  s.transport.connections_refused += d.connections_refused;
  constexpr char kMessages[] = "bitpush_transport_messages_total";
  constexpr char kMessagesHelp[] = "Messages sent and received by this node's endpoint.";
  set.Counter(kMessages, kMessagesHelp, s.transport.messages_sent, {{"direction", "sent"}});
  set.Counter(kMessages, kMessagesHelp, s.transport.messages_received, {{"direction", "received"}});
  constexpr char kBytes[] = "bitpush_transport_bytes_total";
  constexpr char kBytesHelp[] =
      "Bytes on the wire (headers and payload frames) sent and received by this node's endpoint.";
  set.Counter(kBytes, kBytesHelp, s.transport.bytes_sent, {{"direction", "sent"}});
  set.Counter(kBytes, kBytesHelp, s.transport.bytes_received, {{"direction", "received"}});
  set.Counter("bitpush_endpoint_messages_dispatched_total",
              "Messages handed to a registered handler.", s.dispatched);
  constexpr char kRefused[] = "bitpush_endpoint_messages_refused_total";
  constexpr char kRefusedHelp[] =
      "Messages the endpoint refused, by reason: sender_role (a role that may not send the "
      "type), malformed_header, unhandled_type, transport (not valid bitpush traffic), "
      "superseded_connection (an older connection of a node a newer one took over).";
  set.Counter(kRefused, kRefusedHelp, s.refused, {{"reason", "sender_role"}});
  set.Counter(kRefused, kRefusedHelp, s.malformed, {{"reason", "malformed_header"}});
  set.Counter(kRefused, kRefusedHelp, s.unhandled, {{"reason", "unhandled_type"}});
  set.Counter(kRefused, kRefusedHelp, s.transport.malformed_dropped, {{"reason", "transport"}});
  set.Counter(kRefused, kRefusedHelp, s.transport.identity_refused,
              {{"reason", "superseded_connection"}});
  constexpr char kConnRefused[] = "bitpush_transport_connections_refused_total";
  constexpr char kConnRefusedHelp[] =
      "Connections refused, by reason: authentication (a key the cluster does not list, or a "
      "peer that does not speak the cluster's security mode), limit (more than the node's "
      "connection cap at once).";
  set.Counter(kConnRefused, kConnRefusedHelp, s.transport.auth_refused,
              {{"reason", "authentication"}});
  set.Counter(kConnRefused, kConnRefusedHelp, s.transport.connections_refused,
              {{"reason", "limit"}});
}

}  // namespace bitpush::node
