// Run-time CPU feature detection and the SIMD level kernels are dispatched on.
//
// bitpush ships without -march flags: every kernel exists as scalar C++, an AVX2 version
// (AVX2 + FMA + F16C + BMI2) and an AVX-512 version (F + BW + VL + DQ + F16C + BMI2),
// compiled with per-function target attributes (BP_TARGET_AVX2 / BP_TARGET_AVX512).
// Components pick a level once, at construction, from their Options (default: the best
// level this CPU and OS support); tests and benchmarks force lower levels the same way.
// There is no process-wide "current level".
//
// Thread-safety: all functions are thread-safe (detection runs once, then is read-only).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace bitpush {

enum class IsaLevel : uint8_t {
  kScalar = 0,
  kAvx2 = 1,
  kAvx512 = 2,
};

struct CpuFeatures {
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool bmi2 = false;
  bool popcnt = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512bf16 = false;
  bool os_saves_ymm = false;  // XCR0 has SSE+AVX state
  bool os_saves_zmm = false;  // XCR0 has opmask + ZMM state

  std::string ToString() const;
};

// Detected once per process (cpuid + xgetbv); cached.
const CpuFeatures& DetectCpuFeatures();

bool IsaSupported(IsaLevel level);
// The best level this machine supports.
IsaLevel BestIsaLevel();

std::string_view IsaLevelName(IsaLevel level);  // "scalar", "avx2", "avx512"
// Parses "scalar" | "avx2" | "avx512" | "auto" (= BestIsaLevel()).
StatusOr<IsaLevel> ParseIsaLevel(std::string_view name);
// OK if `level` runs here; FailedPrecondition naming the missing features otherwise.
Status CheckIsaSupported(IsaLevel level);

}  // namespace bitpush

// Function attributes for SIMD kernels. Only functions carrying one of these may use the
// matching intrinsics; callers reach them through the dispatch in each kernel family.
// Each kernel also starts on a 64-byte boundary (one cache line), so where its loops fall
// relative to the instruction fetch blocks does not depend on what the linker placed before
// it: without this, a kernel's speed moved by several percent when unrelated code changed.
#define BP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi,bmi2,popcnt"), aligned(64)))
#define BP_TARGET_AVX512                                                                     \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2,popcnt"), \
                 aligned(64)))
