// What a payload's header says about its family: the family's wire id, and how sparse
// values travel. Small on purpose: the payload code, the codecs and the transports'
// checks need these bytes, not a parsed spec (spec.h).
#pragma once

#include <cstdint>

namespace gradcomm::detail {

// The byte a payload header carries for its family. Built-ins below; another
// family takes an unused value (family.h: register_family).
enum class CompressorId : uint8_t {
  kNone = 0,
  kFp16 = 1,
  kBf16 = 2,
  kTopk = 3,
  kRandomk = 4,
  kQsgd = 5,
  kQuant = 6,
  kSign = 7,
  kSketch = 8,
  kPowersgd = 9,
};
// The registered family's name ("topk"); "unknown" for an id no family has
// (family.h; registry.cc).
const char* compressor_name(CompressorId id);

enum class ValueType : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2 };  // how sparse values travel

}  // namespace gradcomm::detail
