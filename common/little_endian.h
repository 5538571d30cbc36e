// Little-endian integers and fp32 values in byte buffers, for the wire formats
// (compressors/payload.cc and the compressors' bodies, the zmq framing and lanes, the ucx
// wire): any alignment; a plain (unaligned) load or store on a little-endian host, byte by byte
// on any other, so the bytes are the same everywhere.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

namespace bitpush {

inline constexpr bool kHostIsLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

inline void PutU32(uint8_t* p, uint32_t v) {
  if constexpr (kHostIsLittleEndian) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
inline void PutU64(uint8_t* p, uint64_t v) {
  if constexpr (kHostIsLittleEndian) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
inline uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  if constexpr (kHostIsLittleEndian) {
    std::memcpy(&v, p, sizeof v);
  } else {
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  }
  return v;
}
inline uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  if constexpr (kHostIsLittleEndian) {
    std::memcpy(&v, p, sizeof v);
  } else {
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  }
  return v;
}

// An fp32 value as the little-endian bytes of its IEEE bit pattern.
inline void PutF32(uint8_t* p, float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  PutU32(p, u);
}
inline float GetF32(const uint8_t* p) {
  const uint32_t u = GetU32(p);
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

}  // namespace bitpush
