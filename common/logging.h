// Logging and invariant checks.
//
// Logging goes through spdlog (BP_LOG_INFO("x={}", x) with fmt syntax). BP_CHECK is for
// broken invariants only — a bug, never bad input: it logs file, line, the condition and an
// optional formatted message, then aborts. Bad input is reported with a Status.
//
// Thread-safety: all macros may be used from any thread (spdlog's default logger is
// thread-safe).
#pragma once

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>

namespace bitpush {
namespace internal {

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

inline std::string CheckMessage() {
  return {};
}
template <typename... Args>
std::string CheckMessage(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}

}  // namespace internal

// Sets the default logger's level from a name: trace, debug, info, warn, error, off.
// Returns false (and leaves the level unchanged) for an unknown name.
bool SetLogLevel(const std::string& level);

}  // namespace bitpush

#define BP_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define BP_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define BP_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define BP_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define BP_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)

// BP_CHECK(cond) or BP_CHECK(cond, "format {}", args...).
#define BP_CHECK(cond, ...)                                                             \
  do {                                                                                  \
    if (__builtin_expect(!(cond), 0)) {                                                 \
      ::bitpush::internal::CheckFailed(__FILE__, __LINE__, #cond,                       \
                                       ::bitpush::internal::CheckMessage(__VA_ARGS__)); \
    }                                                                                   \
  } while (0)

#define BP_CHECK_OK(expr)                                                                       \
  do {                                                                                          \
    const ::bitpush::Status bp_check_status_ = (expr);                                          \
    if (!bp_check_status_.ok()) {                                                               \
      ::bitpush::internal::CheckFailed(__FILE__, __LINE__, #expr, bp_check_status_.ToString()); \
    }                                                                                           \
  } while (0)

#ifdef NDEBUG
#define BP_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#else
#define BP_DCHECK(cond, ...) BP_CHECK(cond, ##__VA_ARGS__)
#endif
