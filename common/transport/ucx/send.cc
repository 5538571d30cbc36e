// The ucx endpoint's send path (ucx_transport.h), on the progress thread: outboxes handed to
// UCX within each peer's credits (packed, or an iov of the caller's frames), control messages
// (HELLO, credits), the completion of every send, sends that never complete, and the credits
// Receive owes the senders.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/transport/ucx/ucx_transport.h"
#include "common/transport/ucx/wire.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

// Messages up to this size are packed into one contiguous buffer (UCX copies them anyway:
// eager short and bcopy); larger ones go to UCX as an iov of the caller's frames.
constexpr size_t kPackBelowBytes = 16 * 1024;
// To a peer reached through shared memory, one-frame messages from this size on go as kData
// (UCX pipelines their rendezvous through the shared-memory lane); smaller ones as kFrame.
constexpr size_t kShmPipelineFromBytes = size_t{1} << 20;

alignas(64) constexpr uint8_t kZeros[64] = {};

// A send or receive that failed because its connection failed (the error handler reports the
// peer), as opposed to one that failed on its own (reported as kSendFailed).
bool IsConnectionError(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_CANCELED:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT: return true;
    default: return false;
  }
}

void SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  ucp_request_free(request);
  op->transport->OnSendDone(op, status);
}

}  // namespace

void UcxTransport::FlushOutboxes() {
  for (auto& [name, p] : io_peers_) {
    if (p.ep == nullptr || !p.welcomed || p.credits == 0) continue;
    std::vector<Message> batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::deque<Message>& outbox = p.shared->outbox;
      const size_t n = std::min<uint64_t>(p.credits, outbox.size());
      if (n == 0) continue;
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(outbox.front()));
        outbox.pop_front();
      }
      if (blocked_senders_ > 0) space_.notify_all();
    }
    for (Message& m : batch) SendData(name, &p, std::move(m));
  }
}

