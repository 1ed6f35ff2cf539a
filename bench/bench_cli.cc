#include "bench_cli.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <iterator>  // std::size
#include <utility>

#include "env.h"
#include "gradcomm/errors.h"
#include "gradcomm/version.h"

namespace gradcomm::bench {

namespace {

// nccl-tests' flags that gradcomm-bench does not implement, and why or what instead.
// `accepted`: the one value that asks for what gradcomm-bench does anyway (every
// nccl-tests command line says -g 1), taken silently; null: every use is refused.
struct RefusedFlag {
  const char* names;  // CLI11 spec: short and long
  const char* what;
  const char* instead;
  const char* accepted = nullptr;
};
constexpr RefusedFlag kRefused[] = {
    {"-t,--nthreads", "threads per process", "gradcomm runs one rank per process: start more ranks (gradcomm-run -n N)",
     "1"},
    {"-g,--ngpus", "GPUs per thread", "each rank drives one device: start one rank per GPU (gradcomm-run -n N)", "1"},
    {"-m,--agg_iters", "aggregated iterations", "each timed call is one collective"},
    {"-N,--run_cycles", "run cycles", "run the command again"},
    {"-p,--parallel_init", "parallel init", "each rank initializes on its own already"},
    {"-r,--root", "root", "allreduce and allgather have no root (the root column reads -1)"},
    {"-y,--stream_null", "NULL stream", "gradcomm's CUDA calls are ordered on the legacy default stream"},
    {"-T,--timeout", "timeout", "set GRADCOMM_TIMEOUT_S, or gradcomm-run --timeout S"},
    {"-G,--cudagraph", "CUDA graphs", "gradcomm's collectives cannot be captured in a graph"},
    {"-C,--report_cputime", "CPU time report", "the time column is wall time per call"},
    {"-S,--report_timestamps", "timestamps", "no timestamps are printed"},
    {"-J,--output_file", "JSON output file", "use --json FILE (gradcomm's records)"},
    {"-R,--local_register", "buffer registration", "gradcomm registers nothing"},
    {"-x,--cta_policy", "CTA policy", "NCCL-only"},
    {"-D,--device_implementation", "device implementation", "NCCL-only"},
    {"-V,--device_cta_count", "device CTA count", "NCCL-only"},
    {"-M,--memory", "memory report", "no memory report is printed"},
    {"-u,--unalign", "unaligned buffers", "buffers are always aligned"},
    {"-I,--per_iter_timing", "per-iteration timing", "the time column is the mean per call"},
    {"-K,--per_iter_skip", "per-iteration skip", "the time column is the mean per call"},
};

// The flag as the user wrote it ("-G" or "--cudagraph"), for the message.
std::string flag_name(const CLI::Option* opt) {
  auto shorts = opt->get_snames();
  auto longs = opt->get_lnames();
  std::string s = shorts.empty() ? "" : "-" + shorts.front();
  std::string l = longs.empty() ? "" : "--" + longs.front();
  return s.empty() ? l : l.empty() ? s : s + "/" + l;
}

struct TypeName {
  const char* name;
  std::optional<DType> dtype;  // nullopt: a type nccl-tests has and gradcomm lacks
};
// nccl-tests' names in its own order (what -d all walks), then its legacy ones, then gradcomm's.
constexpr TypeName kTypeNames[] = {
    {"int8", std::nullopt},           {"uint8", DType::kUInt8},       {"int32", DType::kInt32},
    {"uint32", std::nullopt},         {"int64", DType::kInt64},       {"uint64", std::nullopt},
    {"half", DType::kFloat16},        {"float", DType::kFloat32},     {"double", DType::kFloat64},
    {"bfloat16", DType::kBFloat16},   {"f8e4m3", std::nullopt},       {"f8e5m2", std::nullopt},
    {"char", std::nullopt},           {"int", DType::kInt32},         {"float32", DType::kFloat32},
    {"float16", DType::kFloat16},     {"float64", DType::kFloat64},
};
constexpr const char* kTypesSupported = "float (float32), half (float16), bfloat16, double (float64), int32, int64, "
                                        "uint8, or all";

std::vector<DType> parse_dtypes(const std::string& name) {
  if (name == "all") {
    std::vector<DType> all;
    for (const auto& t : kTypeNames) {
      if (std::string_view(t.name) == "char") break;  // the legacy and gradcomm names repeat these
      if (t.dtype) all.push_back(*t.dtype);
    }
    return all;
  }
  for (const auto& t : kTypeNames) {
    if (name != t.name) continue;
    if (!t.dtype) throw Unsupported(fmt::format("-d {}: gradcomm has no {} type; supported: {}", name, name, kTypesSupported));
    return {*t.dtype};
  }
  throw InvalidArgument(fmt::format("-d '{}': unknown type; supported: {}", name, kTypesSupported));
}

std::vector<ReduceOp> parse_redops(const std::string& name) {
  // nccl-tests' order (sum prod max min avg mulsum), less what gradcomm lacks.
  if (name == "all") return {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg};
  for (auto op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
    if (name == reduce_op_name(op)) return {op};
  }
  if (name == "prod" || name == "mulsum") {
    throw Unsupported(fmt::format("-o {}: gradcomm reduces with sum, avg, min or max (or -o all for those four)", name));
  }
  throw InvalidArgument(fmt::format("-o '{}': unknown reduction; supported: sum, avg, min, max, all", name));
}

// The largest size -b, -e and -i take, however written (plain bytes or K/M/G): 1 TiB,
// far above any message a collective is timed at. parse_bytes bounds only by int64_t;
// an absurd size is refused here, before any work, not by std::bad_alloc after every
// smaller size has been timed.
constexpr int64_t kMaxBytes = int64_t{1} << 40;

int64_t parse_size(const std::string& flag, const std::string& text) {
  auto v = detail::parse_bytes(text);
  if (!v || *v > kMaxBytes) {
    throw InvalidArgument(fmt::format("{} '{}': expected bytes such as 8, 1K, 64M, 2G, at most {}G", flag, text,
                                      kMaxBytes >> 30));
  }
  return *v;
}

}  // namespace

const char* rank_time_name(RankTime t) {
  switch (t) {
    case RankTime::kRank0: return "rank 0's";
    case RankTime::kMean: return "mean";
    case RankTime::kMin: return "min";
    case RankTime::kMax: return "max";
  }
  return "?";
}

const char* nccl_type_name(DType dtype) {
  for (const auto& t : kTypeNames) {
    if (t.dtype == dtype) return t.name;
  }
  return dtype_name(dtype);
}

std::optional<int> parse_command_line(int argc, char** argv, Options& o) {
  CLI::App app{"gradcomm-bench: nccl-tests-style benchmark of gradcomm's collectives, with MPI, Gloo or NCCL "
               "measured in the same run. Started directly it runs as one rank; for more, start it under a "
               "launcher (gradcomm-run -n N, mpirun, srun)."};
  bool version = false;
  std::string op_text;
  app.add_flag("--version", version, "Print gradcomm's version and exit");
  app.add_option("--op", op_text,
                 "Collective (allreduce, allgather, reduce_scatter; default allreduce), or a reduction as -o "
                 "(nccl-tests' --op)");
  app.add_option("-b,--minbytes", o.min_bytes, "Smallest size (bytes; K/M/G suffixes; at most 1024G)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "Largest size")->capture_default_str();
  auto* factor = app.add_option("-f,--stepfactor", o.factor, "Multiply the size by this each step (> 1); 0 or 1: add -i")
                     ->capture_default_str();
  auto* step = app.add_option("-i,--stepbytes", o.step_bytes, "Add this each step when -f <= 1 (-i alone implies -f 1)")
                   ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "Warm-up iterations per size")->capture_default_str();
  auto* check_opt = app.add_option("-c", o.check_iters, "Check each size N times on closed-form inputs (0: off)")
                        ->capture_default_str();
  // --check alone (gradcomm's flag) or --check N (nccl-tests' long form of -c).
  auto* check_long = app.add_option("--check", o.check_iters, "Same as -c; alone: -c 1")
                         ->expected(0, 1)
                         ->default_str("1");
  app.add_option("-o", o.redop, "Reduction: sum, avg, min, max or all (prod and mulsum are not in gradcomm)")
      ->capture_default_str();
  app.add_option("-d,--dtype,--datatype", o.dtype, "Element type (nccl-tests' or gradcomm's names), or all")
      ->capture_default_str();
  app.add_option("-a,--average", o.average, "Time over ranks: 0 rank 0's, 1 mean, 2 min, 3 max")->capture_default_str();
  app.add_option("-z,--blocking", o.blocking, "Only 3: wait for each call, untimed barrier between calls")
      ->capture_default_str();
  app.add_option("--compressor", o.compressor, "Compressor spec for allreduce (e.g. none)")->capture_default_str();
  app.add_option("--device", o.device, "Where the buffers live")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--buffers", o.buffers,
                 "Host buffers: private (the application's own memory) or shared (from alloc_shared: the node's "
                 "ranks read each other's in place)")
      ->check(CLI::IsMember({"private", "shared"}))
      ->capture_default_str();
  app.add_option("--rows", o.rows,
                 "View each allreduce message as a matrix of this many rows (for powersgd; 0: 1-D, sent dense by "
                 "powersgd)")
      ->capture_default_str();
  app.add_flag("--phases", o.phases, "Print gradcomm's per-phase time split (reduce/encode/decode/comm)");
  app.add_option("--json", o.json, "Rank 0 writes the results here as a JSON list");
  app.add_option("--input", o.input,
                 "What the timed calls reduce: gradient = normal(0, 1) draws per rank (floating types), "
                 "pattern = the --check values (7 magnitudes: heavy ties)")
      ->check(CLI::IsMember({"gradient", "pattern"}))
      ->capture_default_str();
  app.add_option("--baseline", o.baseline, "Peer measured in the same run")
      ->check(CLI::IsMember({"mpi", "gloo", "nccl", "none"}))
      ->capture_default_str();
  std::vector<std::pair<CLI::Option*, const RefusedFlag*>> refused;
  std::vector<std::string> sink(std::size(kRefused));
  for (size_t k = 0; k < std::size(kRefused); ++k) {
    const std::string help = kRefused[k].accepted
                                 ? fmt::format("nccl-tests' {}: only {} (the default) is supported", kRefused[k].what,
                                               kRefused[k].accepted)
                                 : fmt::format("nccl-tests' {}: not supported", kRefused[k].what);
    auto* opt = app.add_option(kRefused[k].names, sink[k], help)
                    ->expected(0, 1)
                    ->group("nccl-tests flags refused");
    refused.emplace_back(opt, &kRefused[k]);
  }
  app.footer(
      "nccl-tests' -b -e -f -i -n -w -c -o -d -a -z keep their meanings (bench/README.md); its other flags are "
      "refused by name. --baseline mpi: under gradcomm-run the MPI singletons are joined through ompi-server (Open "
      "MPI's TCP transport between them); under `mpirun -n N gradcomm-bench ...` MPI_COMM_WORLD is used (shared "
      "memory within a host), and the ranks meet through MPI itself (across hosts: -x "
      "GRADCOMM_STORE=tcp://HOST:PORT).");
  check_opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  check_long->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (version) {
    std::printf("gradcomm-bench (gradcomm) %s\n", GRADCOMM_VERSION_STRING);
    return 0;
  }
  for (size_t k = 0; k < refused.size(); ++k) {
    const auto& [opt, flag] = refused[k];
    if (opt->count() == 0) continue;
    if (flag->accepted != nullptr && sink[k] == flag->accepted) continue;
    if (flag->accepted != nullptr) {
      std::fprintf(stderr, "gradcomm-bench: %s %s (%s) is not supported by gradcomm-bench: only %s; %s\n",
                   flag_name(opt).c_str(), sink[k].c_str(), flag->what, flag->accepted, flag->instead);
    } else {
      std::fprintf(stderr, "gradcomm-bench: %s (%s) is not supported by gradcomm-bench: %s\n", flag_name(opt).c_str(),
                   flag->what, flag->instead);
    }
    return 2;
  }
  o.factor_given = factor->count() > 0;
  o.step_bytes_given = step->count() > 0;
  if (!op_text.empty()) {
    if (op_text == "allreduce" || op_text == "allgather" || op_text == "reduce_scatter") {
      o.op = op_text;
    } else {
      o.redop = op_text;  // nccl-tests' --op sum
    }
  }
  return std::nullopt;
}

