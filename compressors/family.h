// A compressor family, described in one place: its name and wire id, its spec keys
// (parsed into its own parameter block and printed back by the family itself), whether
// a key keeps state between steps, the collective shape the compressed allreduce runs for
// it, and what that shape asks of it: a codec (dense/), a selection (sparse/), a rank
// (lowrank/). The registry (registry.cc) parses specs through these descriptors; the CPU
// and GPU paths dispatch on `collective` and call the family through these hooks, never
// on its id or its keys. families.cc registers the built-in families, one line each;
// docs/adding-a-compressor.md walks through a new one.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compressors/compressor_id.h"
#include "compressors/family_params.h"

namespace gradcomm::detail {

struct CompressorSpec;  // spec.h

class DenseCodec;
struct GpuDenseKernels;  // compressors/dense/gpu_dense_launch.h (CUDA builds)
struct SparseOps;        // compressors/sparse/sparse.h
struct GpuSparseOps;     // compressors/sparse/gpu_sparse.h (CUDA builds)
struct LowRankShape;     // compressors/lowrank/lowrank.h

// The collective shape the compressed allreduce (src/compressed_allreduce.h, on host and
// device primitives) runs for a family: what it exchanges, and which of the family's
// hooks it calls. A new family picks one and provides those hooks; nothing there changes.
enum class Collective : uint8_t {
  kDense,             // nothing to compress: the dense ring (none)
  kCodecRing,         // a DenseCodec's fixed-size payloads over the compressed ring (make_codec)
  kSparseSelection,   // each rank's own selection, exchanged as sparse payloads (sparse->select; top-k)
  kSharedIndices,     // indices every rank draws alike; a dense allreduce of their values
                      // (sparse->draw; random-k)
  kTableThenValues,   // a summed table picks shared indices; then as kSharedIndices
                      // (sparse->table, accumulate, recover; the count sketch)
  kLowRank,           // P and Q factors over two dense rings (low_rank; powersgd)
};

// Whether reduce_scatter compresses with such a family itself (on host memory): the
// compressed ring's codecs (a payload per hop) and top-k (each segment's owner gets the
// ranks' selected entries there). The others are for allreduce only.
constexpr bool reduce_scatter_compresses(Collective c) {
  return c == Collective::kCodecRing || c == Collective::kSparseSelection;
}

// A family's view of its spec's key=value pairs, already checked against its key list
// and for duplicates. Every failure throws InvalidArgument naming the spec, the family,
// the key and what is accepted.
class SpecReader {
 public:
  struct Pair {
    std::string_view key, value;
  };
  SpecReader(std::string_view spec, std::string_view name, std::vector<Pair> pairs)
      : spec_(spec), name_(name), pairs_(std::move(pairs)) {}

