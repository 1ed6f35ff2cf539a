#include "compression.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/collectives.h"
#include "compressors/family.h"
#include "compressors/topk/sparse_code.h"
#include "comm_impl.h"
#include "half.h"
#include "reduce.h"

namespace gradcomm::detail {
namespace {

// acc = data + residual, in data; the residual is then free to collect this step's loss.
// (The fp32 sums are reduce.h's: the ring's own vectorized loop.)
void fold_residual(float* data, int64_t numel, const float* residual) {
  if (residual == nullptr) return;
  reduce_inplace(data, residual, numel, DType::kFloat32, ReduceOp::kSum);
}

// The sparsifiers' form: acc = data + residual, in the residual, which then only
// needs its transmitted coordinates zeroed (residual = acc with the selection
// removed). Returns where acc is. Saves the copy acc -> residual, a full pass
// of reads and writes, over folding into data. Same sums: fp32 addition commutes.
const float* accumulate_in_residual(const float* data, int64_t numel, float* residual) {
  if (residual == nullptr) return data;
  reduce_inplace(residual, data, numel, DType::kFloat32, ReduceOp::kSum);
  return residual;
}

// Error feedback after a selection was sent: the residual at a sent index keeps what
// the value type's rounding dropped (x - x', 0 for fp32; sparse_code.h's rule), so
// only the rounding, not the value, is carried to the next step.
void keep_rounding(float* residual, const std::vector<uint64_t>& indices, const float* values, ValueType type) {
  if (residual == nullptr) return;
  for (size_t j = 0; j < indices.size(); ++j) {
    residual[indices[j]] = sparse_rounding_residual(values[j], sparse_round(values[j], type));
  }
}

// Output = zeros except `values` at `indices` (both of one selection).
void scatter(float* data, int64_t numel, const std::vector<uint64_t>& indices, const float* values) {
  std::fill(data, data + numel, 0.0f);
  for (size_t j = 0; j < indices.size(); ++j) data[indices[j]] = values[j];
}

}  // namespace

const CompressorSpec& CompressionEngine::spec(const std::string& text) {
  auto it = specs_.find(text);
  if (it == specs_.end()) it = specs_.emplace(text, parse_compressor_spec(text)).first;
  return it->second;
}

bool CompressionEngine::stateful(const CompressorSpec& spec) {
  const Family& family = family_of(spec.id);
  if (family.collective == Collective::kDense) return false;
  if (family.keeps_state != nullptr && family.keeps_state(spec)) return true;
  return spec.ef || spec.warmup > 0;
}

const DenseCodec& CompressionEngine::codec(const CompressorSpec& spec) {
  const std::string canonical = spec.canonical();
  auto it = codecs_.find(canonical);
  if (it == codecs_.end()) it = codecs_.emplace(canonical, make_dense_codec(spec)).first;
  return *it->second;
}

void CompressionEngine::allreduce(Op& op, float* data, int64_t numel, ReduceOp reduce_op, const CompressorSpec& spec,
                                  KeyState* key, uint64_t key_hash, const std::vector<powersgd::Part>* parts) {
  const int n = op.size();
  const uint64_t step = key != nullptr ? key->step : 0;
  if (key != nullptr) take_back_from_device(*key);  // the key's state was on a GPU (NCCL path)
  float* residual = nullptr;
  if (spec.ef && key != nullptr) {
    key->residual.resize(static_cast<size_t>(numel) * sizeof(float));  // zero-filled the first time
    residual = reinterpret_cast<float*>(key->residual.data());
  }
  const PhiloxStream mine{spec.seed, philox_stream_id(key_hash, step, op.rank())};
  const PhiloxStream shared{spec.seed, philox_stream_id(key_hash, step, -1)};

  // Warm-up steps and small tensors go dense (with what the residual still holds).
  if (step < static_cast<uint64_t>(spec.warmup) || numel < spec.min_numel) {
    fold_residual(data, numel, residual);
    if (residual != nullptr) std::fill(residual, residual + numel, 0.0f);
    dense_allreduce(op, data, numel, DType::kFloat32, reduce_op);
    return;
  }

  switch (family_of(spec.id).collective) {
    case Collective::kCodecRing: {
      fold_residual(data, numel, residual);  // data now holds acc
      const DenseCodec& c = codec(spec);
      if (residual != nullptr) std::fill(residual, residual + numel, 0.0f);
      if (n == 1) {  // nothing to exchange, but the output is still what compression keeps
        std::vector<uint8_t> payload(c.encoded_bytes(numel));
        std::vector<float> decoded(static_cast<size_t>(numel));
        {
          Op::PhaseTimer timer(op, &Stats::encode_s);
          c.encode(data, numel, payload.data(), mine, 0);
        }
        {
          Op::PhaseTimer timer(op, &Stats::decode_s);
          c.decode(payload, numel, decoded.data());
        }
        for (int64_t i = 0; i < numel; ++i) {
          if (residual != nullptr) residual[i] = data[i] - decoded[i];
          data[i] = decoded[i];
        }
      } else {
        compressed_ring_allreduce(op, data, numel, c, mine, residual);
      }
      break;
    }
    case Collective::kSparseSelection: {
      const SparseFormat format = sparse_format(spec);
      const int64_t k = selection_count(spec.ratio, spec.k, numel);
      SparseVector selected;
      {
        Op::PhaseTimer timer(op, &Stats::encode_s);
        selected = topk_select_accumulate(data, residual, numel, k, spec.select, mine);
        keep_rounding(residual, selected.indices, selected.values.data(), spec.values);
      }
      if (choose_sparse_algo(spec, n, numel) == SparseAlgo::kReduceScatter) {
        sparse_reduce_scatter_allreduce(op, data, numel, reduce_op, selected, format, k, residual);
      } else {
        sparse_allgather_allreduce(op, data, numel, reduce_op, selected, format, spec.select == TopkSelect::kExact);
      }
      if (key != nullptr) key->sent = std::move(selected.indices);  // done with them: no copy
      return;
    }
    case Collective::kSharedIndices: {
      std::vector<uint64_t> indices;
      std::vector<float> values;
      {
        Op::PhaseTimer timer(op, &Stats::encode_s);
        const float* acc = accumulate_in_residual(data, numel, residual);
        indices = randomk_indices(numel, selection_count(spec.ratio, 0, numel), shared);
        values.resize(indices.size());
        for (size_t j = 0; j < indices.size(); ++j) values[j] = acc[indices[j]];
        keep_rounding(residual, indices, values.data(), spec.values);
      }
      allreduce_values(op, values, spec.values, 0);
      scatter(data, numel, indices, values.data());
      if (key != nullptr) key->sent = std::move(indices);
      break;
    }
    case Collective::kSketchThenValues: {
      const int64_t k = selection_count(spec.ratio, spec.k, numel);
      const CountSketch sketch(spec.rows, sketch_columns(spec, k), shared);
      std::vector<float> table(static_cast<size_t>(sketch.rows()) * sketch.cols(), 0.0f);
      std::vector<float> estimate(static_cast<size_t>(numel));
      const float* acc = nullptr;
      {
        Op::PhaseTimer timer(op, &Stats::encode_s);
        acc = accumulate_in_residual(data, numel, residual);
        sketch.accumulate(acc, numel, table.data());
      }
      dense_allreduce(op, table.data(), static_cast<int64_t>(table.size()), DType::kFloat32, ReduceOp::kSum);
      {
        Op::PhaseTimer timer(op, &Stats::decode_s);
        sketch.estimate(table.data(), numel, estimate.data());
      }
      // Same summed table on every rank, so the same heavy hitters everywhere.
      std::vector<uint64_t> indices = topk_select(estimate.data(), numel, k, TopkSelect::kExact, shared).indices;
      std::vector<float> values(indices.size());
      for (size_t j = 0; j < indices.size(); ++j) values[j] = acc[indices[j]];
      keep_rounding(residual, indices, values.data(), spec.values);
      allreduce_values(op, values, spec.values, kSecondPhaseUnits);
      scatter(data, numel, indices, values.data());
      if (key != nullptr) key->sent = std::move(indices);
      break;
    }
    case Collective::kLowRank:
      powersgd_allreduce(op, data, numel, reduce_op, spec, parts != nullptr ? *parts : std::vector<powersgd::Part>{},
                         key, key_hash, residual);
      return;
    case Collective::kDense:
      fold_residual(data, numel, residual);
      dense_allreduce(op, data, numel, DType::kFloat32, reduce_op);
      return;
  }
  if (reduce_op == ReduceOp::kAvg) {
    Op::PhaseTimer timer(op, &Stats::reduce_s);
    divide_inplace(data, numel, DType::kFloat32, n);
  }
}

// Sums the values of a sparse selection across ranks, as fp32 or (values=fp16|bf16)
// as 16-bit values on the wire; the caller's vector holds the sums afterwards.
void CompressionEngine::allreduce_values(Op& op, std::vector<float>& values, ValueType type, uint32_t unit_base) {
  if (type == ValueType::kFp32) {
    dense_allreduce(op, values.data(), static_cast<int64_t>(values.size()), DType::kFloat32, ReduceOp::kSum,
                    unit_base);
    return;
  }
  std::vector<uint16_t> narrow(values.size());
  for (size_t j = 0; j < values.size(); ++j) narrow[j] = sparse_narrow(values[j], type);
  dense_allreduce(op, narrow.data(), static_cast<int64_t>(narrow.size()),
                  type == ValueType::kFp16 ? DType::kFloat16 : DType::kBFloat16, ReduceOp::kSum, unit_base);
  for (size_t j = 0; j < values.size(); ++j) values[j] = sparse_widen(narrow[j], type);
}

}  // namespace gradcomm::detail
