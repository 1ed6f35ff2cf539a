// Checkpoints: one file per rank, D/rank<R>.ckpt, holding everything a resumed
// run needs to continue bit for bit, and nothing time-dependent (two runs that
// reach the same step write the same bytes).
//
// Format (little-endian):
//   magic "GCTRCKPT" | version u32 | rank u32 | world_size u32 | reserved u32 |
//   config: length u32 + bytes (the run's canonical settings; must match on resume) |
//   epoch i64 | step_in_epoch i64 | global_step i64 | skipped_steps i64 |
//   epoch_rng 4 x u64 (shuffle generator at the start of the current epoch) |
//   epoch accumulators: loss_sum f64 | loss_batches i64 | wire_bytes u64 | dense_bytes u64 | skipped i64 |
//   params: count u64 + f32s | momentum: count u64 + f32s |
//   communicator state: length u64 + bytes (Communicator::save_state) |
//   checksum u64 (FNV-1a 64 of every byte before it)
//
// Writing goes to rank<R>.ckpt.tmp, fsync, then the previous rank<R>.ckpt is
// renamed to rank<R>.ckpt.prev and the new file into place, and the directory is
// fsynced: a crash at any point leaves a complete file under one of the two names.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gradcomm::train {

struct TrainState {
  std::string config;
  int64_t epoch = 0;          // 0-based epoch in progress
  int64_t step_in_epoch = 0;  // steps of `epoch` already done
  int64_t global_step = 0;    // steps done since the start of training (skipped ones included)
  int64_t skipped_steps = 0;  // --nan skip: steps dropped so far
  std::array<uint64_t, 4> epoch_rng{};
  // What the current epoch has accumulated so far (for its log line).
  double loss_sum = 0;
  int64_t loss_batches = 0;
  uint64_t wire_bytes = 0;
  uint64_t dense_bytes = 0;
  int64_t epoch_skipped = 0;
  std::vector<float> params, momentum;
  std::vector<uint8_t> comm_state;
};

std::vector<uint8_t> serialize_checkpoint(const TrainState& state, int rank, int world_size);
// CorruptPayload naming the file, the field and the offset for malformed bytes
// (bad magic, unknown version, truncation, checksum mismatch, trailing bytes);
// InvalidArgument when the file belongs to another rank or world size.
TrainState parse_checkpoint(std::span<const uint8_t> bytes, const std::string& path, int rank, int world_size);

std::string checkpoint_path(const std::string& dir, int rank);  // DIR/rank<R>.ckpt
// Atomic replace as described above; TransportError-free: throws gradcomm::Error
// (InvalidArgument) naming the path and errno text on I/O failure.
void write_checkpoint(const std::string& dir, int rank, std::span<const uint8_t> bytes);
// Start-up check of --checkpoint-dir: creates the directory (and missing parents),
// then creates and removes a probe file in it, so that a directory the run cannot
// write is refused before training rather than at the first checkpoint. The probe's
// name is unique (mkstemp): every rank of a job may check the same directory at once.
// InvalidArgument "--checkpoint-dir DIR: cannot ...: <errno text>" when unusable.
void check_checkpoint_dir(const std::string& dir);
// The bytes of `path`, or nullopt when it does not exist (other I/O errors throw).
std::optional<std::vector<uint8_t>> read_file_if_exists(const std::string& path);

}  // namespace gradcomm::train