  std::string_view name() const { return name_; }
  // The value of `key` if it was given.
  std::optional<std::string_view> take(std::string_view key) const;
  // A decimal integer in [lo, hi]; `fallback` when the key is absent.
  int64_t integer(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const;
  int64_t parse_integer(std::string_view key, std::string_view value, int64_t lo, int64_t hi) const;
  // A finite number in (0, 1] ("0.01", "1e-3").
  double parse_ratio(std::string_view key, std::string_view value) const;
  // A finite number in [lo, hi].
  double parse_number(std::string_view key, std::string_view value, double lo, double hi) const;
  // Exactly one of ratio=R, k=K: fills `ratio` or `k` (topk, sketch).
  void ratio_or_k(double& ratio, int64_t& k) const;
  // One of the listed words; `fallback` when the key is absent.
  template <class T>
  T choice(std::string_view key, std::initializer_list<std::pair<std::string_view, T>> options, T fallback) const {
    const auto value = take(key);
    if (!value) return fallback;
    std::string accepted;
    for (const auto& [word, result] : options) {
      if (word == *value) return result;
      accepted += accepted.empty() ? "" : ", ";
      accepted += word;
    }
    unknown_choice(key, *value, accepted);
  }
  [[noreturn]] void fail(std::string_view problem) const;

 private:
  [[noreturn]] void unknown_choice(std::string_view key, std::string_view value, const std::string& accepted) const;

  std::string_view spec_;
  std::string_view name_;
  std::vector<Pair> pairs_;
};

struct Family {
  CompressorId id;   // the byte payload headers carry: unique, never reused
  const char* name;  // the spec's name ("topk")
  // Keys in canonical order: the family's own first, then any of the common keys it
  // takes (ef, min_numel, warmup, seed, values; inside for codec-ring families). Empty: the
  // family takes no keys.
  std::span<const std::string_view> keys;
  bool ef_default;           // error feedback unless ef=0 in the spec (docs/api.md, "Compression")
  ValueType values_default;  // sparse values on the wire, for families with a `values` key
  Collective collective;
  // Reads the family's own keys into its parameter block (CompressorSpec::params);
  // `common` holds the common keys, read already (for checks that involve them, e.g. ef;
  // a family may set one under another name: powersgd's start_iter is warmup).
  std::shared_ptr<const FamilyParams> (*parse)(const SpecReader& reader, CompressorSpec& common) = nullptr;
  // The family's own keys as "key=value," each, in `keys` order, for canonical().
  std::string (*canonical)(const CompressorSpec& spec) = nullptr;
  // True when a key must keep state between steps beyond error feedback and warm-up
  // (draws that change every step, a factor carried over). Null: never.
  bool (*keeps_state)(const CompressorSpec& spec) = nullptr;
  // kCodecRing: the CPU codec, after checking what the payload header can carry.
  std::unique_ptr<DenseCodec> (*make_codec)(const CompressorSpec& spec) = nullptr;
  // kCodecRing: the family's GPU codec (layout and launchers) for GpuDenseCodec
  // (compressors/dense/gpu_dense_codec.h). Null: none, or a build without CUDA;
  // the NCCL path then refuses the family by name.
  const GpuDenseKernels* gpu_dense = nullptr;
  // One call over many small tensors means the same as one call each. Null: always.
  bool (*fusable)(const CompressorSpec& spec) = nullptr;
  // The family views a tensor as matrices by its parts' shapes (CompressOptions::parts),
  // so ranks must agree on the shapes (their digest travels in the call header) and a
  // key's shapes must not change. False: only the element count matters.
  bool reads_shapes = false;
  // kSparseSelection, kSharedIndices, kTableThenValues: the family's selection on host
  // memory (sparse/sparse.h), and on a GPU (sparse/gpu_sparse.h; null: none, or a build
  // without CUDA, and the NCCL path refuses the family by name).
  const SparseOps* sparse = nullptr;
  const GpuSparseOps* gpu_sparse = nullptr;
  // kLowRank: the rank and carry-over a spec asks for (lowrank/lowrank.h).
  LowRankShape (*low_rank)(const CompressorSpec& spec) = nullptr;

  bool takes(std::string_view key) const {
    for (const auto& k : keys) {
      if (k == key) return true;
    }
    return false;
  }
};

// "ratio=R" or "k=K", whichever is set (k > 0) (topk's and sketch's canonical forms).
std::string ratio_or_k_text(double ratio, int64_t k);
// The spec's family's sparse calls; InvalidArgument naming the family when it has none.
const SparseOps& sparse_ops(const CompressorSpec& spec);

// The family of a registered id; InvalidArgument for an id no family has.
const Family& family_of(CompressorId id);

// Whether the host path compresses float16/bfloat16 tensors itself, in float32 pieces
// with no float32 copy of the tensor (src/compression_16bit.cc): the families whose wire
// format does not depend on the tensor's type, the compressed ring's codecs and top-k,
// unless inside=compress. The others (and GPU tensors) take float32 only.
bool compresses_16bit(const CompressorSpec& spec);
// Whether a call with `spec` at a key's `step` over `numel` elements runs the dense
// allreduce this time: nothing to compress, a warm-up step, or a tensor below min_numel
// (the compressed allreduce, src/compressed_allreduce.h; fusion and plan_allreduce ask the same).
bool runs_dense(const CompressorSpec& spec, uint64_t step, int64_t numel);
// Every registered family, in id order.
std::vector<const Family*> registered_families();
// The names of the registered families that run `collective`, in id order, joined by
// ", " (for messages that list what is accepted).
std::string family_names(Collective collective);
// Adds a family (built-ins in families.cc; a test or an extension at start-up, before
// any communicator parses a spec naming it). InvalidArgument when its id or name is
// taken or it is incomplete for its collective.
void register_family(const Family& family);

}  // namespace gradcomm::detail
