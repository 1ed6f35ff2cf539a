// Comma-separated (or `separator`-separated) lists on command lines: "512,256",
// "none;topk:ratio=0.01". Every element must be there: a doubled separator, a leading or
// trailing one, or an empty text is refused, naming the flag, the text and the element,
// where splitting that skips empty parts would quietly read "512,,256" as 512,256
// (issue 42). Header-only, for the tools (the trainer, the benchmarks) as well as the
// library; InvalidArgument on a bad list.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

inline std::vector<std::string> split_list(std::string_view flag, std::string_view text, char separator = ',') {
  std::vector<std::string> out;
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find(separator, start), text.size());
    if (end == start) {
      throw InvalidArgument(fmt::format("{} '{}': element {} is empty; expected values separated by single '{}', "
                                        "with none empty",
                                        flag, text, out.size() + 1, separator));
    }
    out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The same, each element a decimal integer.
inline std::vector<int64_t> parse_int_list(std::string_view flag, std::string_view text) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(flag, text)) {
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec != std::errc() || end != item.data() + item.size()) {
      throw InvalidArgument(fmt::format("{} '{}': element {} ('{}') is not an integer", flag, text, out.size() + 1,
                                        item));
    }
    out.push_back(value);
  }
  return out;
}

}  // namespace gradcomm::detail
