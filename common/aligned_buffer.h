// AlignedBuffer<T>: an owning, 64-byte-aligned (cache line, one AVX-512 vector), uninitialised
// array of trivially copyable T. Resize keeps the prefix; it never shrinks capacity.
//
// Thread-safety: like std::vector — one writer, or any number of readers.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "common/span.h"

namespace bitpush {

inline constexpr size_t kBufferAlignment = 64;

template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "AlignedBuffer holds trivially copyable types");

 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept { swap(o); }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    AlignedBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~AlignedBuffer() { std::free(data_); }

  // Grows capacity if needed (contents of the first min(old, n) elements are kept); new
  // elements are uninitialised.
  void resize(size_t n) {
    if (n > capacity_) {
      const size_t bytes =
          ((n * sizeof(T) + kBufferAlignment - 1) / kBufferAlignment) * kBufferAlignment;
      T* p = static_cast<T*>(std::aligned_alloc(kBufferAlignment, bytes));
      if (p == nullptr) throw std::bad_alloc();
      if (size_ > 0) std::memcpy(p, data_, size_ * sizeof(T));
      std::free(data_);
      data_ = p;
      capacity_ = bytes / sizeof(T);
    }
    size_ = n;
  }
  void zero() {
    if (size_) std::memset(data_, 0, size_ * sizeof(T));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  Span<T> span() { return {data_, size_}; }
  Span<const T> span() const { return {data_, size_}; }

  void swap(AlignedBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace bitpush
