// The bitpush wire protocol version, carried in every RegisterRequest (proto/bitpush/v1/
// control.proto). A peer with another MAJOR version is refused with a message naming both;
// MINOR versions only add optional fields.
#pragma once

#include <cstdint>

namespace bitpush {

inline constexpr uint32_t kProtocolMajor = 1;
inline constexpr uint32_t kProtocolMinor = 2;

}  // namespace bitpush