void UcxTransport::SendData(const PeerId& name, IoPeer* p, Message msg) {
  auto op = std::make_unique<SendOp>();
  op->transport = this;
  op->peer = name;
  // Wire frames: a glued run of frames is one frame, sent from where its parts are.
  const std::vector<WireFrame> wire = WireFrames(msg);
  std::vector<uint64_t> sizes(wire.size());
  AmHeader h;
  h.type = AmType::kData;
  h.seq = p->next_seq++;
  h.header_bytes = static_cast<uint32_t>(msg.header.size());
  h.frame_count = static_cast<uint32_t>(wire.size());
  h.largest_part = 0;
  for (size_t i = 0; i < wire.size(); ++i) {
    sizes[i] = wire[i].bytes;
    h.largest_part = std::max<uint64_t>(h.largest_part, sizes[i]);
  }
  // Appends wire frame i's parts to op->iov.
  auto push_parts = [&](size_t i) {
    for (size_t k = wire[i].first; k < wire[i].first + wire[i].count; ++k) {
      const Buffer& part = msg.frames[k];
      if (!part.empty()) op->iov.push_back({const_cast<uint8_t*>(part.data()), part.size()});
    }
  };
  if (sizes.size() == 1 && sizes[0] >= kPackBelowBytes &&
      (!p->am_over_shm || sizes[0] < kShmPipelineFromBytes) &&
      msg.header.size() <= kMaxFrameMessageHeader) {
    // kFrame: the message header rides in the AM header; the frame is the data. A glued frame
    // whose parts before its last are at most kMaxFramePrefix bytes sends those in the AM
    // header too (the prefix), so the data stays one contiguous part; other glued frames go
    // as an iov of their parts.
    h.type = AmType::kFrame;
    const size_t last = wire[0].first + wire[0].count - 1;
    const uint64_t prefix = sizes[0] - msg.frames[last].size();
    const bool prefixed = wire[0].count > 1 && prefix <= kMaxFramePrefix;
    if (prefixed) h.prefix_bytes = static_cast<uint8_t>(prefix);
    EncodeAmHeader(h, op->am_header);
    op->frame_am_header.reserve(kAmHeaderBytes + msg.header.size() + h.prefix_bytes);
    op->frame_am_header.append(reinterpret_cast<const char*>(op->am_header), kAmHeaderBytes);
    op->frame_am_header.append(msg.header);
    if (prefixed) {
      for (size_t k = wire[0].first; k < last; ++k) {
        op->frame_am_header.append(reinterpret_cast<const char*>(msg.frames[k].data()),
                                   msg.frames[k].size());
      }
    } else if (wire[0].count > 1) {
      push_parts(0);
    }
    --p->credits;
    op->msg = std::move(msg);
    SendOp* raw = op.release();
    if (raw->iov.empty()) {
      const Buffer& data = raw->msg.frames[prefixed ? last : wire[0].first];
      Post(p->ep, raw, data.data(), data.size(), /*iov=*/false);
    } else {
      Post(p->ep, raw, raw->iov.data(), raw->iov.size(), /*iov=*/true);
    }
    return;
  }
  EncodeAmHeader(h, op->am_header);
  StatusOr<DataLayout> layout = ComputeLayout(msg.header.size(), sizes);
  if (!layout.ok()) {  // cannot happen for frames that exist in memory
    PushEvent(
        name, TransportEvent::Kind::kSendFailed,
        InternalError(Prefix() + fmt::format("send to '{}': {}", name, layout.status().message())));
    return;
  }
  --p->credits;
  // The packed part: header, sizes, and the padding up to the first frame; everything when
  // the message is small.
  const bool pack_all = layout->total < kPackBelowBytes;
  const size_t packed_bytes =
      pack_all ? layout->total : (wire.empty() ? layout->total : layout->frame_offsets[0]);
  op->packed.assign(packed_bytes, '\0');
  auto* out = reinterpret_cast<uint8_t*>(op->packed.data());
  std::copy(msg.header.begin(), msg.header.end(), out);
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      out[layout->sizes_offset + 8 * i + b] = static_cast<uint8_t>(sizes[i] >> (8 * b));
    }
  }
  if (pack_all) {
    for (size_t i = 0; i < wire.size(); ++i) {
      size_t at = layout->frame_offsets[i];
      for (size_t k = wire[i].first; k < wire[i].first + wire[i].count; ++k) {
        const Buffer& part = msg.frames[k];
        if (!part.empty()) std::memcpy(out + at, part.data(), part.size());
        at += part.size();
      }
    }
    Post(p->ep, op.release(), out, packed_bytes, /*iov=*/false);
    return;
  }
  op->iov.push_back({out, packed_bytes});
  size_t end = packed_bytes;
  for (size_t i = 0; i < wire.size(); ++i) {
    if (layout->frame_offsets[i] > end) {
      op->iov.push_back({const_cast<uint8_t*>(kZeros), layout->frame_offsets[i] - end});
    }
    push_parts(i);
    end = layout->frame_offsets[i] + sizes[i];
  }
  op->msg = std::move(msg);
  SendOp* raw = op.release();
  Post(p->ep, raw, raw->iov.data(), raw->iov.size(), /*iov=*/true);
}

void UcxTransport::SendControl(ucp_ep_h ep, AmType type, uint64_t seq, std::string payload,
                               bool hello) {
  auto* op = new SendOp();
  op->transport = this;
  if (hello) op->hello_ep = ep;
  AmHeader h;
  h.type = type;
  h.seq = seq;
  EncodeAmHeader(h, op->am_header);
  op->packed = std::move(payload);
  Post(ep, op, op->packed.data(), op->packed.size(), /*iov=*/false);
}

