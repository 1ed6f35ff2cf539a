#include "logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gradcomm::detail {

LogLevel log_level() {
  // Read once: logging sits on paths that must stay cheap.
  static const LogLevel level = [] {
    const char* v = std::getenv("GRADCOMM_LOG");  // GRADCOMM_LOG=warn|info|debug
    if (v == nullptr) return LogLevel::kWarn;
    if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
    if (std::strcmp(v, "info") == 0) return LogLevel::kInfo;
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
