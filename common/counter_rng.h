// Counter-based random numbers: the value at position `i` of stream `s` is a pure function
// of (s, i). Nothing is carried from one call to the next, so a stream derived from (seed,
// worker, key, round) draws the same numbers in every run (reproducible), different workers
// draw independent numbers, and SIMD kernels compute 16 positions at once with the same
// results as scalar code.
//
// - StreamKey(seed, worker, key, round): a 64-bit stream id (SplitMix64 mixing of the four;
//   `worker` is whose stream it is: a worker's rank, or kServerStream for a server).
// - CounterRandom64(s, i): SplitMix64's output number i of the sequence starting at state s.
// - CounterRandom32(s, i): a cheaper 32-bit hash (two murmur3 finalisers, multiply-xorshift),
//   used per element by stochastic rounding; kernels vectorise exactly this function.
// - CounterRandom32Lite(s, i): one murmur3 finaliser of (i * golden + low word) ^ high word,
//   half CounterRandom32's multiplies, for kernels where the hash is a large share of the time
//   (sdp4bit's quantiser). Still a bijection of i for a fixed stream, with the finaliser's
//   avalanche; the statistical tests of its users check unbiasedness and variance.
// - UniformBelow(r64, bound): Lemire's multiply-shift, bias <= bound / 2^64.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

// Fmix32 and CounterRandom32Lite are also device functions under nvcc (SEPARATE's Gaussian
// stream on the GPU, worker/gpu/separate_gaussian.cu): the same integer arithmetic.
#if defined(__CUDACC__)
#define BITPUSH_COUNTER_RNG_HD __host__ __device__
#else
#define BITPUSH_COUNTER_RNG_HD
#endif

namespace bitpush {

inline constexpr uint64_t kGolden64 = 0x9E3779B97F4A7C15ull;
inline constexpr uint32_t kGolden32 = 0x9E3779B1u;

inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

BITPUSH_COUNTER_RNG_HD inline uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// The stream owner of a server's re-compression (one server owns a key, so one id suffices).
inline constexpr uint32_t kServerStream = 0xFFFFFFFFu;

inline uint64_t StreamKey(uint64_t seed, uint32_t worker, uint64_t key, uint64_t round) {
  const uint64_t s = Mix64(Mix64(seed + kGolden64) ^ (uint64_t{worker} + 0xD6E8FEB86659FD93ull));
  return Mix64(Mix64(s ^ (key + 0x632BE59BD9B4E019ull)) ^ (round + 0x8CB92BA72F3D8DD7ull));
}

inline uint64_t CounterRandom64(uint64_t stream, uint64_t i) {
  return Mix64(stream + (i + 1) * kGolden64);
}

inline uint32_t CounterRandom32(uint64_t stream, uint32_t i) {
  const uint32_t lo = static_cast<uint32_t>(stream);
  const uint32_t hi = static_cast<uint32_t>(stream >> 32);
  return Fmix32(Fmix32(i * kGolden32 + lo) ^ hi);
}

BITPUSH_COUNTER_RNG_HD inline uint32_t CounterRandom32Lite(uint64_t stream, uint32_t i) {
  const uint32_t lo = static_cast<uint32_t>(stream);
  const uint32_t hi = static_cast<uint32_t>(stream >> 32);
  return Fmix32((i * kGolden32 + lo) ^ hi);
}

inline uint64_t UniformBelow(uint64_t r64, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r64) * bound) >> 64);
}

}  // namespace bitpush