void UcxTransport::Post(ucp_ep_h ep, SendOp* op, const void* buffer, size_t count, bool iov) {
  op->ep = ep;
  op->posted = Clock::now();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.datatype = iov ? ucp_dt_make_iov() : ucp_dt_make_contig(1);
  param.cb.send = &SendCallback;
  param.user_data = op;
  const bool frame = !op->frame_am_header.empty();
  bool finished = false;
  op->finished_in_call = &finished;
  send_ops_.insert(op);
  ucs_status_ptr_t r = ucp_am_send_nbx(
      ep, kAmId, frame ? static_cast<const void*>(op->frame_am_header.data()) : op->am_header,
      frame ? op->frame_am_header.size() : kAmHeaderBytes, count ? buffer : nullptr, count, &param);
  if (finished) return;  // SendCallback ran inside the call: op is gone
  op->finished_in_call = nullptr;
  if (r == nullptr) {
    OnSendDone(op, UCS_OK);  // completed at once
  } else if (UCS_PTR_IS_ERR(r)) {
    OnSendDone(op, UCS_PTR_STATUS(r));
  }  // else in flight: SendCallback finishes it
}

void UcxTransport::OnSendDone(SendOp* op, ucs_status_t status) {
  if (op->finished_in_call != nullptr) *op->finished_in_call = true;
  send_ops_.erase(op);
  if (op->hello_ep != nullptr && status == UCS_OK) {
    if (auto out = out_by_ep_.find(op->hello_ep); out != out_by_ep_.end()) {
      io_peers_.at(out->second).hello_sent = true;
    }
  }
  if (status != UCS_OK && !op->peer.empty() && !IsConnectionError(status)) {
    PushEvent(op->peer, TransportEvent::Kind::kSendFailed,
              UnavailableError(Prefix() + fmt::format("send to '{}' failed: {}", op->peer,
                                                      ucs_status_string(status))));
  }
  delete op;
}

void UcxTransport::ReturnCredits() {
  std::vector<std::pair<uint64_t, uint64_t>> give = inbox_.TakeCreditsDue();
  for (auto& [id, c] : in_conns_) {
    if (c.dropped_unreturned > 0) {
      give.emplace_back(id, c.dropped_unreturned);
      c.dropped_unreturned = 0;
    }
  }
  for (const auto& [id, n] : give) {
    auto it = in_conns_.find(id);
    if (it == in_conns_.end()) continue;
    it->second.granted += n;
    SendControl(it->second.ep, AmType::kCredit, n, "");
  }
}

void UcxTransport::ExpireStalledSends(Clock::time_point now, milliseconds* wait) {
  // A scan of every op in flight, at most every kSendCheckEvery (not at each wake-up): a
  // stalled send is found within that much of its limit.
  if (now < next_send_check_) {
    *wait = std::min(*wait, std::chrono::ceil<milliseconds>(next_send_check_ - now));
    return;
  }
  next_send_check_ = now + kSendCheckEvery;
  const milliseconds limit = options_.send_complete_timeout;
  std::set<ucp_ep_h> stalled;
  bool pending = false;
  for (const SendOp* op : send_ops_) {
    if (now < op->posted + limit) {
      pending = true;
    } else {
      stalled.insert(op->ep);
    }
  }
  if (pending) *wait = std::min(*wait, kSendCheckEvery);
  for (ucp_ep_h ep : stalled) {
    std::string whom;
    if (auto in = in_by_ep_.find(ep); in != in_by_ep_.end()) {
      whom = fmt::format("the connection from '{}'", in_conns_.at(in->second).name);
    } else if (auto out = out_by_ep_.find(ep); out != out_by_ep_.end()) {
      whom = fmt::format("'{}'", out->second);
    } else {
      continue;  // closed already; UCX ends its sends
    }
    BP_LOG_WARN(
        "{}a send to {} did not complete within {} ms (send_complete_timeout): closing "
        "the connection",
        Prefix(), whom, limit.count());
    HandleEpError(ep, UCS_ERR_TIMED_OUT);
  }
}

}  // namespace bitpush::transport::ucx_backend
