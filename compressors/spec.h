// Compressor specs: `name[:key=value[,key=value...]]`, parsed once by the registry
// (registry.cc, through each family's descriptor, family.h) into a CompressorSpec
// with every parameter resolved. Two ranks agree on a compressor iff their
// canonical() strings are equal.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

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

enum class TopkSelect : uint8_t { kExact = 0, kSample = 1 };
enum class Rounding : uint8_t { kStochastic = 0, kNearest = 1 };
enum class ValueType : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2 };  // how sparse values travel
// How top-k's selections are combined (src/collectives/sparse_allreduce.cc, where
// choose_sparse_algo resolves kAuto): every rank's payload to every rank, or the index
// space split among the ranks.
enum class SparseAlgo : uint8_t { kAuto = 0, kAllgather = 1, kReduceScatter = 2 };

struct CompressorSpec {
  CompressorId id = CompressorId::kNone;

  // Common keys (every compressor but none):
  bool ef = false;            // error feedback; default per compressor (docs/api.md, "Compression")
  int64_t min_numel = 0;      // smaller tensors go dense
  int64_t warmup = 0;         // the first `warmup` steps of a key go dense
  uint64_t seed = 0;          // Philox seed (stochastic rounding, random-k, sketch hashes)
  ValueType values = ValueType::kFp32;  // sparse values on the wire (topk: bf16; randomk, sketch: fp32)
  // Codec-ring families over two levels (src/hierarchy.h): compress inside the nodes too
  // (inside=compress), not only across them (inside=dense, the default).
  bool compress_inside = false;

  // topk: exactly one of ratio / k is set (k = 0 means "use ratio").
  double ratio = 0.0;         // topk, randomk, sketch: fraction of elements, (0, 1]
  int64_t k = 0;              // topk: absolute count; sketch: heavy hitters to recover
  TopkSelect select = TopkSelect::kExact;
  bool coded_indices = true;  // topk: Elias–Fano coded indices (indices=coded), else raw u32/u64
  SparseAlgo algo = SparseAlgo::kAuto;  // topk

  int levels = 0;             // qsgd: quantization levels s >= 1
  int bits = 0;               // quant: 1, 2, 4 or 8
  Rounding round = Rounding::kStochastic;  // quant
  int64_t bucket = 0;         // qsgd, quant, sign: elements per bucket (scale/norm unit)

  int rows = 0, cols = 0;     // sketch table

  // powersgd (compressors/powersgd/powersgd_logic.h): the approximation's rank, whether
  // Q carries over from step to step, and how much smaller than a matrix its P and Q
  // must be for it to be compressed (torch's min_compression_rate). torch's
  // start_powerSGD_iter is the common `warmup` (spelled `start_iter` in a spec).
  int rank = 0;
  bool warm_start = true;
  double min_compression_rate = 0.0;

  // The spec with every key spelled out in a fixed order, e.g.
  // "topk:ratio=0.01,select=exact,indices=coded,algo=auto,ef=1,min_numel=0,warmup=0,seed=0,values=bf16".
  std::string canonical() const;
};

// A dense codec's spec from its fields (fp16, bf16, quant, qsgd, sign), for code that
// builds one directly rather than parsing a spec string (tests, benchmarks); the
// registry's defaults (bucket 512, seed 0) are not applied.
inline CompressorSpec dense_codec_spec(CompressorId id, int bits = 0, Rounding round = Rounding::kStochastic,
                                       int levels = 0, int64_t bucket = 0) {
  CompressorSpec s;
  s.id = id;
  s.bits = bits;
  s.round = round;
  s.levels = levels;
  s.bucket = bucket;
  return s;
}

// Elements a sparsifier selects from `numel`: `k` when given, else round(ratio *
// numel), within [1, max(numel, 1)]. The CPU and GPU paths both use this: the
// counts decide the selections, so they must agree to the element.
inline int64_t selection_count(double ratio, int64_t k, int64_t numel) {
  const int64_t c = k > 0 ? k : static_cast<int64_t>(std::llround(ratio * static_cast<double>(numel)));
  return std::clamp<int64_t>(c, 1, std::max<int64_t>(numel, 1));
}

// Count-sketch width: spec.cols, or when the spec leaves it to us a few columns per
// heavy hitter (4k, within [16, 2^26]).
inline int sketch_columns(const CompressorSpec& spec, int64_t k) {
  return spec.cols > 0 ? spec.cols : static_cast<int>(std::clamp<int64_t>(4 * k, 16, int64_t{1} << 26));
}

// User text as error messages quote it: at most 100 characters, control and non-ASCII
// bytes escaped (\xNN), so a message stays one short line whatever the input.
std::string shown_spec_text(std::string_view text);

// Parses a spec string. InvalidArgument naming the problem and listing what is
// accepted: unknown compressor, unknown key, bad value, missing required key,
// key given twice.
CompressorSpec parse_compressor_spec(std::string_view spec);

}  // namespace gradcomm::detail
