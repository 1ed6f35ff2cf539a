#include "bench_table.h"

#include <fmt/format.h>

namespace gradcomm::bench {

namespace {

// Column widths of one implementation's group; the phase columns follow gradcomm's.
constexpr int kSizeW = 12, kCountW = 12, kTypeW = 9;
constexpr int kTimeW = 11, kBwW = 8, kWireW = 12, kComprW = 6, kWrongW = 7, kPhaseW = 10, kRatioW = 7;

int group_width(bool phases) {
  return kTimeW + 2 * (kBwW + 1) + (kWireW + 1) + (kComprW + 1) + (kWrongW + 1) + (phases ? 4 * (kPhaseW + 1) : 0);
}

std::string na_or(const std::optional<std::string>& text) { return text.value_or("N/A"); }

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
  fmt::print(out_, "# gradcomm-bench: {} {} on {}, {} ranks, compressor '{}', -w {} -n {}\n", bench_op_name(c.op),
             dtype_name(c.dtype), c.device, c.ranks, c.compressor, c.warmup, c.iters);
  if (!c.baseline.empty()) fmt::print(out_, "# baseline {}: {}\n", c.baseline, c.baseline_description);
  if (!c.baseline.empty()) {
    fmt::print(out_,
               "# Per size: gradcomm's warm-up and timed calls, then the baseline's on the same buffers (interleaved\n"
               "# by size). ratio = baseline time / gradcomm time (> 1: gradcomm faster). MPI and Gloo count no\n"
               "# wire bytes: N/A.\n");
  }
  fmt::print(out_,
             "# time = max over ranks of each rank's mean over the timed calls; every call starts from the same\n"
             "# input ('{}'), restored and the ranks released by a barrier outside the timing.\n"
             "# algbw = size/time; busbw = algbw * {}.\n"
             "# wire = bytes_sent per rank per iteration (Communicator::stats(), mean over ranks); compr = dense ring\n"
             "# bytes / wire; #wrong = elements off the exact result, all ranks (--check, untimed).{}\n",
             c.input, c.op == BenchOp::kAllreduce ? "2(N-1)/N" : "(N-1)/N",
             c.phases ? "\n# Phases: gradcomm's time per iteration from stats(), mean over ranks (comm = waiting on the wire)."
                      : "");
  fmt::print(out_, "#\n");
  std::string groups = fmt::format("# {:>{}} ", "", kSizeW + kCountW + kTypeW);
  groups += fmt::format("{:^{}}", "gradcomm", group_width(c.phases));
  if (!c.baseline.empty()) groups += fmt::format("{:^{}}", c.baseline, group_width(false));
  fmt::print(out_, "{}\n", groups);

  auto impl_columns = [](bool phases) {
    std::string s = fmt::format("{:>{}} {:>{}} {:>{}} {:>{}} {:>{}} {:>{}}", "time(us)", kTimeW, "algbw", kBwW,
                                "busbw", kBwW, "wire(B)", kWireW, "compr", kComprW, "#wrong", kWrongW);
    if (phases) {
      s += fmt::format(" {:>{}} {:>{}} {:>{}} {:>{}}", "reduce(us)", kPhaseW, "encode(us)", kPhaseW, "decode(us)",
                       kPhaseW, "comm(us)", kPhaseW);
    }
    return s;
  };
  std::string head = fmt::format("#{:>{}} {:>{}} {:>{}} ", "size(B)", kSizeW, "count", kCountW, "type", kTypeW);
  head += impl_columns(c.phases);
  if (!c.baseline.empty()) head += " " + impl_columns(false) + fmt::format(" {:>{}}", "ratio", kRatioW);
  fmt::print(out_, "{}\n", head);
  std::fflush(out_);
}

void BenchTable::print_row(const Row& row) {
  auto impl_cells = [&](const ImplResult& r, bool phases) {
    double algbw = algbw_gbps(row.size_bytes, r.time_us);
    std::optional<std::string> wire, compr, wrong;
    if (r.wire_bytes) {
      wire = fmt::format("{:.0f}", *r.wire_bytes);
      compr = *r.wire_bytes > 0 ? fmt::format("{:.2f}", dense_wire_bytes(row.size_bytes) / *r.wire_bytes) : "-";
    }
    if (r.wrong) wrong = fmt::format("{}", *r.wrong);
    std::string s = fmt::format("{:>{}.1f} {:>{}.2f} {:>{}.2f} {:>{}} {:>{}} {:>{}}", r.time_us, kTimeW, algbw, kBwW,
                                algbw * busbw_factor(), kBwW, na_or(wire), kWireW, na_or(compr), kComprW,
                                na_or(wrong), kWrongW);
    if (phases) {
      Phases p = r.phases.value_or(Phases{});
      s += fmt::format(" {:>{}.1f} {:>{}.1f} {:>{}.1f} {:>{}.1f}", p.reduce_us, kPhaseW, p.encode_us, kPhaseW,
                       p.decode_us, kPhaseW, p.comm_us, kPhaseW);
    }
    return s;
  };
  std::string line = fmt::format(" {:>{}} {:>{}} {:>{}} ", row.size_bytes, kSizeW, row.count, kCountW,
                                 dtype_name(config_.dtype), kTypeW);
  line += impl_cells(row.gradcomm, config_.phases);
  if (row.baseline) {
    line += " " + impl_cells(*row.baseline, false);
    double ratio = row.gradcomm.time_us > 0 ? row.baseline->time_us / row.gradcomm.time_us : 0.0;
    line += fmt::format(" {:>{}.2f}", ratio, kRatioW);
  }
  fmt::print(out_, "{}\n", line);
  std::fflush(out_);

  busbw_sum_ += algbw_gbps(row.size_bytes, row.gradcomm.time_us) * busbw_factor();
  ++rows_;
  add_record(row, row.gradcomm);
  if (row.baseline) add_record(row, *row.baseline);
}

void BenchTable::print_footer() {
  fmt::print(out_, "# Avg bus bandwidth (gradcomm): {:.3f} GB/s\n", rows_ > 0 ? busbw_sum_ / rows_ : 0.0);
  std::fflush(out_);
}

void BenchTable::add_record(const Row& row, const ImplResult& r) {
  double algbw = algbw_gbps(row.size_bytes, r.time_us);
  nlohmann::ordered_json rec = {
      {"op", bench_op_name(config_.op)},
      {"impl", r.impl},
      {"compressor", config_.compressor},
      {"dtype", dtype_name(config_.dtype)},
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
  };
  if (r.wire_bytes && *r.wire_bytes > 0) rec["compression_ratio"] = dense_wire_bytes(row.size_bytes) / *r.wire_bytes;
  if (r.phases) {
    rec["reduce_us"] = r.phases->reduce_us;
    rec["encode_us"] = r.phases->encode_us;
    rec["decode_us"] = r.phases->decode_us;
    rec["comm_us"] = r.phases->comm_us;
  }
  records_.push_back(std::move(rec));
}

}  // namespace gradcomm::bench
