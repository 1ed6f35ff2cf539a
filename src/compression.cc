#include "compression.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/collectives.h"
#include "compressed_allreduce.h"
#include "compressors/family.h"
#include "compressors/spec.h"
#include "compressors/sparse/sparse_code.h"
#include "env.h"
#include "half.h"
#include "hierarchy.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

// The compressed allreduce's primitives over host memory (compressed_allreduce.h lists them). One
// object a call: the key's residual and the selection of this step.
class HostPrimitives {
 public:
  HostPrimitives(HostCompression& compression, Op& op, const CompressedCall& call, int64_t numel)
      : compression_(compression), call_(call), op_(op), spec_(call.spec) {
    KeyState* key = call.key;
    if (key == nullptr) return;
    take_back_from_device(*key);  // the key's state was on a GPU (NCCL path)
    if (spec_.ef) {
      // The whole tensor's layout, a piece of it at its place (hierarchy.h).
      key->residual.resize(static_cast<size_t>(call.whole_numel(numel)) * sizeof(float));  // zero-filled the first time
      residual_ = reinterpret_cast<float*>(key->residual.data()) + call.offset;
    }
  }

  void fold_and_clear(float* data, int64_t numel) {
    if (residual_ == nullptr) return;
    // (The fp32 sums are reduce.h's: the ring's own vectorized loop.)
    reduce_inplace(data, residual_, numel, DType::kFloat32, ReduceOp::kSum);
    std::fill(residual_, residual_ + numel, 0.0f);
  }

  // The sparsifiers' form: acc in the residual, which then only needs its transmitted
  // coordinates replaced. Saves the copy acc -> residual, a full pass of reads and
  // writes, over folding into data. Same sums: fp32 addition commutes.
  const float* accumulate_in_residual(const float* data, int64_t numel) {
    if (residual_ == nullptr) return data;
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    reduce_inplace(residual_, data, numel, DType::kFloat32, ReduceOp::kSum);
    return residual_;
  }

  void dense_allreduce(float* data, int64_t numel, ReduceOp reduce_op, uint32_t unit_base) {
    detail::dense_allreduce(op_, data, numel, DType::kFloat32, reduce_op, unit_base);
  }

  void codec_round_trip(float* data, int64_t numel, const PhiloxStream& rng) {
    fold_and_clear(data, numel);
    const DenseCodec& c = compression_.codec(spec_);
    std::vector<uint8_t> payload(c.encoded_bytes(numel));
    std::vector<float> decoded(static_cast<size_t>(numel));
    {
      Op::PhaseTimer timer(op_, &Stats::encode_s);
      c.encode(data, numel, payload.data(), rng, 0);
    }
    {
      Op::PhaseTimer timer(op_, &Stats::decode_s);
      c.decode(payload, numel, decoded.data());
    }
    for (int64_t i = 0; i < numel; ++i) {
      if (residual_ != nullptr) residual_[i] = data[i] - decoded[i];
      data[i] = decoded[i];
    }
  }

  void codec_ring(float* data, int64_t numel, const PhiloxStream& rng, int divisor,
                  RingPhases phases = RingPhases::kAllreduce) {
    const DenseCodec& codec = compression_.codec(spec_);
    if (codec_schedule(op_.schedule_mode(), op_.size()) == CodecSchedule::kDirect) {
      compressed_direct_allreduce(op_, data, numel, codec, rng, residual_, divisor, phases);
    } else {
      compressed_ring_allreduce(op_, data, numel, codec, rng, residual_, divisor, phases);
    }
  }

  void dense_reduce_scatter(float* data, int64_t numel, ReduceOp reduce_op) {
    if (op_.size() > 1 && numel > 0) ring_reduce_scatter(op_, data, numel, DType::kFloat32, reduce_op);
  }

  SparseAlgo sparse_algo(const SparseShape& shape, int64_t numel) const {
    return choose_sparse_algo(shape, op_.size(), numel);
  }

  // With error feedback, acc lives in the residual and nothing reads data again: the
  // selection zeroes data (SparseOps::select), so the decoders write only the selected
  // entries instead of all of data.
  void select(float* data, int64_t numel, int64_t k, const PhiloxStream& rng) {
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    selected_ = sparse_ops(spec_).select(spec_, data, residual_, numel, k, rng);
    if (residual_ != nullptr) output_ = SparseOutput::kZeroed;
    keep_rounding(selected_.values.data());
  }

