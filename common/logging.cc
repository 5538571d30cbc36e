#include "common/logging.h"

#include <cstdio>
#include <cstdlib>

namespace bitpush {
namespace internal {

void CheckFailed(const char* file, int line, const char* condition, const std::string& message) {
  if (message.empty()) {
    spdlog::critical("CHECK failed at {}:{}: {}", file, line, condition);
  } else {
    spdlog::critical("CHECK failed at {}:{}: {}: {}", file, line, condition, message);
  }
  spdlog::default_logger()->flush();
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal

bool SetLogLevel(const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return false;
  spdlog::set_level(parsed);
  return true;
}

}  // namespace bitpush
