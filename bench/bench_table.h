// The table rank 0 prints, and the JSON records of --json.
//
// The table is nccl-tests' (src/util.cu there): its preamble comment lines, the same
// header lines and columns (size, count, type, redop, root, then time, algbw, busbw and
// #wrong out of place and in place), the same closing lines ("# Out of bounds values",
// "# Avg bus bandwidth", "#", "# Collective test concluded"), so its parsers read it.
// gradcomm's allreduce runs in place and its allgather out of place: the other
// placement's four cells read N/A. gradcomm's own columns (wire bytes, compression
// ratio, the phase split, the baseline's numbers) come after nccl-tests' ones; every
// column name is one word, so a parser can find any column by its name in the header.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "baselines/baseline.h"

namespace gradcomm::bench {

// Where gradcomm's time went, per iteration, averaged over ranks (from Stats deltas).
struct Phases {
  double reduce_us = 0, encode_us = 0, decode_us = 0, comm_us = 0;
};

// One implementation's numbers at one size.
struct ImplResult {
  std::string impl;                       // "gradcomm", "mpi", "gloo"
  double time_us = 0;                     // max over ranks of the per-rank mean
  std::optional<double> wire_bytes;       // per rank per iteration; only gradcomm counts them
  std::optional<int64_t> wrong;           // summed over ranks; nullopt without --check
  std::optional<Phases> phases;           // gradcomm only
  // gradcomm only: "shm" when every rank's calls ran on the node's shared segment
  // (docs/shared-memory.md), else "transport".
  std::optional<std::string> path;
};

struct Row {
  int64_t size_bytes = 0;  // allreduce: the tensor; allgather: the gathered output (nccl-tests)
  int64_t count = 0;       // elements in size_bytes
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;  // allreduce's; allgather prints "none"
  ImplResult gradcomm;
  std::optional<ImplResult> baseline;
};

struct TableConfig {
  BenchOp op = BenchOp::kAllreduce;
  std::string compressor;
  std::string types;        // as -d named them, for the preamble
  std::string device;       // "cpu" | "cuda"
  int ranks = 1;
  int warmup = 0, iters = 0;
  int64_t min_bytes = 0, max_bytes = 0, factor = 2, step_bytes = 0;
  int check_iters = 0;      // -c
  std::string rank_time = "max";  // -a: how the ranks' times make the row's
  std::string input = "gradient";  // what the timed calls reduce (--input)
  std::string baseline;     // "" = none
  std::string baseline_description;
  bool phases = false;      // print the phase columns
};

class BenchTable {
 public:
  BenchTable(TableConfig config, std::FILE* out) : config_(std::move(config)), out_(out) {}

  void print_header();
  void print_row(const Row& row);  // flushes, so a long run shows progress
  void print_footer();
  const nlohmann::ordered_json& records() const { return records_; }
  // Cells (an implementation at a size) whose check found a wrong element.
  int failed_checks() const { return failed_checks_; }

  // nccl-tests' definitions.
  static double algbw_gbps(int64_t size_bytes, double time_us);
  double busbw_factor() const;
  // What a dense ring puts on the wire per rank: the numerator of the compression ratio.
  double dense_wire_bytes(int64_t size_bytes) const;

 private:
  void add_record(const Row& row, const ImplResult& r);

  TableConfig config_;
  std::FILE* out_;
  nlohmann::ordered_json records_ = nlohmann::ordered_json::array();
  bool in_place() const { return config_.op == BenchOp::kAllreduce; }

  double busbw_sum_ = 0, baseline_busbw_sum_ = 0;
  int rows_ = 0;
  int failed_checks_ = 0;
};

}  // namespace gradcomm::bench
