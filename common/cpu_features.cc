#include "common/cpu_features.h"

#include <cpuid.h>

#include <string>

namespace bitpush {
namespace {

uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  f.sse42 = ecx & bit_SSE4_2;
  f.popcnt = ecx & bit_POPCNT;
  f.fma = ecx & bit_FMA;
  f.f16c = ecx & bit_F16C;
  f.avx = ecx & bit_AVX;
  const bool osxsave = ecx & bit_OSXSAVE;
  if (osxsave) {
    const uint64_t xcr0 = ReadXcr0();
    f.os_saves_ymm = (xcr0 & 0x6) == 0x6;
    f.os_saves_zmm = (xcr0 & 0xE6) == 0xE6;
  }
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.avx2 = ebx & bit_AVX2;
    f.bmi2 = ebx & bit_BMI2;
    f.avx512f = ebx & bit_AVX512F;
    f.avx512bw = ebx & bit_AVX512BW;
    f.avx512vl = ebx & bit_AVX512VL;
    f.avx512dq = ebx & bit_AVX512DQ;
  }
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    f.avx512bf16 = eax & (1u << 5);
  }
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&s](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(sse42, "sse4.2");
  add(popcnt, "popcnt");
  add(avx, "avx");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(bmi2, "bmi2");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512bf16, "avx512bf16");
  add(os_saves_zmm, "os-zmm");
  return s;
}

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

bool IsaSupported(IsaLevel level) {
  const CpuFeatures& f = DetectCpuFeatures();
  const bool avx2 = f.avx && f.avx2 && f.fma && f.f16c && f.bmi2 && f.popcnt && f.os_saves_ymm;
  switch (level) {
    case IsaLevel::kScalar: return true;
    case IsaLevel::kAvx2: return avx2;
    case IsaLevel::kAvx512:
      return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.os_saves_zmm;
  }
  return false;
}

IsaLevel BestIsaLevel() {
  if (IsaSupported(IsaLevel::kAvx512)) return IsaLevel::kAvx512;
  if (IsaSupported(IsaLevel::kAvx2)) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

std::string_view IsaLevelName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar: return "scalar";
    case IsaLevel::kAvx2: return "avx2";
    case IsaLevel::kAvx512: return "avx512";
  }
  return "invalid";
}

StatusOr<IsaLevel> ParseIsaLevel(std::string_view name) {
  if (name == "scalar") return IsaLevel::kScalar;
  if (name == "avx2") return IsaLevel::kAvx2;
  if (name == "avx512") return IsaLevel::kAvx512;
  if (name == "auto") return BestIsaLevel();
  return InvalidArgumentError("unknown ISA level '" + std::string(name) +
                              "'; valid: auto, avx512, avx2, scalar");
}

Status CheckIsaSupported(IsaLevel level) {
  if (IsaSupported(level)) return Status::Ok();
  return FailedPreconditionError(
      "ISA level '" + std::string(IsaLevelName(level)) +
      "' is not supported by this CPU/OS (detected: " + DetectCpuFeatures().ToString() + ")");
}

}  // namespace bitpush
