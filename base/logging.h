// Minimal leveled logging to stderr, set by GRADCOMM_LOG=warn|info|debug (default warn).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace gradcomm::detail {

enum class LogLevel : int { kWarn = 0, kInfo = 1, kDebug = 2 };
LogLevel log_level();
void log_line(LogLevel level, std::string_view text);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(level) <= static_cast<int>(log_level())) {
    log_line(level, fmt::format(format, std::forward<Args>(args)...));
  }
}

}  // namespace gradcomm::detail
