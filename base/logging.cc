#include "logging.h"

#include <cstdio>

#include "env.h"

namespace gradcomm::detail {

LogLevel log_level() {
  // Read once: logging sits on paths that must stay cheap.
  static const LogLevel level = [] {
    const auto v = env_string("GRADCOMM_LOG");  // GRADCOMM_LOG=warn|info|debug
    if (!v) return LogLevel::kWarn;
    if (*v == "debug") return LogLevel::kDebug;
    if (*v == "info") return LogLevel::kInfo;
    return LogLevel::kWarn;
  }();
  return level;
}

void log_line(LogLevel level, std::string_view text) {
  static constexpr const char* kNames[] = {"warn", "info", "debug"};
  // One fprintf per line so concurrent lines from threads do not interleave.
  std::fprintf(stderr, "[gradcomm %s] %.*s\n", kNames[static_cast<int>(level)], static_cast<int>(text.size()),
               text.data());
}

}  // namespace gradcomm::detail