Plan validate(const Options& o) {
  Plan p;
  p.op = o.op == "allgather"        ? BenchOp::kAllgather
         : o.op == "reduce_scatter" ? BenchOp::kReduceScatter
                                    : BenchOp::kAllreduce;
  p.min_bytes = parse_size("-b", o.min_bytes);
  p.max_bytes = parse_size("-e", o.max_bytes);
  if (p.min_bytes < 1 || p.min_bytes > p.max_bytes) {
    throw InvalidArgument(fmt::format("-b {} -e {}: need 1 <= -b <= -e", o.min_bytes, o.max_bytes));
  }
  // nccl-tests: -f > 1 multiplies, anything else adds -i; -i alone means -f 1 there (its default).
  p.factor = o.step_bytes_given && !o.factor_given ? 1 : o.factor;
  if (p.factor < 0) throw InvalidArgument(fmt::format("-f {}: the step factor must be >= 0 (0 or 1: add -i)", o.factor));
  p.step_bytes = parse_size("-i", o.step_bytes);
  if (p.factor <= 1 && p.step_bytes < 1) {
    throw InvalidArgument(fmt::format("-i {}: with -f {} the sizes grow by -i, which must be at least 1", o.step_bytes,
                                      p.factor));
  }
  if (o.iters < 1) throw InvalidArgument(fmt::format("-n {}: need at least 1 timed iteration", o.iters));
  if (o.warmup < 0) throw InvalidArgument(fmt::format("-w {}: need at least 0 warm-up iterations", o.warmup));
  if (o.check_iters < 0) throw InvalidArgument(fmt::format("-c {}: need 0 (no check) or more", o.check_iters));
  if (o.average < 0 || o.average > 3) {
    throw InvalidArgument(fmt::format("-a {}: expected 0 (rank 0's time), 1 (mean), 2 (min) or 3 (max)", o.average));
  }
  p.rank_time = static_cast<RankTime>(o.average);
  if (o.blocking != 3) {
    throw Unsupported(fmt::format("-z {}: gradcomm-bench times each call on its own, waits for it and releases the "
                                  "ranks with an untimed barrier (nccl-tests' -z 3); pass -z 3 or leave -z out",
                                  o.blocking));
  }
  p.dtypes = parse_dtypes(o.dtype);
  p.redops = parse_redops(o.redop);
  p.input = o.input == "pattern" ? TimingInput::kPattern : TimingInput::kGradient;
  p.device.type = o.device == "cuda" ? DeviceType::kCuda : DeviceType::kCpu;
  if (p.device.type == DeviceType::kCuda) p.device.index = bench_cuda_device();
  if (o.buffers == "shared" && p.device.type == DeviceType::kCuda) {
    throw InvalidArgument("--buffers shared: alloc_shared gives host memory; leave it out with --device cuda");
  }
  if (p.op == BenchOp::kAllgather) p.redops = {ReduceOp::kSum};  // unused: allgather reduces nothing
  if (p.op == BenchOp::kAllgather && o.compressor != "none") {
    throw InvalidArgument(fmt::format("--compressor '{}': compressors apply to allreduce and reduce_scatter only",
                                      o.compressor));
  }
  if (o.rows < 0) throw InvalidArgument(fmt::format("--rows {}: must be >= 0 (0: the message is 1-D)", o.rows));
  const bool only_sum = p.redops.size() == 1 && p.redops[0] == ReduceOp::kSum;
  if (o.compressor != "none" && p.op != BenchOp::kAllgather && !only_sum) {
    throw Unsupported(fmt::format("-o {} with --compressor '{}': gradcomm-bench measures compressors on sums only "
                                  "(-o sum)",
                                  o.redop, o.compressor));
  }
  if (o.check_iters > 0 && o.compressor != "none" && (p.dtypes.size() != 1 || p.dtypes[0] != DType::kFloat32)) {
    throw InvalidArgument(fmt::format("--compressor '{}' takes float32 (-d float)", o.compressor));
  }
  if (o.baseline != "none" && p.op != BenchOp::kAllgather && !only_sum) {
    throw Unsupported(fmt::format("-o {} with --baseline {}: the baselines are measured on sums only (-o sum)",
                                  o.redop, o.baseline));
  }
  if (p.device.type == DeviceType::kCuda && (o.baseline == "mpi" || o.baseline == "gloo")) {
    throw Unsupported(fmt::format("--baseline {} runs on host memory only; use --device cpu (or --baseline nccl "
                                  "with --device cuda)",
                                  o.baseline));
  }
  if (p.device.type != DeviceType::kCuda && o.baseline == "nccl") {
    throw InvalidArgument("--baseline nccl runs on GPU memory: add --device cuda");
  }
  return p;
}

}  // namespace gradcomm::bench
