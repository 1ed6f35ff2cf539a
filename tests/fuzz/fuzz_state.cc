// parse_state (the communicator's checkpoint loader) on arbitrary bytes.
//
// Input: flags u8 | state bytes.
//   flags bit0: append the FNV-1a checksum of the state bytes, so mutations get past
//               the checksum and reach the entry parser;
//   flags bit1: load as the rank and world size the bytes themselves name (offsets
//               12 and 8), so mutations get past the rank check; else rank 0 of 1.
// Only CorruptPayload and InvalidArgument may escape parse_state. A state that
// parses must serialize and parse back to the same keys.
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_util.h"
#include "gradcomm/errors.h"
#include "state.h"

using gradcomm::detail::CompressionState;

namespace {

std::vector<uint8_t> seed_state_body(int keys, bool residual, int rank, int world) {
  CompressionState state;
  for (int i = 0; i < keys; ++i) {
    gradcomm::detail::KeyState entry;
    entry.step = 10u + static_cast<uint64_t>(i);
    entry.dtype = gradcomm::DType::kFloat32;
    entry.numel = 3;
    if (residual) entry.residual.assign(12, static_cast<uint8_t>(i + 1));
    if (i % 2 == 1) entry.extra.assign(8, static_cast<uint8_t>(0x40 + i));  // a compressor's own state (PowerSGD's Q)
    state.keys.emplace("layer" + std::to_string(i) + ".weight", std::move(entry));
  }
  std::vector<uint8_t> bytes = gradcomm::detail::serialize_state(state, rank, world);
  bytes.resize(bytes.size() - 8);  // the harness appends the checksum (flags bit0)
  return bytes;
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  for (auto [name, keys, residual] : {std::tuple{"empty", 0, false}, std::tuple{"one_key", 1, true},
                                      std::tuple{"three_keys", 3, true}, std::tuple{"no_residual", 2, false}}) {
    std::vector<uint8_t> input{0x03};
    const auto body = seed_state_body(keys, residual, 1, 4);
    input.insert(input.end(), body.begin(), body.end());
    seeds.add(name, input);
  }
  // A complete file as save_state writes it, checksum included, for rank 0 of 1.
  CompressionState state;
  state.keys["w"].numel = 1;
  std::vector<uint8_t> input{0x00};
  const auto bytes = gradcomm::detail::serialize_state(state, 0, 1);
  input.insert(input.end(), bytes.begin(), bytes.end());
  seeds.add("full_file", input);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto [bytes, rank, world] = gradcomm::fuzz::checksummed_file(data, size, /*rank_at=*/12, /*world_at=*/8,
                                                                [](const auto& b) { return gradcomm::detail::fnv1a64(b); });
  CompressionState state;
  try {
    state = gradcomm::detail::parse_state(bytes, rank, world);
  } catch (const gradcomm::CorruptPayload&) {
    return 0;
  } catch (const gradcomm::InvalidArgument&) {
    return 0;
  }
  const auto again = gradcomm::detail::parse_state(gradcomm::detail::serialize_state(state, rank, world), rank, world);
  GRADCOMM_FUZZ_CHECK(again.keys.size() == state.keys.size(), "%zu keys reparsed as %zu", state.keys.size(),
                      again.keys.size());
  for (const auto& [key, entry] : state.keys) {
    const auto it = again.keys.find(key);
    GRADCOMM_FUZZ_CHECK(it != again.keys.end(), "key lost in round trip");
    GRADCOMM_FUZZ_CHECK(it->second.step == entry.step && it->second.dtype == entry.dtype &&
                            it->second.numel == entry.numel && it->second.residual == entry.residual &&
                            it->second.extra == entry.extra,
                        "key '%s' changed in round trip", key.c_str());
  }
  return 0;
}
