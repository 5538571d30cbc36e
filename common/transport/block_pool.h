// Aligned, uninitialised blocks for received messages, recycled: a block handed back (its last
// shared_ptr released, on any thread) is kept for the next message of about its size, so a
// stream of large messages reuses memory whose pages are already mapped instead of taking a
// page fault per 4 KiB of every message (what a fresh allocation of a few MiB costs: glibc
// maps and unmaps them, and the kernel zeroes every page).
//
// Sizes are rounded up to a size class (sixteenths of the power of two at or above the size:
// at most 12.5 % unused);
// blocks below kMinPooledBytes are not kept (malloc serves those from warm memory). What is
// kept is bounded by `max_kept_bytes`: a block handed back beyond it is freed.
//
// Thread-safety: Get and the blocks' release are safe from any thread. Blocks may outlive the
// pool's owner: they hold the pool alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace bitpush::transport {

class BlockPool : public std::enable_shared_from_this<BlockPool> {
 public:
  static constexpr size_t kMinPooledBytes = 64 * 1024;
  static constexpr std::align_val_t kAlign{64};

  static std::shared_ptr<BlockPool> Create(size_t max_kept_bytes);
  ~BlockPool();

  // A block of at least `n` bytes aligned to kAlign, uninitialised; nullptr when n is 0 or
  // memory is exhausted.
  std::shared_ptr<uint8_t> Get(size_t n);

  // The size class of an n-byte block: n itself below kMinPooledBytes.
  static size_t Capacity(size_t n);
  size_t kept_bytes() const;

 private:
  explicit BlockPool(size_t max_kept_bytes) : max_kept_bytes_(max_kept_bytes) {}
  void Put(uint8_t* block, size_t capacity);

  const size_t max_kept_bytes_;
  mutable std::mutex mu_;
  std::multimap<size_t, uint8_t*> kept_;  // capacity -> block
  size_t kept_bytes_ = 0;
};

}  // namespace bitpush::transport