  void sparse_allreduce(SparseAlgo algo, const SparseShape& shape, float* data, int64_t numel, int64_t k,
                        ReduceOp reduce_op) {
    if (algo == SparseAlgo::kReduceScatter) {
      sparse_reduce_scatter_allreduce(op_, spec_.id, data, numel, reduce_op, selected_, shape.format, k, residual_,
                                      output_);
    } else {
      sparse_allgather_allreduce(op_, spec_.id, data, numel, reduce_op, selected_, shape.format, shape.exact_count,
                                 output_);
    }
  }

  void sparse_reduce_scatter(const SparseShape& shape, float* data, int64_t numel, int64_t k, ReduceOp reduce_op) {
    detail::sparse_reduce_scatter(op_, spec_.id, data, numel, reduce_op, selected_, shape.format, k);
  }

  void draw(int64_t numel, int64_t count, const PhiloxStream& rng) {
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    selected_.indices = sparse_ops(spec_).draw(spec_, numel, count, rng);
  }

  float* table_cells(SparseTable table) {
    cells_.assign(static_cast<size_t>(table.rows) * table.cols, 0.0f);
    return cells_.data();
  }
  const float* table_accumulate(SparseTable table, const PhiloxStream& rng, const float* data, int64_t numel,
                                float* cells) {
    const float* acc = accumulate_in_residual(data, numel);
    Op::PhaseTimer timer(op_, &Stats::encode_s);
    sparse_ops(spec_).accumulate(spec_, table, rng, acc, numel, cells);
    return acc;
  }
  void table_recover(SparseTable table, const PhiloxStream& rng, const float* cells, int64_t numel, int64_t k) {
    Op::PhaseTimer timer(op_, &Stats::decode_s);
    selected_.indices = sparse_ops(spec_).recover(spec_, table, rng, cells, numel, k);
  }

  void gather_sum_scatter(float* data, const float* acc, int64_t numel, ValueType type, uint32_t unit_base) {
    const std::vector<uint64_t>& indices = selected_.indices;
    std::vector<float>& values = selected_.values;
    {
      Op::PhaseTimer timer(op_, &Stats::encode_s);
      values.resize(indices.size());
      for (size_t j = 0; j < indices.size(); ++j) values[j] = acc[indices[j]];
      keep_rounding(values.data());
    }
    allreduce_values(values, type, unit_base);
    std::fill(data, data + numel, 0.0f);
    for (size_t j = 0; j < indices.size(); ++j) data[indices[j]] = values[j];
  }

  void keep_selection() {
    if (call_.key == nullptr) return;
    if (call_.whole == 0) {
      call_.key->sent = std::move(selected_.indices);  // done with them: no copy
      return;
    }
    // A piece: its indices at their place in the tensor, after the call's earlier pieces'
    // (the two-level schedule clears the key's selection before its first piece).
    for (uint64_t i : selected_.indices) call_.key->sent.push_back(i + static_cast<uint64_t>(call_.offset));
  }

  void low_rank(float* data, int64_t numel, ReduceOp reduce_op) {
    powersgd_allreduce(op_, data, numel, reduce_op, spec_,
                       call_.parts != nullptr ? *call_.parts : std::vector<TensorPart>{}, call_.key,
                       call_.key_hash, residual_);
  }

  void check_payloads(int64_t /*numel*/) {}  // the host decoders throw where they find a fault

  float* residual() const { return residual_; }  // null without error feedback

  void divide(float* data, int64_t numel, int ranks) {
    Op::PhaseTimer timer(op_, &Stats::reduce_s);
    divide_inplace(data, numel, DType::kFloat32, ranks);
  }

 private:
  void keep_rounding(const float* values) {
    if (residual_ != nullptr) keep_sparse_rounding(residual_, selected_.indices, values, spec_.values);
  }

  // Sums a selection's values across ranks, as fp32 or (values=fp16|bf16) as 16-bit
  // values on the wire; `values` holds the sums afterwards.
  void allreduce_values(std::vector<float>& values, ValueType type, uint32_t unit_base) {
    if (type == ValueType::kFp32) {
      detail::dense_allreduce(op_, values.data(), static_cast<int64_t>(values.size()), DType::kFloat32,
                              ReduceOp::kSum, unit_base);
      return;
    }
    std::vector<uint16_t> narrow(values.size());
    for (size_t j = 0; j < values.size(); ++j) narrow[j] = sparse_narrow(values[j], type);
    detail::dense_allreduce(op_, narrow.data(), static_cast<int64_t>(narrow.size()),
                            type == ValueType::kFp16 ? DType::kFloat16 : DType::kBFloat16, ReduceOp::kSum, unit_base);
    for (size_t j = 0; j < values.size(); ++j) values[j] = sparse_widen(narrow[j], type);
  }

