// Buffer and Message: what a transport carries.
//
// A Message is a small header (control plane: a serialized bitpush.v1.ControlMessage; data
// plane: a serialized bitpush.v1.DataHeader) followed by zero or more payload frames. Frames are
// Buffers: immutable, reference-counted byte ranges, so a payload can be handed to a transport
// without copying (the zmq backend passes the bytes to zmq_msg_init_data and keeps the Buffer
// alive until ZeroMQ releases it; the inproc backend moves the Buffer to the receiver).
//
// Thread-safety: a Buffer's bytes never change after construction; copies of a Buffer may be
// used from different threads. A Message is a value type (one owner at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/span.h"
#include "common/status.h"

namespace bitpush::transport {

class Buffer {
 public:
  Buffer() = default;

  // Copies `size` bytes.
  static Buffer Copy(const void* data, size_t size);
  // Takes ownership of a vector's bytes (no copy).
  static Buffer Take(std::vector<uint8_t>&& bytes);
  static Buffer Take(std::string&& bytes);
  // Refers to bytes kept alive by `owner` (no copy); the bytes must not change while any
  // Buffer refers to them.
  static Buffer Borrow(const void* data, size_t size, std::shared_ptr<const void> owner);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  ByteSpan span() const { return {data_, size_}; }
  // The object keeping the bytes alive (null for an empty buffer).
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  Buffer(const uint8_t* data, size_t size, std::shared_ptr<const void> owner)
      : data_(data), size_(size), owner_(std::move(owner)) {}

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

struct Message {
  std::string header;
  std::vector<Buffer> frames;
  // Sending only: glue_next[i] set sends frames[i] and frames[i + 1] as one frame (the receiver
  // gets one Buffer of their bytes in order). Empty: every frame travels alone. Lets a sender put
  // a header in front of bytes it does not own without copying them (the ucx backend sends the
  // parts as one frame from where they are; the others join them, a copy, in Send). A received
  // Message has it empty.
  std::vector<bool> glue_next;

  size_t payload_bytes() const {
    size_t n = 0;
    for (const Buffer& f : frames) n += f.size();
    return n;
  }
};

// The frames a Message travels as: frames [first, first + count) glued into one of `bytes`.
struct WireFrame {
  size_t first = 0;
  size_t count = 0;
  uint64_t bytes = 0;
};

// InvalidArgument when glue_next is neither empty nor one entry per frame, or glues the last
// frame to nothing.
Status CheckGlue(const Message& msg);
// msg's wire frames (CheckGlue must hold).
std::vector<WireFrame> WireFrames(const Message& msg);
// Joins every glued run of msg's frames into one Buffer (a copy) and clears glue_next; a
// Message without glue is left as it is (CheckGlue must hold).
void JoinGlued(Message* msg);

}  // namespace bitpush::transport
