// Compressed allreduce of host tensors (docs/architecture.md, "Compression"): each
// compressor family on its collective, with error feedback and per-key state. The
// steps are compressed_allreduce.h's, shared with the GPU path; compression.cc holds
// their host primitives. Runs inside the allreduce's Op, after the call header (which
// carries the canonical spec and the key's step) matched.
//
//   fp16, bf16, quant, qsgd, sign -> compressed ring (compressed_ring.cc)
//   topk                          -> sparse allgather, decoded in rank order
//   randomk                       -> dense allreduce of the k shared-index values
//   sketch                        -> dense allreduce of the count-sketch table, then
//                                    of the exact values at the recovered indices
//   powersgd                      -> dense allreduce of every matrix's P (and the
//                                    dense parts), then of every Q (powersgd_allreduce.cc)
//
// Error feedback (spec.ef): acc = grad + residual enters the collective, and the
// residual becomes what this rank's encodes dropped (acc - decode(payload) for
// the ring; acc with the transmitted indices zeroed for the sparsifiers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/ring_schedule.h"  // RingPhases
#include "compressors/codec.h"
#include "compressors/tensor_part.h"
#include "gradcomm/types.h"
#include "state.h"

namespace gradcomm::detail {

class Op;
struct CompressorSpec;              // compressors/spec.h
struct TwoLevelPlan;                // hierarchy.h
enum class ScheduleMode : uint8_t;  // hierarchy.h

// The host side of compression: parsed specs, the CPU codecs, and the compressed calls
// on host tensors. (The engine is the thread of engine.h; the compression procedure the
// host and the GPU share is compressed_allreduce.h.)
class HostCompression {
 public:
  HostCompression();
  ~HostCompression();

  // Parses once per distinct spec string; InvalidArgument from the registry.
  const CompressorSpec& spec(const std::string& text);
  // spec("none"), without the lookup: every uncompressed call asks for it. Set at
  // construction and never changed: any thread may read it without the issue lock.
  const CompressorSpec& none_spec() const { return *none_; }

  // True when the spec needs a key: error feedback, a step counter (warm-up) or
  // random draws that must differ from step to step.
  static bool stateful(const CompressorSpec& spec);

  // Allreduces data[0, numel) (fp32, in place) with `spec`; `key` (may be null for
  // stateless specs) provides the residual and step; `key_hash` seeds the streams;
  // `parts` (may be null) the tensor's shapes, for powersgd.
  void allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                 KeyState* key, uint64_t key_hash, const std::vector<TensorPart>* parts = nullptr);
  // The reduce-scatter of data[0, numel) (fp32, numel = N x count, in place: rank r's
  // segment r becomes its share) with a codec-ring spec (compressed_allreduce.h).
  void reduce_scatter(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                      KeyState* key, uint64_t key_hash);

