// TensorView / ConstTensorView: a non-owning, contiguous, typed view of a flat tensor.
// fp16 and bf16 elements are stored as their raw 16-bit patterns (uint16_t).
//
// Thread-safety: a view; the owner of the memory decides who may touch it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/span.h"

namespace bitpush {

class ConstTensorView {
 public:
  ConstTensorView() = default;
  ConstTensorView(const void* data, size_t count, DType dtype)
      : data_(data), count_(count), dtype_(dtype) {}
  ConstTensorView(const float* data, size_t count)  // NOLINT
      : data_(data), count_(count), dtype_(DType::kFloat32) {}
  ConstTensorView(Span<const float> s)  // NOLINT(google-explicit-constructor)
      : ConstTensorView(s.data(), s.size()) {}

  const void* data() const { return data_; }
  size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return count_ * DTypeSize(dtype_); }

  const float* f32() const { return static_cast<const float*>(data_); }
  const uint16_t* u16() const { return static_cast<const uint16_t*>(data_); }

 private:
  const void* data_ = nullptr;
  size_t count_ = 0;
  DType dtype_ = DType::kFloat32;
};

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, size_t count, DType dtype) : data_(data), count_(count), dtype_(dtype) {}
  TensorView(float* data, size_t count)  // NOLINT
      : data_(data), count_(count), dtype_(DType::kFloat32) {}
  TensorView(Span<float> s) : TensorView(s.data(), s.size()) {}  // NOLINT

  void* data() const { return data_; }
  size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return count_ * DTypeSize(dtype_); }

  float* f32() const { return static_cast<float*>(data_); }
  uint16_t* u16() const { return static_cast<uint16_t*>(data_); }

  operator ConstTensorView() const { return {data_, count_, dtype_}; }  // NOLINT

 private:
  void* data_ = nullptr;
  size_t count_ = 0;
  DType dtype_ = DType::kFloat32;
};

}  // namespace bitpush
