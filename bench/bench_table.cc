#include "bench_table.h"

#include <fmt/format.h>

#include "bench_cli.h"
#include "gradcomm/version.h"

namespace gradcomm::bench {

namespace {

// nccl-tests' widths: the five leading columns, then per placement time (7), algbw and
// busbw (6) and #wrong (6), every column two spaces after the previous one.
constexpr int kSizeW = 12, kCountW = 12, kTypeW = 8, kRedopW = 6, kRootW = 6;
constexpr int kTimeW = 7, kBwW = 6, kWrongW = 6;
// gradcomm's columns after them.
constexpr int kWireW = 12, kComprW = 6, kPhaseW = 8, kBaseW = 11, kRatioW = 6;

// A value in `width` characters: two decimals if they fit, then one, then none, then
// an exponent (nccl-tests does the same, so wide values never shift the columns).
std::string fit(double v, int width) {
  for (const char* spec : {"{:>{}.2f}", "{:>{}.1f}", "{:>{}.0f}"}) {
    std::string s = fmt::format(fmt::runtime(spec), v, width);
    if (static_cast<int>(s.size()) <= width) return s;
  }
  return fmt::format(fmt::runtime(width >= 7 ? "{:>{}.1e}" : "{:>{}.0e}"), v, width);
}

// The four cells of the placement gradcomm runs.
std::string placement_cells(const ImplResult& r, int64_t size_bytes, double busbw_factor) {
  const double algbw = BenchTable::algbw_gbps(size_bytes, r.time_us);
  const std::string wrong = r.wrong ? fmt::format("{:g}", static_cast<double>(*r.wrong)) : "N/A";
  return fmt::format("  {}  {}  {}  {:>{}}", fit(r.time_us, kTimeW), fit(algbw, kBwW), fit(algbw * busbw_factor, kBwW),
                     wrong, kWrongW);
}

}  // namespace

double BenchTable::algbw_gbps(int64_t size_bytes, double time_us) {
  return time_us > 0 ? static_cast<double>(size_bytes) / (time_us * 1e3) : 0.0;  // bytes/ns = GB/s
}

double BenchTable::busbw_factor() const {
  const double n = config_.ranks;
  return config_.op == BenchOp::kAllreduce ? 2 * (n - 1) / n : (n - 1) / n;
}

double BenchTable::dense_wire_bytes(int64_t size_bytes) const {
  return static_cast<double>(size_bytes) * busbw_factor();
}

void BenchTable::print_header() {
  const auto& c = config_;
  // nccl-tests' preamble, with gradcomm's values.
  fmt::print(out_, "# gradcomm-bench version {} (gradcomm {})\n", GRADCOMM_VERSION_STRING, GRADCOMM_VERSION_STRING);
  fmt::print(out_, "# Collective test starting: gradcomm-bench {}\n", bench_op_name(c.op));
  fmt::print(out_,
             "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: 1 "
             "validation: {} graph: 0\n",
             c.min_bytes, c.max_bytes, c.factor > 1 ? c.factor : c.step_bytes, c.factor > 1 ? "factor" : "bytes",
             c.warmup, c.iters, c.check_iters);
  fmt::print(out_, "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier\n");
  fmt::print(out_, "#\n");
  // What gradcomm adds.
  // nccl-tests prints an out-of-place and an in-place group of columns. gradcomm's
  // allreduce works in place; allgather and reduce_scatter run out of place here (their
  // in-place forms are not measured), so the table has the one group that ran, named in
  // the line above the column names.
  fmt::print(out_, "# gradcomm: {} ranks on {}, types {}, compressor '{}', {}\n", c.ranks, c.device, c.types,
             c.compressor,
             in_place() ? "in place only (gradcomm has no out-of-place allreduce)"
                        : "out of place only (the in-place form is not measured)");
  if (!c.baseline.empty()) {
    fmt::print(out_, "# baseline {}: {}\n", c.baseline, c.baseline_description);
    fmt::print(out_,
               "# Per size: gradcomm's warm-up and timed calls, then the baseline's on the same buffers (interleaved\n"
               "# by size). ratio = baseline time / gradcomm time (> 1: gradcomm faster).\n");
  }
  fmt::print(out_,
             "# time = {} over ranks (-a) of each rank's mean over the timed calls; every call starts from the same\n"
             "# input ('{}'), restored and the ranks released by a barrier outside the timing.\n"
             "# algbw = size/time; busbw = algbw * {}. Columns after nccl-tests' ones:\n"
             "# wire = bytes_sent per rank per iteration (Communicator::stats(), mean over ranks); compr = dense ring\n"
             "# bytes / wire ('shm': the node's shared segment carried the data, wire holds only the calls'\n"
             "# headers; 'shm-d': the ranks read each other's alloc_shared buffers in place); #wrong = elements\n"
             "# off the exact result, all ranks (-c, untimed).{}\n",
             c.rank_time, c.input, c.op == BenchOp::kAllreduce ? "2(N-1)/N" : "(N-1)/N",
             c.phases ? "\n# reduce/encode/decode/comm: gradcomm's time per iteration from stats(), mean over ranks "
                        "(comm = waiting on the wire)."
                      : "");

  // nccl-tests' three header lines, gradcomm's columns appended.
  std::string names = fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "size", "count", "type", "redop", "root");
  std::string units = fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "(B)", "(elements)", "", "", "");
  names += fmt::format("  {:>{}}  {:>{}}  {:>{}}  {:>{}}", "time", kTimeW, "algbw", kBwW, "busbw", kBwW, "#wrong",
                       kWrongW);
  units += fmt::format("  {:>{}}  {:>{}}  {:>{}}  {:>{}}", "(us)", kTimeW, "(GB/s)", kBwW, "(GB/s)", kBwW, "", kWrongW);
  names += fmt::format("  {:>{}}  {:>{}}", "wire", kWireW, "compr", kComprW);
  units += fmt::format("  {:>{}}  {:>{}}", "(B)", kWireW, "", kComprW);
  if (c.phases) {
    for (const char* phase : {"reduce", "encode", "decode", "comm"}) {
      names += fmt::format("  {:>{}}", phase, kPhaseW);
      units += fmt::format("  {:>{}}", "(us)", kPhaseW);
    }
  }
  if (!c.baseline.empty()) {
    for (const char* col : {"time", "algbw", "busbw", "#wrong"}) {
      names += fmt::format("  {:>{}}", c.baseline + "_" + col, kBaseW);
    }
    units += fmt::format("  {:>{}}  {:>{}}  {:>{}}  {:>{}}", "(us)", kBaseW, "(GB/s)", kBaseW, "(GB/s)", kBaseW, "",
                         kBaseW);
    names += fmt::format("  {:>{}}", "ratio", kRatioW);
    units += fmt::format("  {:>{}}", "", kRatioW);
  }
  fmt::print(out_, "#\n");
  fmt::print(out_, "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           {}\n", "", "", "", "", "",
             in_place() ? "in-place" : "out-of-place");
  fmt::print(out_, "{}\n{}\n", names, units);
  std::fflush(out_);
}