  HostCompression& compression_;
  const CompressedCall& call_;
  Op& op_;
  const CompressorSpec& spec_;
  float* residual_ = nullptr;  // null without error feedback
  SparseVector selected_;      // this step's selection (own, drawn or recovered)
  SparseOutput output_ = SparseOutput::kFill;  // kZeroed: select zeroed data
  std::vector<float> cells_;   // a table family's table
};

}  // namespace

CodecSchedule codec_schedule(ScheduleMode mode, int ranks) {
  if (mode == ScheduleMode::kRing) return CodecSchedule::kRing;
  if (mode == ScheduleMode::kDirect) return CodecSchedule::kDirect;
  return ranks >= 3 ? CodecSchedule::kDirect : CodecSchedule::kRing;
}

HostCompression::HostCompression() { none_ = &spec("none"); }
HostCompression::~HostCompression() = default;

const CompressorSpec& HostCompression::spec(const std::string& text) {
  auto it = specs_.find(text);
  if (it == specs_.end()) {
    it = specs_.emplace(text, std::make_unique<const CompressorSpec>(parse_compressor_spec(text))).first;
  }
  return *it->second;
}

bool HostCompression::stateful(const CompressorSpec& spec) {
  const Family& family = family_of(spec.id);
  if (family.collective == Collective::kDense) return false;
  if (family.keeps_state != nullptr && family.keeps_state(spec)) return true;
  return spec.ef || spec.warmup > 0;
}

const DenseCodec& HostCompression::codec(const CompressorSpec& spec) {
  const std::string canonical = spec.canonical();
  auto it = codecs_.find(canonical);
  if (it == codecs_.end()) it = codecs_.emplace(canonical, make_dense_codec(spec)).first;
  return *it->second;
}

void HostCompression::allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                                  KeyState* key, uint64_t key_hash, const std::vector<TensorPart>* parts) {
  if (op.two_levels()) return two_level_allreduce(op, data, numel, reduce_op, spec, key, key_hash, parts);
  const CompressedCall call{spec, key, key_hash, parts, op.rank(), op.size()};
  HostPrimitives host(*this, op, call, numel);
  compressed_allreduce(host, call, data, numel, reduce_op);
}

// Compression across the nodes only (hierarchy.h): the nodes reduce dense, each piece is
// compressed by its owners, one rank of every node; a low-rank family's first ranks of
// the nodes compress the whole tensor.
void HostCompression::two_level_allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op,
                                          const CompressorSpec& spec, KeyState* key, uint64_t key_hash,
                                          const std::vector<TensorPart>* parts) {
  const Family& family = family_of(spec.id);
  if (family.collective == Collective::kLowRank) {
    two_level_by_leaders(op, data, numel, reduce_op, [&] {
      const CompressedCall call{spec, key, key_hash, parts, op.rank(), op.size()};
      HostPrimitives host(*this, op, call, numel);
      compressed_allreduce(host, call, data, numel, ReduceOp::kSum);
    });
    return;
  }
  if (key != nullptr) key->sent.clear();  // the pieces add theirs (keep_selection)
  if (spec.compress_inside && !runs_dense(spec, key != nullptr ? key->step : 0, numel)) {
    return two_level_allreduce_compressed_inside(op, data, numel, reduce_op, spec, key, key_hash);
  }
  detail::two_level_allreduce(op, data, numel, DType::kFloat32, reduce_op, piece_alignment(spec), 0,
                              [&](int64_t b, int64_t e) { compress_piece(op, data + b, b, e, numel, spec, key, key_hash); });
}

void HostCompression::two_level_across(Op& op, float* segment, int64_t numel, const TwoLevelPlan& plan,
                                       ReduceOp reduce_op, const CompressorSpec& spec, KeyState* key,
                                       uint64_t key_hash) {
  if (key != nullptr) key->sent.clear();
  const int64_t first = plan.segments[static_cast<size_t>(plan.local)];
  detail::two_level_across(op, plan, segment, DType::kFloat32, reduce_op, [&](int64_t b, int64_t e) {
    compress_piece(op, segment + (b - first), b, e, numel, spec, key, key_hash);
  });
}

bool HostCompression::compresses_pieces(const CompressorSpec& spec) {
  return family_of(spec.id).collective != Collective::kLowRank && !spec.compress_inside;
}

int64_t HostCompression::piece_alignment(const CompressorSpec& spec) {
  return family_of(spec.id).collective == Collective::kCodecRing ? codec(spec).alignment() : 1;
}

