#include "common/transport/block_pool.h"

#include <new>

namespace bitpush::transport {

std::shared_ptr<BlockPool> BlockPool::Create(size_t max_kept_bytes) {
  return std::shared_ptr<BlockPool>(new BlockPool(max_kept_bytes));
}

BlockPool::~BlockPool() {
  for (const auto& [capacity, block] : kept_) ::operator delete(block, kAlign);
}

size_t BlockPool::Capacity(size_t n) {
  if (n < kMinPooledBytes) return n;
  // n is in (top / 2, top]; sixteenths of top leave at most an eighth of n unused.
  size_t top = kMinPooledBytes;
  while (top < n && top <= (SIZE_MAX >> 1)) top *= 2;
  const size_t step = top / 16;
  if (top < n || n > SIZE_MAX - step) return n;  // beyond any real allocation
  return (n + step - 1) / step * step;
}

std::shared_ptr<uint8_t> BlockPool::Get(size_t n) {
  if (n == 0) return nullptr;
  const size_t capacity = Capacity(n);
  uint8_t* block = nullptr;
  if (capacity >= kMinPooledBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = kept_.find(capacity); it != kept_.end()) {
      block = it->second;
      kept_bytes_ -= capacity;
      kept_.erase(it);
    }
  }
  if (block == nullptr) {
    block = static_cast<uint8_t*>(::operator new(capacity, kAlign, std::nothrow));
    if (block == nullptr) return nullptr;
  }
  if (capacity < kMinPooledBytes) {
    return {block, [](uint8_t* q) { ::operator delete(q, kAlign); }};
  }
  return {block, [pool = shared_from_this(), capacity](uint8_t* q) { pool->Put(q, capacity); }};
}

void BlockPool::Put(uint8_t* block, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (kept_bytes_ + capacity <= max_kept_bytes_) {
      kept_.emplace(capacity, block);
      kept_bytes_ += capacity;
      return;
    }
  }
  ::operator delete(block, kAlign);
}

size_t BlockPool::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_bytes_;
}

}  // namespace bitpush::transport