void BenchTable::print_row(const Row& row) {
  const bool reduces = config_.op != BenchOp::kAllgather;
  std::string line = fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}", row.size_bytes, kSizeW, row.count, kCountW,
                                 nccl_type_name(row.dtype), kTypeW, reduces ? reduce_op_name(row.redop) : "none",
                                 kRedopW, -1, kRootW);
  line += placement_cells(row.gradcomm, row.size_bytes, busbw_factor());

  const ImplResult& g = row.gradcomm;
  std::string wire = "N/A", compr = "N/A";
  if (g.wire_bytes) {
    wire = fmt::format("{:.0f}", *g.wire_bytes);
    compr = *g.wire_bytes > 0 ? fmt::format("{:.2f}", dense_wire_bytes(row.size_bytes) / *g.wire_bytes) : "-";
  }
  // The data did not travel on the wire: through the segment's slots, or read from the
  // ranks' alloc_shared buffers in place.
  if (g.path == "shm") compr = "shm";
  if (g.path == "shm-direct") compr = "shm-d";
  line += fmt::format("  {:>{}}  {:>{}}", wire, kWireW, compr, kComprW);
  if (config_.phases) {
    const Phases p = g.phases.value_or(Phases{});
    for (double v : {p.reduce_us, p.encode_us, p.decode_us, p.comm_us}) line += "  " + fit(v, kPhaseW);
  }
  if (row.baseline) {
    const ImplResult& b = *row.baseline;
    const double algbw = algbw_gbps(row.size_bytes, b.time_us);
    const std::string wrong = b.wrong ? fmt::format("{}", *b.wrong) : "N/A";
    line += fmt::format("  {}  {}  {}  {:>{}}", fit(b.time_us, kBaseW), fit(algbw, kBaseW),
                        fit(algbw * busbw_factor(), kBaseW), wrong, kBaseW);
    line += "  " + fit(g.time_us > 0 ? b.time_us / g.time_us : 0.0, kRatioW);
    baseline_busbw_sum_ += algbw * busbw_factor();
  }
  fmt::print(out_, "{}\n", line);
  std::fflush(out_);

  busbw_sum_ += algbw_gbps(row.size_bytes, g.time_us) * busbw_factor();
  ++rows_;
  failed_checks_ += (g.wrong && *g.wrong > 0) + (row.baseline && row.baseline->wrong && *row.baseline->wrong > 0);
  add_record(row, row.gradcomm);
  if (row.baseline) add_record(row, *row.baseline);
}

