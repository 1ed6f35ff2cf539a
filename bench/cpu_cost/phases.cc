// The phases gradcomm-cpu-cost measures, compressor by compressor. Each calls the
// function the host collectives call (src/compression.cc, src/collectives/
// compressed_ring.cc, src/collectives/sparse_allreduce.cc,
// src/collectives/powersgd_allreduce.cc), never a copy of it; where the collective's
// step is a private loop, the phase says so in its note and calls the nearest public
// unit instead.
//
// Traffic formulas (bytes read + written; n elements, k selected, P payload bytes,
// fp32 = 4 B, a selection = u64 index + f32 value = 12 B per entry) are written next
// to each phase and printed with it. They count each byte once, as a floor: scattered
// single-float writes (keep_rounding) really move a 64 B line each.
#include "cpu_cost/phases.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>

#include "compressors/codec.h"
#include "compressors/lowrank/powersgd.h"
#include "compressors/powersgd/powersgd.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sketch/sketch.h"
#include "compressors/spec.h"
#include "compressors/sparse/sparse.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/topk/topk.h"
#include "gradcomm/types.h"
#include "reduce.h"

namespace gradcomm::bench {
namespace {

using detail::CompressorId;
using detail::CompressorSpec;
using detail::PhiloxStream;
using detail::SparseFormat;
using detail::SparseVector;

constexpr uint64_t kStream = 7;  // any fixed Philox stream: the draws' values do not change the cost

std::vector<float> copy_of(const float* x, int64_t n) { return std::vector<float>(x, x + n); }

// P as a formula in n, from the codec's own encoded_bytes (header 24 B).
std::string payload_formula(double p, int64_t n) {
  return fmt::format("P = {:.4g}n + 24", (p - 24.0) / static_cast<double>(n));
}

// ---- none: the dense ring's reduce ---------------------------------------------
// ring_allreduce.cc's recvReduceSend on one segment: out += in (base/reduce.h).
std::vector<Phase> none_phases(const Inputs& in) {
  const int64_t n = in.n;
  auto out = std::make_shared<std::vector<float>>(copy_of(in.other, n));
  return {{"none", "reduce", "12n (read out, in; write out)", 12.0 * n, "reduce_inplace(out, in, fp32, sum)", nullptr,
           [out, g = in.grad, n] {
             detail::reduce_inplace(out->data(), g, n, DType::kFloat32, ReduceOp::kSum);
           }}};
}

// ---- dense codecs: the compressed ring's calls ---------------------------------
// compressed_ring.cc: encode per sent chunk, decode_add per reduce-scatter receive,
// decode per allgather receive (and, with error feedback, once more per encode into
// scratch, followed by accumulate_loss: the "ef (codec ring)" group).
std::vector<Phase> dense_phases(const std::string& label, const Inputs& in) {
  const int64_t n = in.n;
  struct State {
    std::unique_ptr<detail::DenseCodec> codec;
    std::vector<uint8_t> payload;
    std::vector<float> out;
    PhiloxStream rng;
  };
  auto s = std::make_shared<State>();
  const CompressorSpec spec = detail::parse_compressor_spec(label);
  s->codec = detail::make_dense_codec(spec);
  s->payload.assign(s->codec->encoded_bytes(n), 0);
  s->out = copy_of(in.other, n);
  s->rng = PhiloxStream{spec.seed, kStream};
  // The decode phases need a valid payload; the encode phase rewrites the same bytes.
  s->codec->encode(in.grad, n, s->payload.data(), s->rng, 0);
  const double p = static_cast<double>(s->payload.size());
  const std::string pf = payload_formula(p, n);
  const float* g = in.grad;
  return {
      {label, "encode", "4n + P, " + pf, 4.0 * n + p, "DenseCodec::encode", nullptr,
       [s, g, n] { s->codec->encode(g, n, s->payload.data(), s->rng, 0); }},
      {label, "decode", "P + 4n", p + 4.0 * n, "DenseCodec::decode", nullptr,
       [s, n] { s->codec->decode(s->payload, n, s->out.data()); }},
      {label, "decode_add", "P + 8n (out read and written)", p + 8.0 * n, "DenseCodec::decode_add", nullptr,
       [s, n] { s->codec->decode_add(s->payload, n, s->out.data()); }},
      {label, "decode_avg2", "P + 4n", p + 4.0 * n,
       "DenseCodec::decode_average, divisor 2 (N = 2): the ring's final decodes, the divide in the stores", nullptr,
       [s, n] { s->codec->decode_average(s->payload, n, s->out.data(), 2); }},
  };
}

// ---- error feedback in the codec ring -----------------------------------------
// Codec-independent: the fold before the ring (HostPrimitives::fold_and_clear) and
// the loss after each encode (compressed_ring.cc: decode into scratch, which costs
// the codec's "decode", then accumulate_loss).
std::vector<Phase> ef_ring_phases(const Inputs& in) {
  const int64_t n = in.n;
  struct State {
    std::vector<float> data, residual;
  };
  auto s = std::make_shared<State>(State{copy_of(in.grad, n), copy_of(in.other, n)});
  const float* other = in.other;
  const float* g = in.grad;
  return {
      {"ef (codec ring)", "fold_and_clear", "16n (data += residual: 12n; residual = 0: 4n)", 16.0 * n,
       "HostPrimitives::fold_and_clear is private (src/compression.cc); its body is called: "
       "reduce_inplace + std::fill",
       [s, other, n] { std::copy_n(other, n, s->residual.data()); },
       [s, n] {
         detail::reduce_inplace(s->data.data(), s->residual.data(), n, DType::kFloat32, ReduceOp::kSum);
         std::fill(s->residual.begin(), s->residual.end(), 0.0f);
       }},
      {"ef (codec ring)", "accumulate_loss", "16n (read residual, value, kept; write residual)", 16.0 * n,
       "accumulate_loss(residual, value, decoded)", nullptr,
       [s, g, other, n] { detail::accumulate_loss(s->residual.data(), g, other, n); }},
  };
}

// ---- top-k: select, then sparse_allgather_allreduce -----------------------
// Per step on the host (compressed_allreduce.h, compression.cc, sparse_allreduce.cc):
// select (topk's SparseOps::select) = topk_select_fold (the fold acc = grad + residual, and grad's zeroing,
// are fused into its collect pass) + keep_rounding (the residual at the k sent
// indices); then encode_sparse, the allgather, and decode_sum_sparse of the N payloads
// onto the zeroed gradient (kZeroed, the average's divisor). select_acc and the
// fill-path decodes are the same steps without the zeroing (the path before it).
std::vector<Phase> topk_phases(const std::string& label, const Inputs& in) {
  const int64_t n = in.n;
  const CompressorSpec spec = detail::parse_compressor_spec(label);
  const auto& topk = spec.family<detail::TopkParams>();
  const int64_t k = detail::selection_count(topk.ratio, topk.k, n);
  const SparseFormat raw{spec.values, false}, coded{spec.values, true};
  struct State {
    std::vector<float> residual, out, grad;
    SparseVector sel, sel_plain, sel2;
    std::vector<uint8_t> raw, coded, raw2, coded2, into;
    PhiloxStream rng;
  };
  auto s = std::make_shared<State>();
  s->rng = PhiloxStream{spec.seed, kStream};
  s->residual = copy_of(in.other, n);
  s->out.assign(static_cast<size_t>(n), 0.0f);
  // This rank's selection (with error feedback) and a second rank's, whose payloads
  // the decode phase sums with ours.
  s->sel = detail::topk_select_accumulate(in.grad, s->residual.data(), n, k, topk.select, s->rng);
  s->sel2 = detail::topk_select(in.other, n, k, topk.select, s->rng);
  s->raw = detail::encode_sparse(CompressorId::kTopk, n, s->sel, raw);
  s->coded = detail::encode_sparse(CompressorId::kTopk, n, s->sel, coded);
  s->raw2 = detail::encode_sparse(CompressorId::kTopk, n, s->sel2, raw);
  s->coded2 = detail::encode_sparse(CompressorId::kTopk, n, s->sel2, coded);
  s->into.assign(s->coded.size(), 0);
  const double kk = static_cast<double>(s->sel.indices.size());  // sample: variable k
  const double p_raw = static_cast<double>(s->raw.size()), p_coded = static_cast<double>(s->coded.size());
  const double p_raw2 = static_cast<double>(s->raw2.size()), p_coded2 = static_cast<double>(s->coded2.size());
  const std::string pk = fmt::format("k = {:.0f}", kk);
  const float* g = in.grad;
  const float* other = in.other;
  auto restore_residual = [s, other, n] { std::copy_n(other, n, s->residual.data()); };
  auto restore_both = [s, g, other, n] {
    std::copy_n(other, n, s->residual.data());
    s->grad.assign(g, g + n);
  };
  const detail::TopkSelect select = topk.select;
  const detail::ValueType values = spec.values;
  auto decode_sum = [s, n](bool use_coded, int64_t divisor = 1,
                           detail::SparseOutput output = detail::SparseOutput::kFill) {
    const std::span<const uint8_t> p[2] = {use_coded ? s->coded : s->raw, use_coded ? s->coded2 : s->raw2};
    detail::decode_sum_sparse(CompressorId::kTopk, p, n, s->out.data(), divisor, output);
  };
  auto zero_out = [s] { std::fill(s->out.begin(), s->out.end(), 0.0f); };
  return {
      {label, "fold", "12n", 12.0 * n,
       "reduce_inplace(residual, grad): the fold alone (topk_select.cc's add_into); with EF the "
       "step fuses it into select_acc, so this is a reference, not an extra step",
       restore_residual,
       [s, g, n] { detail::reduce_inplace(s->residual.data(), g, n, DType::kFloat32, ReduceOp::kSum); }},
      {label, "select_acc", "12n + 12k (acc into residual; selection out), " + pk, 12.0 * n + 12.0 * kk,
       "topk_select_accumulate(grad, residual): select (topk's SparseOps::select) with EF; allocates the SparseVector "
       "and its collect lists per call",
       restore_residual,
       [s, g, n, k, select] { s->sel = detail::topk_select_accumulate(g, s->residual.data(), n, k, select, s->rng); }},
      {label, "select_fold", "16n + 12k (acc into residual; grad zeroed; selection out), " + pk, 16.0 * n + 12.0 * kk,
       "topk_select_fold(grad, residual): select (topk's SparseOps::select) with EF as the host engine runs it (grad zeroed "
       "in the same pass); allocates the SparseVector and its collect lists per call",
       restore_both,
       [s, n, k, select] { s->sel = detail::topk_select_fold(s->grad.data(), s->residual.data(), n, k, select, s->rng); }},
      {label, "select", "4n + 12k", 4.0 * n + 12.0 * kk, "topk_select(grad): select without EF; allocates",
       nullptr, [s, g, n, k, select] { s->sel_plain = detail::topk_select(g, n, k, select, s->rng); }},
      {label, "keep_rounding", "16k (read index, value; write residual[index]), scattered", 16.0 * kk,
       "keep_sparse_rounding (HostPrimitives::keep_rounding's step)", nullptr,
       [s, values] { detail::keep_sparse_rounding(s->residual.data(), s->sel.indices, s->sel.values.data(), values); }},
      {label, "encode_raw", "12k + P", 12.0 * kk + p_raw,
       fmt::format("encode_sparse, u32 indices, P = {:.0f} B; validates, allocates the payload", p_raw), nullptr,
       [s, n, raw] { s->raw = detail::encode_sparse(CompressorId::kTopk, n, s->sel, raw); }},
      {label, "encode_coded", "12k + P", 12.0 * kk + p_coded,
       fmt::format("encode_sparse, Elias-Fano indices, P = {:.0f} B; validates, allocates", p_coded), nullptr,
       [s, n, coded] { s->coded = detail::encode_sparse(CompressorId::kTopk, n, s->sel, coded); }},
      {label, "encode_into_coded", "12k + P", 12.0 * kk + p_coded,
       "encode_sparse_into (the reduce-scatter's per-region call), coded, preallocated", nullptr,
       [s, n, coded] { detail::encode_sparse_into(CompressorId::kTopk, n, s->sel, coded, s->into.data()); }},
      {label, "decode_sum2_raw", "P1 + P2 + 4n", p_raw + p_raw2 + 4.0 * n,
       "decode_sum_sparse of 2 raw payloads (N = 2, sum)", nullptr, [decode_sum] { decode_sum(false); }},
      {label, "decode_sum2_coded", "P1 + P2 + 4n", p_coded + p_coded2 + 4.0 * n,
       "decode_sum_sparse of 2 coded payloads (N = 2, sum)", nullptr, [decode_sum] { decode_sum(true); }},
      {label, "decode_avg2_coded", "P1 + P2 + 4n", p_coded + p_coded2 + 4.0 * n,
       "decode_sum_sparse of 2 coded payloads, average (N = 2): the fill path", nullptr,
       [decode_sum] { decode_sum(true, 2); }},
      {label, "decode_avg2_zeroed", "P1 + P2 + 16k (the entries' lines, read and written; at least)",
       p_coded + p_coded2 + 16.0 * kk,
       "decode_sum_sparse of 2 coded payloads, average (N = 2), onto the zeroed gradient (kZeroed): "
       "the host engine's path with error feedback",
       zero_out, [decode_sum] { decode_sum(true, 2, detail::SparseOutput::kZeroed); }},
  };
}

// ---- random-k: the shared indices ----------------------------------------------
std::vector<Phase> randomk_phases(const std::string& label, const Inputs& in) {
  const int64_t n = in.n;
  const CompressorSpec spec = detail::parse_compressor_spec(label);
  const int64_t k = detail::selection_count(spec.family<detail::RandomkParams>().ratio, 0, n);
  auto idx = std::make_shared<std::vector<uint64_t>>();
  const PhiloxStream rng{spec.seed, kStream};
  return {{label, "indices", "8k (u64 indices out)", 8.0 * k, "randomk_indices (draw); allocates", nullptr,
           [idx, n, k, rng] { *idx = detail::randomk_indices(n, k, rng); }}};
}

// ---- sketch: accumulate, then recover ------------------------------------------
// compressed_allreduce.h's kTableThenValues: table_accumulate (after the fold,
// measured under topk's "fold") and table_recover = estimate + exact top-k.
std::vector<Phase> sketch_phases(const std::string& label, const Inputs& in) {
  const int64_t n = in.n;
  const CompressorSpec spec = detail::parse_compressor_spec(label);
  const auto& sketch = spec.family<detail::SketchParams>();
  const int64_t k = detail::selection_count(sketch.ratio, sketch.k, n);
  const int cols = detail::sketch_columns(sketch, k);
  struct State {
    detail::CountSketch sketch;
    std::vector<float> table, estimate;
    SparseVector sel;
  };
  const PhiloxStream rng{spec.seed, kStream};
  auto s = std::make_shared<State>(State{detail::CountSketch(sketch.rows, cols, rng), {}, {}, {}});
  const double cells = static_cast<double>(sketch.rows) * cols;
  s->table.assign(static_cast<size_t>(cells), 0.0f);
  s->estimate.assign(static_cast<size_t>(n), 0.0f);
  s->sketch.accumulate(in.grad, n, s->table.data());  // a real table for the estimate phase
  const auto table_copy = std::make_shared<std::vector<float>>(s->table);
  const std::string shape = fmt::format("table {} x {}", sketch.rows, cols);
  const float* g = in.grad;
  return {
      {label, "accumulate", "4n + 8 rows cols (" + shape + ")", 4.0 * n + 8.0 * cells,
       "CountSketch::accumulate into a zeroed table", [s] { std::fill(s->table.begin(), s->table.end(), 0.0f); },
       [s, g, n] { s->sketch.accumulate(g, n, s->table.data()); }},
      {label, "estimate", "4 rows cols + 4n", 4.0 * cells + 4.0 * n,
       "CountSketch::estimate (the sketch's recover also allocates this 4n estimate per call: not timed)",
       [s, table_copy] { std::copy(table_copy->begin(), table_copy->end(), s->table.begin()); },
       [s, n] { s->sketch.estimate(s->table.data(), n, s->estimate.data()); }},
      {label, "select", "4n + 12k", 4.0 * n + 12.0 * k, "topk_select(estimate, exact), as the sketch's recover", nullptr,
       [s, n, k, rng] { s->sel = detail::topk_select(s->estimate.data(), n, k, detail::TopkSelect::kExact, rng); }},
  };
}

// ---- PowerSGD: one matrix's step ----------------------------------------------
// powersgd_allreduce.cc, per matrix: P = M Q; (allreduce P); orthonormalize P;
// Q = M^T P; (allreduce Q); reconstruct M (and the residual). n is viewed as the
// squarest rows x cols it factors into.
std::vector<Phase> powersgd_phases(const std::string& label, const Inputs& in) {
  const int64_t n = in.n;
  const CompressorSpec spec = detail::parse_compressor_spec(label);
  int64_t rows = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
  while (rows > 1 && n % rows != 0) --rows;
  const int64_t cols = n / rows;
  const int r = spec.family<detail::PowersgdParams>().rank;
  struct State {
    std::vector<float> m, p, q, residual;
  };
  auto s = std::make_shared<State>(State{copy_of(in.grad, n), std::vector<float>(static_cast<size_t>(rows * r)),
                                         std::vector<float>(static_cast<size_t>(cols * r)),
                                         std::vector<float>(static_cast<size_t>(n))});
  detail::powersgd::draw_initial_q(s->q.data(), cols * r, PhiloxStream{spec.seed, kStream});
  detail::powersgd::orthonormalize(s->q.data(), cols, r);
  detail::powersgd::multiply(s->m.data(), rows, cols, s->q.data(), r, s->p.data());
  const std::string shape = fmt::format("{} x {}, rank {}", rows, cols, r);
  const double pq = 4.0 * r * static_cast<double>(rows + cols);
  const float* g = in.grad;
  return {
      {label, "multiply", "4n + 4r(rows + cols) (" + shape + ")", 4.0 * n + pq,
       "powersgd::multiply: P = M Q (OpenBLAS)", nullptr,
       [s, rows, cols, r] { detail::powersgd::multiply(s->m.data(), rows, cols, s->q.data(), r, s->p.data()); }},
      {label, "orthonormalize", "8 r rows", 8.0 * r * rows, "powersgd::orthonormalize(P)", nullptr,
       [s, rows, r] { detail::powersgd::orthonormalize(s->p.data(), rows, r); }},
      {label, "multiply_t", "4n + 4r(rows + cols)", 4.0 * n + pq, "powersgd::multiply_transposed: Q = M^T P (OpenBLAS)",
       nullptr,
       [s, rows, cols, r] {
         detail::powersgd::multiply_transposed(s->m.data(), rows, cols, s->p.data(), r, s->q.data());
       }},
      {label, "reconstruct", "12n + 4r(rows + cols) (acc read, written; residual written)", 12.0 * n + pq,
       "powersgd::reconstruct, N = 2, average, with residual", [s, g, n] { std::copy_n(g, n, s->m.data()); },
       [s, rows, cols, r] {
         detail::powersgd::reconstruct(s->p.data(), s->q.data(), rows, cols, r, 2, true, s->m.data(),
                                       s->residual.data());
       }},
  };
}

}  // namespace

std::vector<Group> all_groups() {
  std::vector<Group> g;
  g.push_back({"none", none_phases});
  std::vector<std::string> dense = {"fp16", "bf16"};
  for (int bits : {1, 2, 4, 8}) dense.push_back(fmt::format("quant:bits={},round=stochastic", bits));
  dense.push_back("quant:bits=4,round=nearest");
  dense.push_back("qsgd:levels=16");
  dense.push_back("sign");
  for (const std::string& d : dense) g.push_back({d, [d](const Inputs& in) { return dense_phases(d, in); }});
  g.push_back({"ef (codec ring)", ef_ring_phases});
  for (const char* t : {"topk:ratio=0.01,select=exact", "topk:ratio=0.01,select=sample"}) {
    g.push_back({t, [t](const Inputs& in) { return topk_phases(t, in); }});
  }
  g.push_back({"randomk:ratio=0.01", [](const Inputs& in) { return randomk_phases("randomk:ratio=0.01", in); }});
  g.push_back({"sketch:ratio=0.01", [](const Inputs& in) { return sketch_phases("sketch:ratio=0.01", in); }});
  g.push_back({"powersgd:rank=4", [](const Inputs& in) { return powersgd_phases("powersgd:rank=4", in); }});
  return g;
}

std::vector<std::string> not_measured() {
  return {
      "randomk gather (values[j] = acc[idx[j]]) and scatter (data = 0; data[idx[j]] = sum[j]): loops inside "
      "HostPrimitives::gather_sum_scatter, private to src/compression.cc (no public unit)",
      "table_cells' zeroing and the sketch's recover's 4n estimate allocation: HostPrimitives, private "
      "(src/compression.cc)",
      "top-k reduce-scatter's owner work (merge_sum, top_magnitudes): anonymous namespace in "
      "src/collectives/sparse_allreduce.cc; its encode_sparse_into and decode_sum_sparse are measured",
      "codec_round_trip (one rank only): HostPrimitives, private; its parts are encode + decode + the EF loop",
  };
}

}  // namespace gradcomm::bench
