#include "common/transport/message.h"

#include <cstring>

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

}  // namespace bitpush::transport
