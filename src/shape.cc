#include "shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>

#include "gradcomm/errors.h"
#include "wire.h"

namespace gradcomm::detail {
namespace {

constexpr int64_t kMaxNumel = std::numeric_limits<int64_t>::max();
constexpr size_t kMaxShownParts = 16;

std::string dims_text(const std::vector<int64_t>& dims) {
  if (dims.empty()) return "[]";
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

// The part for one shape, InvalidArgument for a negative dimension or an overflow.
TensorPart part_of(const std::vector<int64_t>& dims, const char* what) {
  int64_t numel = 1;
  for (int64_t d : dims) {
    if (d < 0) throw InvalidArgument(fmt::format("{} {} has a negative dimension", what, dims_text(dims)));
    if (d != 0 && numel > kMaxNumel / d) {
      throw InvalidArgument(fmt::format("{} {} has more than 2^63 elements", what, dims_text(dims)));
    }
    numel *= d;
  }
  return TensorPart{numel, dims.size() >= 2 ? dims[0] : 0};
}

}  // namespace

std::vector<TensorPart> tensor_parts(const std::vector<int64_t>& shape,
                                     const std::vector<std::vector<int64_t>>& parts, int64_t numel) {
  if (!shape.empty() && !parts.empty()) {
    throw InvalidArgument("CompressOptions: give shape or parts, not both");
  }
  if (!shape.empty()) {
    const TensorPart p = part_of(shape, "shape");
    if (p.numel != numel) {
      throw InvalidArgument(
          fmt::format("shape {} has {} elements but the tensor has {}", dims_text(shape), p.numel, numel));
    }
    return {p};
  }
  std::vector<TensorPart> out;
  out.reserve(parts.size());
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorPart p = part_of(parts[i], fmt::format("parts[{}]", i).c_str());
    if (p.numel > kMaxNumel - total) throw InvalidArgument("parts: more than 2^63 elements in all");
    total += p.numel;
    out.push_back(p);
  }
  if (!parts.empty() && total != numel) {
    throw InvalidArgument(
        fmt::format("parts: {} shapes with {} elements in all, but the tensor has {}", parts.size(), total, numel));
  }
  return out;
}

uint32_t parts_digest(const std::vector<TensorPart>& parts) {
  if (parts.empty()) return 0;
  std::string text;
  for (const auto& p : parts) text += fmt::format("{}:{};", p.numel, p.rows);
  const uint32_t h = fnv1a32(text);
  return h != 0 ? h : 1;
}

std::string describe_parts(const std::vector<TensorPart>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size() && i < kMaxShownParts; ++i) {
    if (i > 0) out += ", ";
    const auto& p = parts[i];
    out += p.rows >= 2 ? fmt::format("{}x{}", p.rows, p.numel / p.rows) : fmt::format("{}", p.numel);
  }
  if (parts.size() > kMaxShownParts) out += fmt::format(", ... ({} parts)", parts.size());
  return out;
}

}  // namespace gradcomm::detail
