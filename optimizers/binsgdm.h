// BinSGDM (paper 004, Algorithm 1): the element kernels of its worker step and its server round,
// and a single-process reference of the whole algorithm.
//
// Worker step, per element i of a partition (fp32; one EMA factor beta for both moments):
//   m = beta * m + (1 - beta) * g            b = beta * b + (1 - beta) * |g|
//   r = m / (b + eps)                        (|r| <= 1: |m| <= b holds in fp32 too)
//   y = r + e;  u = Q(y);  e = y - u         (u = +-1, packed as bit i of byte i/8, LSB first,
//                                             bit 1 = +1; bits past n are 0)
// Server round over k pushes (bit vectors u_w), with scale = 1/n_workers when averaging:
//   a = float(2c - k) * scale                (c = the number of +1 bits at i: exactly the sum of
//                                             the +-1 in rank order, times scale)
//   y = a + e_bar;  u_bar = Q(y);  e_bar = y - u_bar     (without a server residual: y = a)
//
// Q, stochastic binarisation with P(+1) = clamp((y + 1) / 2, 0, 1) (unbiased on [-1, 1];
// |y| >= 1 maps to sign(y) deterministically), is defined once, by BinsgdmBit below: element i
// of stream s is +1 iff
//   float(CounterRandom32Lite(s, uint32_t(i)) >> 8)  <  (y + 1.0f) * 2^23
// i.e. U < (y + 1) / 2 for the 24-bit uniform U = (r >> 8) * 2^-24 on [0, 1) (every operation
// but y + 1 is exact), so P(+1) is within 2^-24 of the clamp. CounterRandom32Lite (one murmur3
// finaliser, common/counter_rng.h) rather than CounterRandom32: the hash is most of the worker
// step's arithmetic, and binsgdm_test checks the quantiser's mean and variance.
// The stream is StreamKey(seed, worker, key, round), worker = kServerStream on the server; i
// is the element's index in the partition (mod 2^32; partitions are far smaller).
//
// Non-finite values: an element whose b or y is not finite (a NaN or inf gradient; a moment
// overflowing fp32) restarts: m = b = 0 and y = 0, so it pushes Q(0) (a fair coin) and keeps
// e = -u. The worker's state is never poisoned; the push cannot carry the non-finite value
// (the format has only +-1; docs/errors.md). The server applies the same rule to y.
//
// Every ISA level (scalar, AVX-512; AVX2 runs the scalar loop) evaluates these formulas with
// the same fp32 operations in the same order: the library is compiled with -ffp-contract=off
// and the AVX-512 code multiplies and adds with separate instructions, so payloads and states
// are bit-identical across levels (binsgdm_test checks it).
//
// Ownership: the kernels write only the caller's buffers (the binsgdm compressor's worker state
// and payloads, compressors/binsgdm); a BinsgdmReference owns its per-key states.
// Thread-safety: the kernels are pure functions over caller-owned memory. A BinsgdmReference
// is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "common/counter_rng.h"
#include "common/cpu_features.h"
#include "common/status.h"

namespace bitpush::optimizers {

// The fp32 constants of a configuration (binsgdm's spec parameters are doubles).
struct BinsgdmHyper {
  float beta = 0.95f;
  float one_minus_beta = 0.05f;  // float(1.0 - beta), rounded once from double
  float eps = 1e-8f;
};
BinsgdmHyper MakeBinsgdmHyper(double beta, double eps);

// Q's decision for element i of stream `stream` given y: true means +1.
inline bool BinsgdmBit(uint64_t stream, uint32_t i, float y) {
  return static_cast<float>(CounterRandom32Lite(stream, i) >> 8) < (y + 1.0f) * 0x1p23f;
}

// Bytes of n packed bits.
inline size_t BinsgdmBitBytes(size_t n) {
  return (n + 7) / 8;
}

// The worker step over one partition: g (n gradients), m, b, e (n each, updated in place),
// bits (BinsgdmBitBytes(n) bytes, written whole; any alignment). Returns false when an element
// restarted (a non-finite g, or b / y not finite): the compressor's input check.
bool BinsgdmWorkerStep(const BinsgdmHyper& h, uint64_t stream, const float* g, float* m, float* b,
                       float* e, size_t n, uint8_t* bits, IsaLevel isa);

// Q with optional vanilla error feedback (the compressor's Compress / CompressWithFeedback):
//   x and e:  y = x + e, e <- y - u        x only: y = x        e only (x == nullptr): y = e,
//   e <- y - u (the residual already holds x + e).
// A non-finite y counts as 0 (the restart above); returns false when one did.
bool BinsgdmBinarize(uint64_t stream, const float* x, float* e, size_t n, uint8_t* bits,
                     IsaLevel isa);

// The server round: `pushes` holds k >= 1 bit vectors of n elements (padding bits 0); e is the
// server residual (n floats, updated) or nullptr.
void BinsgdmServerRound(const uint8_t* const* pushes, size_t k, size_t n, float scale, float* e,
                        uint64_t stream, uint8_t* bits, IsaLevel isa);

// A single-process reference of Algorithm 1: `workers` simulated workers, each with its own
// m, b, e per key; a server residual e_bar per key (when server_residual); the same random
// streams as a distributed run (worker w: StreamKey(seed, w, key, round); the server:
// StreamKey(seed, kServerStream, key, round)). Plain scalar code, written apart from the
// kernels above (only BinsgdmBit is shared), so the two check each other.
//
// One Step is one round of one key — in bitpush a key is one partition of a tensor (the
// worker engine cuts tensors into partitions, each its own key with its own state and
// streams); call Step once per partition with that partition's key id, elements and the
// round, in any order across keys. The state of a key is created (zeros) by its first Step.
//
// The apply step is plain SGD on the worker with decoupled weight decay (AdamW-style; the paper
// does not say, its digest §1.5 argues for decoupled), exactly:
//   mult = float(1.0 - double(lr) * wd)
//   x[i] = x[i] * mult - lr * u_bar[i]     (two fp32 products, one fp32 subtraction, no FMA)
// which is how bitpush.torch.BinSGDM applies the pulled +-1 update.
class BinsgdmReference {
 public:
  struct Options {
    double beta = 0.95;
    double eps = 1e-8;
    uint64_t seed = 0;
    size_t workers = 1;
    bool server_residual = true;  // error_feedback: both (false: worker)
    bool average = true;          // the server scales the sum by 1/workers (the default)
  };
  struct WorkerState {
    std::vector<float> m, b, e;
  };
  struct KeyState {
    std::vector<WorkerState> workers;
    std::vector<float> server_e;               // e_bar (empty without a server residual)
    std::vector<std::vector<uint8_t>> pushes;  // the last round's bit vectors, per worker
    std::vector<uint8_t> reply;                // the last round's u_bar bits
  };

  explicit BinsgdmReference(const Options& options);

  // One round of key `key`: worker_grads[w] points to worker w's n gradients; x (n values, the
  // replicated parameters) is updated in place. InvalidArgument when worker_grads does not have
  // one entry per worker or n differs from the key's earlier rounds.
  Status Step(uint64_t key, uint64_t round, const std::vector<const float*>& worker_grads, size_t n,
              float* x, float lr, double wd);

  // The key's state after its last Step; nullptr before the first.
  const KeyState* state(uint64_t key) const;

 private:
  Options options_;
  BinsgdmHyper hyper_;
  std::map<uint64_t, KeyState> keys_;
};

}  // namespace bitpush::optimizers