// nccl-tests' closing lines; the baseline's average goes after them, worded so that a
// parser looking for "Avg bus bandwidth" finds gradcomm's.
void BenchTable::print_footer() {
  fmt::print(out_, "# {:<20} : {} {}\n", "Out of bounds values", failed_checks_, failed_checks_ ? "FAILED" : "OK");
  fmt::print(out_, "# {:<20} : {:g} \n", "Avg bus bandwidth", rows_ > 0 ? busbw_sum_ / rows_ : 0.0);
  fmt::print(out_, "#\n");
  fmt::print(out_, "# Collective test concluded: gradcomm-bench {}\n", bench_op_name(config_.op));
  if (!config_.baseline.empty()) {
    fmt::print(out_, "# Baseline {} bus bandwidth, mean over sizes: {:g}\n", config_.baseline,
               rows_ > 0 ? baseline_busbw_sum_ / rows_ : 0.0);
  }
  std::fflush(out_);
}

void BenchTable::add_record(const Row& row, const ImplResult& r) {
  double algbw = algbw_gbps(row.size_bytes, r.time_us);
  nlohmann::ordered_json rec = {
      {"op", bench_op_name(config_.op)},
      {"impl", r.impl},
      {"compressor", config_.compressor},
      {"dtype", dtype_name(row.dtype)},
      {"device", config_.device},
      {"ranks", config_.ranks},
      {"size_bytes", row.size_bytes},
      {"count", row.count},
      {"time_us", r.time_us},
      {"algbw_gbps", algbw},
      {"busbw_gbps", algbw * busbw_factor()},
      {"wire_bytes", r.wire_bytes ? nlohmann::ordered_json(*r.wire_bytes) : nlohmann::ordered_json(nullptr)},
      {"wrong", r.wrong ? nlohmann::ordered_json(*r.wrong) : nlohmann::ordered_json(nullptr)},
      {"warmup", config_.warmup},
      {"iters", config_.iters},
      {"input", config_.input},
      // nccl-tests' names for the same row (its -J output uses these keys).
      {"type", nccl_type_name(row.dtype)},
      {"redop", config_.op != BenchOp::kAllgather ? reduce_op_name(row.redop) : "none"},
      {"root", -1},
      {"in_place", in_place()},
      {"time_over_ranks", config_.rank_time},
      {"check_iters", config_.check_iters},
  };
  if (r.path) rec["path"] = *r.path;
  if (r.wire_bytes && *r.wire_bytes > 0 && !(r.path && r.path->starts_with("shm"))) {
    rec["compression_ratio"] = dense_wire_bytes(row.size_bytes) / *r.wire_bytes;
  }
  if (r.phases) {
    rec["reduce_us"] = r.phases->reduce_us;
    rec["encode_us"] = r.phases->encode_us;
    rec["decode_us"] = r.phases->decode_us;
    rec["comm_us"] = r.phases->comm_us;
  }
  records_.push_back(std::move(rec));
}

}  // namespace gradcomm::bench
