#include "optimizers/binsgdm.h"

#include <cmath>
#include <cstring>
#include <string>

#include "optimizers/binsgdm_kernels.h"

namespace bitpush::optimizers {
namespace {

inline bool Finite(float v) {
  return v - v == 0.0f;
}

// Collects bits LSB first and writes each byte when it is full (and the last, partial one).
class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void Put(size_t i, bool bit) {
    byte_ |= static_cast<uint8_t>(bit) << (i & 7);
    if ((i & 7) == 7) Flush(i);
  }
  void Finish(size_t n) {
    if (n & 7) Flush(n - 1);
  }

 private:
  void Flush(size_t i) {
    out_[i >> 3] = byte_;
    byte_ = 0;
  }
  uint8_t* out_;
  uint8_t byte_ = 0;
};

inline bool GetBit(const uint8_t* bits, size_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1;
}

}  // namespace

BinsgdmHyper MakeBinsgdmHyper(double beta, double eps) {
  BinsgdmHyper h;
  h.beta = static_cast<float>(beta);
  h.one_minus_beta = static_cast<float>(1.0 - beta);
  h.eps = static_cast<float>(eps);
  return h;
}

namespace internal {

bool BinsgdmWorkerStepScalar(const BinsgdmHyper& h, uint64_t stream, const float* g, float* m,
                             float* b, float* e, size_t n, uint8_t* bits) {
  BitWriter out(bits);
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    float mi = h.beta * m[i] + h.one_minus_beta * gi;
    float bi = h.beta * b[i] + h.one_minus_beta * std::fabs(gi);
    float y = mi / (bi + h.eps) + e[i];
    if (!(Finite(bi) && Finite(y))) {  // restart the element (binsgdm.h)
      finite = false;
      mi = 0.0f;
      bi = 0.0f;
      y = 0.0f;
    }
    const bool bit = BinsgdmBit(stream, static_cast<uint32_t>(i), y);
    m[i] = mi;
    b[i] = bi;
    e[i] = y - (bit ? 1.0f : -1.0f);
    out.Put(i, bit);
  }
  out.Finish(n);
  return finite;
}

bool BinsgdmBinarizeScalar(uint64_t stream, const float* x, float* e, size_t n, uint8_t* bits) {
  BitWriter out(bits);
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    float y = x == nullptr ? e[i] : (e == nullptr ? x[i] : x[i] + e[i]);
    if (!Finite(y)) {
      finite = false;
      y = 0.0f;
    }
    const bool bit = BinsgdmBit(stream, static_cast<uint32_t>(i), y);
    if (e != nullptr) e[i] = y - (bit ? 1.0f : -1.0f);
    out.Put(i, bit);
  }
  out.Finish(n);
  return finite;
}

void BinsgdmServerRoundScalar(const uint8_t* const* pushes, size_t k, size_t n, float scale,
                              float* e, uint64_t stream, uint8_t* bits) {
  BitWriter out(bits);
  const int32_t count = static_cast<int32_t>(k);
  for (size_t i = 0; i < n; ++i) {
    int32_t c = 0;
    for (size_t w = 0; w < k; ++w) c += GetBit(pushes[w], i);
    const float a = static_cast<float>(2 * c - count) * scale;
    float y = e == nullptr ? a : a + e[i];
    if (!Finite(y)) y = 0.0f;
    const bool bit = BinsgdmBit(stream, static_cast<uint32_t>(i), y);
    if (e != nullptr) e[i] = y - (bit ? 1.0f : -1.0f);
    out.Put(i, bit);
  }
  out.Finish(n);
}

}  // namespace internal

bool BinsgdmWorkerStep(const BinsgdmHyper& h, uint64_t stream, const float* g, float* m, float* b,
                       float* e, size_t n, uint8_t* bits, IsaLevel isa) {
  return (isa == IsaLevel::kAvx512
              ? internal::BinsgdmWorkerStepAvx512
              : internal::BinsgdmWorkerStepScalar)(h, stream, g, m, b, e, n, bits);
}

bool BinsgdmBinarize(uint64_t stream, const float* x, float* e, size_t n, uint8_t* bits,
                     IsaLevel isa) {
  return (isa == IsaLevel::kAvx512 ? internal::BinsgdmBinarizeAvx512
                                   : internal::BinsgdmBinarizeScalar)(stream, x, e, n, bits);
}

void BinsgdmServerRound(const uint8_t* const* pushes, size_t k, size_t n, float scale, float* e,
                        uint64_t stream, uint8_t* bits, IsaLevel isa) {
  (isa == IsaLevel::kAvx512
       ? internal::BinsgdmServerRoundAvx512
       : internal::BinsgdmServerRoundScalar)(pushes, k, n, scale, e, stream, bits);
}