void HostCompression::compress_piece(Op& op, float* values, int64_t begin, int64_t end, int64_t numel,
                                     const CompressorSpec& spec, KeyState* key, uint64_t key_hash,
                                     ReduceOp reduce_op, Piece piece) {
  CompressedCall call{spec, key, key_hash, nullptr, op.rank(), op.size()};
  call.offset = begin;
  call.whole = numel;
  HostPrimitives host(*this, op, call, end - begin);
  if (piece == Piece::kReduceScatter) return compressed_reduce_scatter(host, call, values, end - begin, reduce_op);
  compressed_allreduce(host, call, values, end - begin, reduce_op);
}

// inside=compress (codec-ring families): step 1 inside the nodes is the direct compressed
// reduce-scatter over the node's segments (each rank's copy of a segment encoded once to its
// holder), steps 2 and 3 as for inside=dense. The allgather inside stays dense: its values are
// final, and encoding them again would round them a third time.
void HostCompression::two_level_allreduce_compressed_inside(Op& op, float* data, int64_t numel, ReduceOp reduce_op,
                                                            const CompressorSpec& spec, KeyState* key,
                                                            uint64_t key_hash) {
  const DenseCodec& c = codec(spec);
  const CompressedCall whole{spec, key, key_hash, nullptr, op.rank(), op.size()};
  HostPrimitives host(*this, op, whole, numel);
  host.fold_and_clear(data, numel);  // data holds acc; the encodes refill the residual
  const PhiloxStream mine{spec.seed, philox_stream_id(key_hash, whole.step(), op.rank())};
  const TwoLevelPlan plan = plan_two_levels(op.nodes(), op.rank(), numel, c.alignment());
  {
    const Op::View node(op, plan.node, 0);
    if (op.size() > 1) compressed_direct_reduce_scatter(op, data, plan.segments, c, mine, host.residual(), true);
  }
  // The node's sums are this rank's segment now: steps 2 and 3 with step 1 done. (This rank's
  // encodes above lost at the other ranks' segments only: its pieces' residual, which the
  // pieces' calls fold, is still the zero the fold left.)
  detail::two_level_allreduce(
      op, data, numel, DType::kFloat32, reduce_op, c.alignment(), 0,
      [&](int64_t b, int64_t e) { compress_piece(op, data + b, b, e, numel, spec, key, key_hash); }, Inside::kReduced);
}

void HostCompression::reduce_scatter(Op& op, float* data, int64_t numel, ReduceOp reduce_op,
                                       const CompressorSpec& spec, KeyState* key, uint64_t key_hash) {
  const CompressedCall call{spec, key, key_hash, nullptr, op.rank(), op.size()};
  HostPrimitives host(*this, op, call, numel);
  // Top-k sends each owner its segment's entries directly: one level (the selection is
  // the whole tensor's, whatever the nodes).
  if (!op.two_levels() || family_of(spec.id).collective == Collective::kSparseSelection) {
    return compressed_reduce_scatter(host, call, data, numel, reduce_op);
  }
  // Two levels (hierarchy.h): exact inside the nodes, each held block encoded once across.
  const int64_t count = numel / op.size();
  host.fold_and_clear(data, numel);  // data holds acc; the encodes across refill the residual
  if (runs_dense(spec, call.step(), numel)) {
    return detail::two_level_reduce_scatter(op, data, count, DType::kFloat32, reduce_op, nullptr);
  }
  class Blocks final : public BlockCodec {
   public:
    Blocks(const DenseCodec& codec, const PhiloxStream& rng, float* residual)
        : codec_(codec), rng_(rng), residual_(residual) {}
    size_t bytes(int64_t n) const override { return codec_.encoded_bytes(n); }
    void encode(const float* values, int64_t n, int64_t position, uint8_t* out) override {
      // A block need not start on the codec's alignment: its draws count from position x
      // alignment, as the ring's reduce-scatter chunks' do (compressed_ring.cc).
      const int64_t first = position * codec_.alignment();
      if (residual_ == nullptr) return codec_.encode(values, n, out, rng_, first);
      kept_.resize(static_cast<size_t>(n));
      codec_.encode_with_values(values, n, out, rng_, first, kept_.data(), 1);
      accumulate_loss(residual_ + position, values, kept_.data(), n);
    }
    void decode_add(std::span<const uint8_t> payload, int64_t n, float* out) override {
      codec_.decode_add(payload, n, out);
    }

   private:
    const DenseCodec& codec_;
    const PhiloxStream& rng_;
    float* residual_;
    std::vector<float> kept_;
  };
  const PhiloxStream mine{spec.seed, philox_stream_id(key_hash, call.step(), op.rank())};
  Blocks blocks(codec(spec), mine, host.residual());
  detail::two_level_reduce_scatter(op, data, count, DType::kFloat32, reduce_op, &blocks);
}

}  // namespace gradcomm::detail