  // allreduce at the top of a two-level call (Op::two_levels; hierarchy.h).
  void two_level_allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                           KeyState* key, uint64_t key_hash, const std::vector<TensorPart>* parts);
  void two_level_allreduce_compressed_inside(Op& op, float* data, int64_t numel, ReduceOp reduce_op,
                                             const CompressorSpec& spec, KeyState* key, uint64_t key_hash);

  // Step 2 of a two-level call alone (the CUDA path's level across the nodes, its levels
  // inside on NCCL): `segment` is this rank's segment of a tensor of `numel` elements under
  // `plan`, holding the node's sums; each piece is compressed across by its owners, the
  // residual kept at the piece's place in the whole tensor, as two_level_allreduce does.
  // Only for specs where compresses_pieces() holds; plan at piece_alignment(spec).
  void two_level_across(Op& op, float* segment, int64_t numel, const TwoLevelPlan& plan, ReduceOp reduce_op,
                        const CompressorSpec& spec, KeyState* key, uint64_t key_hash);
  // Whether a spec's two-level call is steps 1 and 3 dense around compressed pieces (not a
  // low-rank family, which compresses whole tensors, nor inside=compress).
  static bool compresses_pieces(const CompressorSpec& spec);
  // Where the segments of a two-level call start: multiples of the codec's bucket (codec-ring
  // families), else 1.
  int64_t piece_alignment(const CompressorSpec& spec);

  // The spec's CPU codec (kCodecRing families), made once per canonical spec.
  const DenseCodec& codec(const CompressorSpec& spec);

  // float16 and bfloat16 host tensors (compression_16bit.cc), for the specs where
  // compresses_16bit() holds (compressors/family.h): the codec-ring families and top-k. No float32 copy of the tensor: it is compressed in
  // float32 pieces of at most ~1M elements, each widened into one reused scratch buffer,
  // compressed as a piece of the whole (residual and selection at its place in the
  // tensor; k and min_numel count the whole; a piece's codec buckets are the whole
  // tensor's) and rounded back. Two levels: the levels inside the nodes run in the
  // tensor's own type, the pieces across as above; a two-level reduce-scatter still
  // widens the whole tensor.
  void allreduce_16bit(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                       const CompressorSpec& spec, KeyState* key, uint64_t key_hash);
  // in[0, N x count) -> out[0, count), this rank's share; `in` stays unchanged.
  void reduce_scatter_16bit(Op& op, const void* in, void* out, int64_t count, DType dtype, ReduceOp reduce_op,
                            const CompressorSpec& spec, KeyState* key, uint64_t key_hash);

 private:
  // One piece [begin, end) of a tensor of `numel` elements, at `values`: across the nodes
  // (two levels; kSum, the average is the levels') or one of a 16-bit tensor's pieces;
  // allreduced, or reduce-scattered (values[0, end - begin) as N segments; the residual keeps
  // the tensor's layout: compression_16bit.cc).
  enum class Piece : uint8_t { kAllreduce, kReduceScatter };
  void compress_piece(Op& op, float* values, int64_t begin, int64_t end, int64_t numel, const CompressorSpec& spec,
                      KeyState* key, uint64_t key_hash, ReduceOp reduce_op = ReduceOp::kSum,
                      Piece piece = Piece::kAllreduce);

  std::unordered_map<std::string, std::unique_ptr<const CompressorSpec>> specs_;
  const CompressorSpec* none_ = nullptr;  // specs_'s "none" (nodes never move), set at construction
  std::unordered_map<std::string, std::unique_ptr<DenseCodec>> codecs_;  // by canonical spec
};

// The collectives the engine runs (in src/collectives/).
// divisor > 1: the average, each chunk divided once it holds its final (decoded) sum.
// RingPhases::kReduceScatter: the reduce-scatter alone; rank r ends holding segment r of
// numel = N x count elements (segments of exactly `count`, chunks cut without regard to
// the codec's buckets), the exact sum of its own values and the decoded partial sums,
// divided; the other segments hold partial sums.
void compressed_ring_allreduce(Op& op, float* data, int64_t numel, const DenseCodec& codec,
                               const PhiloxStream& rng, float* residual, int divisor = 1,
                               RingPhases phases = RingPhases::kAllreduce);
// The same result by the direct schedule (direct.cc): each segment to its owner, encoded
// once; the owner's fp32 sum, encoded once, to every rank. Two roundings an element
// instead of the ring's N.
void compressed_direct_allreduce(Op& op, float* data, int64_t numel, const DenseCodec& codec,
                                 const PhiloxStream& rng, float* residual, int divisor = 1,
                                 RingPhases phases = RingPhases::kAllreduce);

// Its first phase alone over given segments ([starts[s], starts[s + 1]), N + 1 entries): rank
// s's segment ends holding its own values plus everyone else's, each encoded once and decoded
// in fp32 (not divided). `aligned`: every start is a multiple of the codec's alignment (the
// draws count from the start); otherwise from start x alignment, distinct for every element.
void compressed_direct_reduce_scatter(Op& op, float* data, const std::vector<int64_t>& starts,
                                      const DenseCodec& codec, const PhiloxStream& rng, float* residual,
                                      bool aligned);

// Which of the two a codec's allreduce over `ranks` takes: GRADCOMM_SCHEDULE=ring|direct
// (the communicator's ScheduleMode, hierarchy.h), or auto (default), the model's pick. Both move the same bytes (each rank sends (N-1)/N of
// the payload per phase) and run the same codec passes (one encode of the tensor, 2(N-1)/N
// decodes); the direct schedule sends 2(N-1) messages to the ring's 2(N-1) x chunks and
// rounds an element twice to the ring's N. So: direct from 3 ranks up; at 2 every term is
// equal (both round twice) and the ring, pipelined in chunks, stays.
enum class CodecSchedule : uint8_t { kRing, kDirect };
CodecSchedule codec_schedule(ScheduleMode mode, int ranks);

// `residual` (null without error feedback) still holds last step's; data becomes the result.
void powersgd_allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                        const std::vector<TensorPart>& parts, KeyState* key, uint64_t key_hash, float* residual);

}  // namespace gradcomm::detail
