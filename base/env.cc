#include "env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

std::recursive_mutex& environment_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

void set_env_default(const char* name, const std::string& value) {
  std::lock_guard lock(environment_mutex());
  ::setenv(name, value.c_str(), /*overwrite=*/0);
}

std::optional<std::string> env_string(const char* name) {
  std::lock_guard lock(environment_mutex());
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

namespace {

std::optional<int64_t> parse_int(const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

int64_t checked_knob(const char* name, const std::optional<int64_t>& value, const std::string& raw, int64_t min,
                     int64_t max) {
  if (!value || *value < min || *value > max) {
    throw InvalidArgument(fmt::format("environment variable {}='{}': expected an integer in [{}, {}]", name, raw,
                                      min, max));
  }
  return *value;
}

}  // namespace

std::optional<int64_t> parse_bytes(const std::string& text) {
  if (text.empty()) return std::nullopt;
  int64_t scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': scale = int64_t{1} << 10; digits.pop_back(); break;
    case 'M': case 'm': scale = int64_t{1} << 20; digits.pop_back(); break;
    case 'G': case 'g': scale = int64_t{1} << 30; digits.pop_back(); break;
    default: break;
  }
  auto v = parse_int(digits);
  if (!v || *v < 0 || *v > (INT64_MAX / scale)) return std::nullopt;
  return *v * scale;
}

std::optional<int64_t> env_int_if_set(const char* name, int64_t min, int64_t max) {
  auto v = env_string(name);
  if (!v) return std::nullopt;
  return checked_knob(name, parse_int(*v), *v, min, max);
}

int64_t env_int(const char* name, int64_t fallback, int64_t min, int64_t max) {
  return env_int_if_set(name, min, max).value_or(fallback);
}

int64_t env_bytes(const char* name, int64_t fallback, int64_t min, int64_t max) {
  auto v = env_string(name);
  if (!v) return fallback;
  return checked_knob(name, parse_bytes(*v), *v, min, max);
}

}  // namespace gradcomm::detail
