// parse_checkpoint (trainer/checkpoint.h), the trainer's resume path, on arbitrary bytes.
//
// Input: flags u8 | checkpoint bytes.
//   flags bit0: append the FNV-1a checksum of the bytes, so mutations get past the
//               checksum and reach the field parser;
//   flags bit1: load as the rank and world size the bytes themselves name (offsets
//               12 and 16), so mutations get past the rank check; else rank 0 of 1;
//   flags bit2: a checkpoint that parses also has its communicator state loaded
//               (parse_state, as Communicator::load_state does on resume).
// Only gradcomm::Error escapes, and only CorruptPayload (malformed bytes) or
// InvalidArgument (another rank's file). A checkpoint that parses must write back
// to the same bytes (the reserved word and so the checksum aside) and parse again
// to the same state, bit for bit.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "gradcomm/errors.h"
#include "state.h"
#include "trainer/checkpoint.h"

using gradcomm::train::TrainState;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool same(const TrainState& a, const TrainState& b) {
  return a.config == b.config && a.epoch == b.epoch && a.step_in_epoch == b.step_in_epoch &&
         a.global_step == b.global_step && a.skipped_steps == b.skipped_steps && a.epoch_rng == b.epoch_rng &&
         std::memcmp(&a.loss_sum, &b.loss_sum, sizeof a.loss_sum) == 0 && a.loss_batches == b.loss_batches &&
         a.wire_bytes == b.wire_bytes && a.dense_bytes == b.dense_bytes && a.epoch_skipped == b.epoch_skipped &&
         same_bits(a.params, b.params) && same_bits(a.momentum, b.momentum) && a.comm_state == b.comm_state;
}

void expect_error(const gradcomm::Error& e, const char* where) {
  GRADCOMM_FUZZ_CHECK(e.code() == gradcomm::ErrorCode::kCorruptPayload ||
                          e.code() == gradcomm::ErrorCode::kInvalidArgument,
                      "%s raised %s: %s", where, gradcomm::error_code_name(e.code()), e.what());
}

TrainState seed_state(int params, bool with_comm_state, int rank = 0, int world = 1) {
  TrainState s;
  s.config = "model=mlp:784-128-10 batch=64 lr=0.1 compressor=topk:ratio=0.01";
  s.epoch = 2;
  s.step_in_epoch = 17;
  s.global_step = 250;
  s.skipped_steps = 1;
  s.epoch_rng = {1, 2, 3, 0x9E3779B97F4A7C15ull};
  s.loss_sum = 12.5;
  s.loss_batches = 17;
  s.wire_bytes = 123456;
  s.dense_bytes = 7890123;
  s.epoch_skipped = 0;
  for (int i = 0; i < params; ++i) {
    s.params.push_back(0.25f * static_cast<float>(i) - 1.0f);
    s.momentum.push_back(-0.5f * static_cast<float>(i));
  }
  if (with_comm_state) {
    gradcomm::detail::CompressionState state;
    auto& key = state.keys["fc1.weight"];
    key.step = 250;
    key.dtype = gradcomm::DType::kFloat32;
    key.numel = 2;
    key.residual.assign(8, 0x3F);
    s.comm_state = gradcomm::detail::serialize_state(state, rank, world);
  }
  return s;
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  auto add = [&](const std::string& name, uint8_t flags, std::vector<uint8_t> bytes) {
    if (flags & 1) bytes.resize(bytes.size() - 8);  // the harness appends the checksum
    bytes.insert(bytes.begin(), flags);
    seeds.add(name, bytes);
  };
  using gradcomm::train::serialize_checkpoint;
  add("full_file", 0x04, serialize_checkpoint(seed_state(6, true), 0, 1));
  add("no_params", 0x07, serialize_checkpoint(seed_state(0, false), 2, 4));
  add("with_state", 0x07, serialize_checkpoint(seed_state(3, true, 1, 2), 1, 2));
  add("other_rank", 0x01, serialize_checkpoint(seed_state(2, false), 3, 8));
  auto bytes = serialize_checkpoint(seed_state(4, false), 0, 1);
  bytes[bytes.size() - 8 - 8 - 1] ^= 0x80;  // inside the communicator state length
  add("bad_state_length", 0x07, bytes);
  bytes = serialize_checkpoint(seed_state(4, false), 0, 1);
  bytes[8] = 2;  // version
  add("bad_version", 0x01, bytes);
  add("bad_checksum", 0x00, serialize_checkpoint(seed_state(1, false), 0, 1));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto [bytes, rank, world] = gradcomm::fuzz::checksummed_file(data, size, /*rank_at=*/12, /*world_at=*/16,
                                                                [](const auto& b) { return gradcomm::detail::fnv1a64(b); });
  const std::string path = "/fuzz/rank0.ckpt";
  TrainState state;
  try {
    state = gradcomm::train::parse_checkpoint(bytes, path, rank, world);
  } catch (const gradcomm::Error& e) {
    expect_error(e, "parse_checkpoint");
    return 0;
  }
  GRADCOMM_FUZZ_CHECK(state.params.size() == state.momentum.size(), "%zu params, %zu momentum values",
                      state.params.size(), state.momentum.size());

  const std::vector<uint8_t> again = gradcomm::train::serialize_checkpoint(state, rank, world);
  GRADCOMM_FUZZ_CHECK(again.size() == bytes.size(), "rewritten as %zu bytes, read %zu", again.size(), bytes.size());
  // Bytes 20..23 are the reserved word (written as zero, not checked on read), the
  // last 8 the checksum over everything before.
  GRADCOMM_FUZZ_CHECK(std::memcmp(again.data(), bytes.data(), 20) == 0 &&
                          std::memcmp(again.data() + 24, bytes.data() + 24, bytes.size() - 32) == 0,
                      "a parsed checkpoint does not write back to its bytes");
  TrainState reparsed;
  try {
    reparsed = gradcomm::train::parse_checkpoint(again, path, rank, world);
  } catch (const gradcomm::Error& e) {
    GRADCOMM_FUZZ_CHECK(false, "a rewritten checkpoint does not parse: %s", e.what());
  }
  GRADCOMM_FUZZ_CHECK(same(state, reparsed), "write -> parse changed the checkpoint");

  if (data[0] & 4) {  // flags bit2
    try {
      gradcomm::detail::parse_state(state.comm_state, rank, world);
    } catch (const gradcomm::Error& e) {
      expect_error(e, "parse_state");
    }
  }
  return 0;
}
