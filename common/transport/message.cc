#include "common/transport/message.h"

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "common/transport/block_pool.h"

namespace bitpush::transport {

Buffer Buffer::Copy(const void* data, size_t size) {
  if (size == 0) return Buffer();
  auto bytes = std::make_shared<std::vector<uint8_t>>(size);
  std::memcpy(bytes->data(), data, size);
  const uint8_t* p = bytes->data();
  return Buffer(p, size, std::move(bytes));
}

Buffer Buffer::Take(std::vector<uint8_t>&& bytes) {
  if (bytes.empty()) return Buffer();
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const uint8_t* p = owned->data();
  const size_t n = owned->size();
  return Buffer(p, n, std::move(owned));
}

Buffer Buffer::Take(std::string&& bytes) {
  if (bytes.empty()) return Buffer();
  auto owned = std::make_shared<std::string>(std::move(bytes));
  const uint8_t* p = reinterpret_cast<const uint8_t*>(owned->data());
  const size_t n = owned->size();
  return Buffer(p, n, std::move(owned));
}

Buffer Buffer::Borrow(const void* data, size_t size, std::shared_ptr<const void> owner) {
  if (size == 0) return Buffer();
  return Buffer(static_cast<const uint8_t*>(data), size, std::move(owner));
}

Status CheckGlue(const Message& msg) {
  if (msg.glue_next.empty()) return Status::Ok();
  if (msg.glue_next.size() != msg.frames.size()) {
    return InvalidArgumentError("glue_next has " + std::to_string(msg.glue_next.size()) +
                                " entries for " + std::to_string(msg.frames.size()) + " frames");
  }
  if (msg.glue_next.back()) return InvalidArgumentError("glue_next glues the last frame to none");
  return Status::Ok();
}

std::vector<WireFrame> WireFrames(const Message& msg) {
  std::vector<WireFrame> wire;
  wire.reserve(msg.frames.size());
  bool glued = false;  // the previous frame glues this one
  for (size_t i = 0; i < msg.frames.size(); ++i) {
    if (!glued) wire.push_back(WireFrame{i, 0, 0});
    ++wire.back().count;
    wire.back().bytes += msg.frames[i].size();
    glued = !msg.glue_next.empty() && msg.glue_next[i];
  }
  return wire;
}

namespace {

// JoinGlued's blocks, kept up to 256 MiB between messages.
BlockPool& JoinPool() {
  static const std::shared_ptr<BlockPool> pool = BlockPool::Create(size_t{256} << 20);
  return *pool;
}

}  // namespace

void JoinGlued(Message* msg) {
  if (msg->glue_next.empty()) return;
  std::vector<Buffer> joined;
  for (const WireFrame& w : WireFrames(*msg)) {
    if (w.count == 1) {
      joined.push_back(std::move(msg->frames[w.first]));
      continue;
    }
    // From a pool: a stream of large joins reuses mapped memory (what a fresh allocation per
    // message would cost in page faults and zeroing is more than the copy itself).
    std::shared_ptr<uint8_t> block = JoinPool().Get(w.bytes);
    if (w.bytes != 0 && block == nullptr) throw std::bad_alloc();
    size_t at = 0;
    for (size_t i = w.first; i < w.first + w.count; ++i) {
      const Buffer& part = msg->frames[i];
      if (!part.empty()) std::memcpy(block.get() + at, part.data(), part.size());
      at += part.size();
    }
    uint8_t* data = block.get();
    joined.push_back(Buffer::Borrow(data, w.bytes, std::move(block)));
  }
  msg->frames = std::move(joined);  // the parts (and what they borrowed) are let go here
  msg->glue_next.clear();
}

}  // namespace bitpush::transport
