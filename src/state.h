// The communicator's compression state: per key, the error-feedback residual and
// the step counter. save_state()/load_state() move it through this format:
//
//   magic u32 'GCS1' | version u16 | reserved u16 | world_size u32 | rank u32 |
//   entry count u64 | entries... | checksum u64 (FNV-1a 64 of every byte before it)
//   entry: key length u32 | key bytes | step u64 | dtype u8 | numel i64 |
//          residual length u64 | residual bytes (numel float32 values, whatever the
//          key's dtype: a float16/bfloat16 key's residual is float32 too; or 0 when
//          the key has no residual) | extra length u64 | extra bytes (KeyState::extra;
//          version 2 on, at most kMaxExtraBytes)
// Version 1 (no extra) still loads.
//
// Everything little-endian. The parser treats its input as untrusted: every length
// is checked against the bytes that remain before anything is allocated.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "checksum.h"  // base/: fnv1a64, the state's checksum (and key hashes)
#include "gradcomm/types.h"

namespace gradcomm::detail {

struct AutoKeyState;  // auto_choice.h

// A key's state kept on a GPU (CUDA tensors on the NCCL path: the residual and the
// codecs' workspaces live in device memory; collectives/nccl_compressed.h). While a
// KeyState holds one, the device copy is the authoritative residual and `residual`
// below is empty; serialize_state asks the device copy for its bytes, so the saved
// format is the same whichever side holds the state.
class DeviceKeyState {
 public:
  virtual ~DeviceKeyState() = default;
  // The residual's bytes (numel * 4, or empty when the key has none), after the
  // GPU work that writes it has completed (waits with the communicator's deadline).
  virtual std::vector<uint8_t> residual_to_host() const = 0;
  // KeyState::extra's bytes (the compressor's own state, e.g. PowerSGD's Q), likewise.
  virtual std::vector<uint8_t> extra_to_host() const = 0;
  // DGC's momentum mask of the last sparsified call (KeyState::sent's meaning) into
  // `mask` (numel device floats on the key's device), enqueued on `stream`; false,
  // writing nothing, when no sparsified call has run.
  virtual bool sent_mask(float* mask, void* stream) const = 0;
};

struct KeyState {
  uint64_t step = 0;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
  std::vector<uint8_t> residual;  // empty, or numel float32 values (whatever dtype is)
  std::vector<uint8_t> extra;     // a compressor's own state beyond the residual (powersgd: the warm-start Q, fp32)
  std::shared_ptr<DeviceKeyState> device;  // set while the state lives on a GPU (then `residual` and `extra` are empty)
  uint32_t parts_digest = 0;  // the shapes of the key's powersgd calls (shape.h), checked at issue; not saved
  // The indices this rank's last sparsified call of the key sent (topk, randomk, sketch),
  // increasing: DGC's momentum masking (Communicator::sent_mask). Not saved.
  std::vector<uint64_t> sent;
  // compressor=auto's measurements of the key (its choice is in `extra`). Not saved.
  std::shared_ptr<AutoKeyState> auto_state;
};

// Moves a key's state from the GPU back into `key` (residual and extra), when it is
// there: for a CPU call on a key the NCCL path used before.
void take_back_from_device(KeyState& key);

struct CompressionState {
  std::map<std::string, KeyState> keys;  // ordered: the serialized bytes are deterministic
};

std::vector<uint8_t> serialize_state(const CompressionState& state, int rank, int world_size);
// CorruptPayload naming what is wrong (and where) for malformed bytes;
// InvalidArgument when well-formed state belongs to another rank or world size.
CompressionState parse_state(std::span<const uint8_t> bytes, int rank, int world_size);


}  // namespace gradcomm::detail
