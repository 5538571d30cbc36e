// The ucx endpoint's receive path (ucx_transport.h), on the progress thread: every Active
// Message of an accepted connection (the HELLO and its check, messages received eagerly or by
// rendezvous into a block of the block pool), put back in order per connection and handed to
// the inbox; broken or hostile connections refused.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/transport/ucx/hello_auth.h"
#include "common/transport/ucx/ucx_transport.h"
#include "common/transport/ucx/wire.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

void RecvCallback(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  auto* op = static_cast<RecvOp*>(user_data);
  ucp_request_free(request);
  op->transport->OnRecvDone(op, status);
}

}  // namespace

void UcxTransport::Malformed(const std::string& what) {
  malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (log_limiter_.Allow("malformed", &suppressed)) {
    BP_LOG_WARN("{}dropped malformed traffic: {}{}", Prefix(), what,
                suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
  }
}

void UcxTransport::Refuse(InConn* c, const std::string& what) {
  Malformed(fmt::format("{}; closing the connection{}", what,
                        c->hello ? fmt::format(" from '{}'", c->name) : ""));
  c->refused = true;
  refused_.emplace_back(c->id, what);
}

void UcxTransport::RefuseHello(InConn* c, const PeerId& claimed, const std::string& why) {
  auth_refused_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  // The claimed name is the peer's text: escaped ({:?}), and one limiter key per name and reason
  // (the limiter bounds how many it remembers).
  if (log_limiter_.Allow(fmt::format("hello:{}:{}", why, claimed), &suppressed)) {
    BP_LOG_WARN("{}refused a connection claiming to be {:?}: {}{}", Prefix(), claimed, why,
                suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
  }
  c->refused = true;
  refused_.emplace_back(c->id, why);
}

ucs_status_t UcxTransport::OnAm(const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ucp_ep_h reply =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  if (reply != nullptr && IsClosing(reply)) return UCS_OK;  // we closed it: nothing is expected
  StatusOr<AmHeader> h = ParseAmHeader(header, header_length);
  if (!h.ok()) {
    Malformed(h.status().message());
    return UCS_OK;  // a rendezvous descriptor is dropped
  }
  if (h->type == AmType::kCredit) {
    auto out = out_by_ep_.find(reply);
    if (out == out_by_ep_.end()) {
      Malformed("a credit on no connection this endpoint opened");
      return UCS_OK;
    }
    IoPeer& p = io_peers_.at(out->second);
    p.credits += h->seq;
    if (!p.welcomed) PeerUp(out->second, &p);
    return UCS_OK;
  }
  auto in = in_by_ep_.find(reply);
  if (in == in_by_ep_.end()) {
    Malformed(reply == nullptr ? "an Active Message without a reply endpoint"
                               : "an Active Message on no connection this endpoint accepted");
    return UCS_OK;
  }
  InConn& c = in_conns_.at(in->second);
  if (c.refused) return UCS_OK;  // counted when it was refused; closed after this progress
  if (h->type == AmType::kHello) {
    OnHello(&c, data, length, rndv);
    return UCS_OK;
  }
  const uint8_t* frame_header =
      h->type == AmType::kFrame ? static_cast<const uint8_t*>(header) + kAmHeaderBytes : nullptr;
  return OnData(&c, *h, frame_header, data, length, rndv);
}

void UcxTransport::SupersedeOlderConnections(const InConn& newer) {
  for (auto& [id, older] : in_conns_) {
    if (id == newer.id || !older.hello || older.refused || older.name != newer.name) continue;
    identity_refused_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("superseded:" + newer.name, &suppressed)) {
      BP_LOG_WARN("{}a newer connection from {:?} took over its name: closing the older one{}",
                  Prefix(), newer.name,
                  suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    older.refused = true;  // what still arrives on it is dropped; closed after this progress
    refused_.emplace_back(id, "superseded");
  }
}

void UcxTransport::OnHello(InConn* c, const void* data, size_t length, bool rndv) {
  if (c->hello) {
    Malformed(fmt::format("a second HELLO from '{}'", c->name));
    return;
  }
  if (rndv) {
    Refuse(c, fmt::format("a HELLO of {} bytes", length));
    return;
  }
  StatusOr<HelloPayload> hello = ParseHello(data, length);
  if (!hello.ok()) {
    Refuse(c, hello.status().message());
    return;
  }
  if (auth_) {
    const HelloAuth::Verdict verdict = auth_->Check(hello->name, hello->token);
    if (verdict != HelloAuth::Verdict::kAccepted) {
      RefuseHello(c, hello->name, HelloAuth::Describe(verdict));
      return;
    }
  } else if (!hello->token.empty()) {
    // A peer under kCurve: every node of a cluster needs the same mode, so the mismatch fails
    // here as it does between zmq nodes, rather than running on with unauthenticated names.
    RefuseHello(c, hello->name,
                "a token: the peer runs security mode curve, this endpoint none (is security.mode "
                "the same on every node?)");
    return;
  }
  c->name = hello->name;
  c->hello = true;
  SupersedeOlderConnections(*c);
  c->granted = options_.max_queued_per_peer;
  SendControl(c->ep, AmType::kCredit, c->granted, "");
}

ucs_status_t UcxTransport::OnData(InConn* c, const AmHeader& h, const uint8_t* frame_header,
                                  void* data, size_t length, bool rndv) {
  if (!c->hello) {
    Malformed("a message before the HELLO");
    return UCS_OK;
  }
  const uint64_t max = options_.max_message_bytes;
  if (h.header_bytes > max || h.largest_part > max) {
    Refuse(c, fmt::format("a part of {} bytes from '{}', above max_message_bytes ({})",
                          std::max<uint64_t>(h.header_bytes, h.largest_part), c->name, max));
    return rndv ? UCS_ERR_EXCEEDS_LIMIT : UCS_OK;
  }
  if (h.seq < c->next_deliver || h.seq >= c->granted || c->slots.count(h.seq) != 0) {
    Refuse(c, fmt::format("message {} from '{}' is out of sequence or beyond its credits ({})",
                          h.seq, c->name, c->granted));
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  const bool frame = h.type == AmType::kFrame;
  // kFrame: the frame is the prefix (from the AM header, after the message header) and the data.
  const size_t prefix = frame ? h.prefix_bytes : 0;
  const uint64_t total = uint64_t{prefix} + length;
  if (frame ? (length == 0 || total > h.largest_part) : length > MaxDataBytes(h)) {
    Refuse(c, fmt::format("{} bytes of data from '{}' for {} frames of at most {} bytes", total,
                          c->name, h.frame_count, h.largest_part));
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  std::shared_ptr<uint8_t> block = blocks_->Get(total);
  if (total != 0 && block == nullptr) {
    Refuse(c, fmt::format("no memory for a message of {} bytes from '{}'", total, c->name));
    return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
  }
  c->slots[h.seq];  // its place in the order
  NoteGap(c);
  std::string message_header;
  if (frame) {
    message_header.assign(reinterpret_cast<const char*>(frame_header), h.header_bytes);
    if (prefix != 0) std::memcpy(block.get(), frame_header + h.header_bytes, prefix);
  }
  if (!rndv) {
    if (length != 0) std::memcpy(block.get() + prefix, data, length);
    if (frame) {
      CompleteFrame(c, h.seq, std::move(message_header), std::move(block), total);
    } else {
      Complete(c, h.seq, h, std::move(block), length);
    }
    return UCS_OK;
  }
  // Rendezvous: the bytes go straight into the block the frames will be views of.
  auto* op = new RecvOp();
  op->transport = this;
  op->conn = c->id;
  op->header = h;
  op->block = std::move(block);
  op->size = total;
  op->message_header = std::move(message_header);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(1);
  param.cb.recv_am = &RecvCallback;
  param.user_data = op;
  bool finished = false;
  op->finished_in_call = &finished;
  recv_ops_.insert(op);
  ucs_status_ptr_t r =
      ucp_am_recv_data_nbx(worker_, data, op->block.get() + prefix, length, &param);
  if (finished) return UCS_OK;  // RecvCallback ran inside the call: op is gone
  op->finished_in_call = nullptr;
  if (r == nullptr) {
    OnRecvDone(op, UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    OnRecvDone(op, UCS_PTR_STATUS(r));
  }  // else in flight: RecvCallback finishes it
  return UCS_OK;
}

void UcxTransport::OnRecvDone(RecvOp* op, ucs_status_t status) {
  std::unique_ptr<RecvOp> owned(op);
  if (op->finished_in_call != nullptr) *op->finished_in_call = true;
  recv_ops_.erase(op);
  auto it = in_conns_.find(op->conn);
  if (it == in_conns_.end()) return;  // the connection ended meanwhile
  InConn& c = it->second;
  if (status != UCS_OK) {
    BP_LOG_DEBUG("{}receiving message {} from '{}' failed: {}", Prefix(), op->header.seq, c.name,
                 ucs_status_string(status));
    Slot& s = c.slots[op->header.seq];
    s.done = true;
    ++c.dropped_unreturned;
    Deliver(&c);
    return;
  }
  if (op->header.type == AmType::kFrame) {
    CompleteFrame(&c, op->header.seq, std::move(op->message_header), std::move(op->block),
                  op->size);
  } else {
    Complete(&c, op->header.seq, op->header, std::move(op->block), op->size);
  }
}

void UcxTransport::CompleteFrame(InConn* c, uint64_t seq, std::string message_header,
                                 std::shared_ptr<uint8_t> block, size_t size) {
  Slot& slot = c->slots[seq];
  slot.done = true;
  slot.delivered = true;
  slot.msg.header = std::move(message_header);
  uint8_t* data = block.get();
  slot.msg.frames.push_back(Buffer::Borrow(data, size, std::move(block)));
  Deliver(c);
}

void UcxTransport::Complete(InConn* c, uint64_t seq, const AmHeader& h,
                            std::shared_ptr<uint8_t> block, size_t size) {
  Slot& slot = c->slots[seq];
  slot.done = true;
  StatusOr<ParsedData> parsed = ParseData(h, block.get(), size, options_.max_message_bytes);
  if (!parsed.ok()) {
    Malformed(fmt::format("message {} from '{}': {}", seq, c->name, parsed.status().message()));
    ++c->dropped_unreturned;
    Deliver(c);
    return;
  }
  slot.delivered = true;
  slot.msg.header.assign(reinterpret_cast<const char*>(parsed->header), parsed->header_bytes);
  slot.msg.frames.reserve(parsed->frames.size());
  for (size_t i = 0; i < parsed->frames.size(); ++i) {
    slot.msg.frames.push_back(Buffer::Borrow(parsed->frames[i], parsed->frame_sizes[i], block));
  }
  block.reset();  // the frames own it now
  Deliver(c);
}

void UcxTransport::NoteGap(InConn* c) {
  const bool gap = !c->slots.empty() && c->slots.begin()->first != c->next_deliver;
  if (!gap) {
    if (c->gap_since != Clock::time_point{}) gapped_.erase(c->id);
    c->gap_since = {};
  } else if (c->gap_since == Clock::time_point{}) {
    c->gap_since = Clock::now();
    gapped_.insert(c->id);
  }
}

void UcxTransport::CloseGapped(Clock::time_point now, milliseconds* wait) {
  const milliseconds limit = options_.sequence_gap_timeout;
  for (uint64_t id : gapped_) {
    InConn& c = in_conns_.at(id);
    if (c.refused || c.slots.empty()) continue;
    const auto due = c.gap_since + limit;
    if (now < due) {
      *wait = std::min(*wait, std::chrono::ceil<milliseconds>(due - now));
      continue;
    }
    Refuse(&c, fmt::format("message {} from '{}' never arrived while message {} did ({} ms): the "
                           "connection lost it",
                           c.next_deliver, c.name, c.slots.rbegin()->first, limit.count()));
  }
}

void UcxTransport::Deliver(InConn* c) {
  std::vector<Message> ready;
  while (!c->slots.empty() && c->slots.begin()->first == c->next_deliver &&
         c->slots.begin()->second.done) {
    if (c->slots.begin()->second.delivered)
      ready.push_back(std::move(c->slots.begin()->second.msg));
    c->slots.erase(c->slots.begin());
    ++c->next_deliver;
  }
  NoteGap(c);
  if (ready.empty()) return;
  uint64_t bytes = 0;
  for (const Message& m : ready) bytes += m.header.size() + m.payload_bytes();
  messages_received_.fetch_add(ready.size(), std::memory_order_relaxed);
  bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
  inbox_.PushMessages(c->id, c->name, &ready);
}

}  // namespace bitpush::transport::ucx_backend