// ---- the reference (Algorithm 1), element by element, apart from the kernels ----

BinsgdmReference::BinsgdmReference(const Options& options)
    : options_(options), hyper_(MakeBinsgdmHyper(options.beta, options.eps)) {}

const BinsgdmReference::KeyState* BinsgdmReference::state(uint64_t key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &it->second;
}

Status BinsgdmReference::Step(uint64_t key, uint64_t round,
                              const std::vector<const float*>& worker_grads, size_t n, float* x,
                              float lr, double wd) {
  const size_t workers = options_.workers;
  if (worker_grads.size() != workers) {
    return InvalidArgumentError("BinsgdmReference: " + std::to_string(worker_grads.size()) +
                                " gradients for " + std::to_string(workers) + " workers");
  }
  auto [it, fresh] = keys_.try_emplace(key);
  KeyState& ks = it->second;
  if (fresh) {
    ks.workers.resize(workers);
    for (WorkerState& w : ks.workers) {
      w.m.assign(n, 0.0f);
      w.b.assign(n, 0.0f);
      w.e.assign(n, 0.0f);
    }
    if (options_.server_residual) ks.server_e.assign(n, 0.0f);
    ks.pushes.assign(workers, std::vector<uint8_t>(BinsgdmBitBytes(n)));
    ks.reply.assign(BinsgdmBitBytes(n), 0);
  } else if (ks.workers[0].m.size() != n) {
    return InvalidArgumentError("BinsgdmReference: key " + std::to_string(key) + " has " +
                                std::to_string(ks.workers[0].m.size()) + " elements, not " +
                                std::to_string(n));
  }

  // Workers (lines 4-10): moments, ratio, binarisation with the worker residual.
  std::vector<std::vector<float>> u(workers, std::vector<float>(n));
  for (size_t w = 0; w < workers; ++w) {
    WorkerState& s = ks.workers[w];
    const float* g = worker_grads[w];
    const uint64_t stream = StreamKey(options_.seed, static_cast<uint32_t>(w), key, round);
    std::vector<uint8_t>& push = ks.pushes[w];
    std::fill(push.begin(), push.end(), 0);
    for (size_t i = 0; i < n; ++i) {
      const float mi = hyper_.beta * s.m[i] + hyper_.one_minus_beta * g[i];
      const float bi = hyper_.beta * s.b[i] + hyper_.one_minus_beta * std::fabs(g[i]);
      const float r = mi / (bi + hyper_.eps);
      float y = r + s.e[i];
      s.m[i] = mi;
      s.b[i] = bi;
      if (!std::isfinite(bi) || !std::isfinite(y)) {
        s.m[i] = 0.0f;
        s.b[i] = 0.0f;
        y = 0.0f;
      }
      const bool bit = BinsgdmBit(stream, static_cast<uint32_t>(i), y);
      u[w][i] = bit ? 1.0f : -1.0f;
      s.e[i] = y - u[w][i];
      if (bit) push[i / 8] = static_cast<uint8_t>(push[i / 8] | (1u << (i % 8)));
    }
  }

  // Server (lines 12-13): the average of the +-1 (summed in rank order, then scaled), the
  // server residual, re-binarisation from the server's stream.
  const float scale = options_.average && workers > 1 ? 1.0f / static_cast<float>(workers) : 1.0f;
  const uint64_t server_stream = StreamKey(options_.seed, kServerStream, key, round);
  std::fill(ks.reply.begin(), ks.reply.end(), 0);
  const float mult = static_cast<float>(1.0 - static_cast<double>(lr) * wd);
  for (size_t i = 0; i < n; ++i) {
    float a = u[0][i];
    for (size_t w = 1; w < workers; ++w) a = a + u[w][i];
    if (scale != 1.0f) a = a * scale;
    float y = options_.server_residual ? a + ks.server_e[i] : a;
    if (!std::isfinite(y)) y = 0.0f;
    const bool bit = BinsgdmBit(server_stream, static_cast<uint32_t>(i), y);
    const float ubar = bit ? 1.0f : -1.0f;
    if (options_.server_residual) ks.server_e[i] = y - ubar;
    if (bit) ks.reply[i / 8] = static_cast<uint8_t>(ks.reply[i / 8] | (1u << (i % 8)));
    // Worker apply (line 16) with decoupled weight decay.
    x[i] = x[i] * mult - lr * ubar;
  }
  return Status::Ok();
}

}  // namespace bitpush::optimizers
