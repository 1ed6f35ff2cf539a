// gradcomm-bench: nccl-tests-style table for gradcomm's allreduce/allgather, with
// a peer library (MPI, Gloo on host memory; NCCL on GPU memory) measured in the
// same run on the same sizes.
//
//   gradcomm-run -n 2 gradcomm-bench -b 1K -e 64M -f 4 --baseline mpi --check
//   gradcomm-run -n 2 gradcomm-bench --device cuda -b 1K -e 256M --baseline nccl --check
//
// With --device cuda each rank uses GPU (local rank mod visible GPUs); gradcomm's
// calls are stream-ordered on the legacy default stream, and each timed call ends
// with a synchronize (gradcomm's and the baseline's) inside the timing.
//
// Per size: gradcomm warms up and runs its timed calls, then the baseline does the
// same on the same buffers (interleaved by size, so both see the machine in the
// same state); --check then runs each once more on closed-form inputs. Every call
// starts from the same input (--input: normal(0, 1) draws per rank by default),
// copied back and followed by a barrier outside the timing, so an in-place
// allreduce never reduces its own previous output. Each rank
// sends its numbers to rank 0 through the job's store (not through a collective:
// the control plane then never touches the measured library or its counters, on
// either device), and rank 0 prints the row.
//
// --baseline mpi works under either launcher: under gradcomm-run the ranks are MPI
// singletons that the bench joins through ompi-server (Open MPI then talks TCP
// between them: no shared memory across jobs); under mpirun
//   mpirun -n N -x GRADCOMM_STORE=tcp://127.0.0.1:PORT gradcomm-bench ...
// it uses MPI_COMM_WORLD, shared memory included. See baselines/mpi_baseline.h.

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "baselines/baseline.h"
#include "bench_data.h"
#include "bench_table.h"
#include "env.h"
#include "gradcomm/gradcomm.h"
#include "local_store.h"
#include "store/store.h"

namespace gradcomm::bench {
namespace {

// ---------------------------------------------------------------- options ----

struct Options {
  std::string op = "allreduce";
  std::string min_bytes = "8", max_bytes = "256M";
  int64_t factor = 2;
  int iters = 20, warmup = 5;
  std::string compressor = "none";
  std::string dtype = "float32";
  std::string device = "cpu";
  bool check = false;
  bool phases = false;
  std::string json;
  std::string baseline = "none";
  std::string input = "gradient";
  int64_t rows = 0;  // --rows: each message is a rows x (count / rows) matrix (powersgd); 0 = 1-D
};

// What the options mean once validated.
struct Plan {
  BenchOp op = BenchOp::kAllreduce;
  int64_t min_bytes = 0, max_bytes = 0;
  DType dtype = DType::kFloat32;
  Device device{};
  TimingInput input = TimingInput::kGradient;
};

DType parse_dtype(const std::string& name) {
  for (auto d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32, DType::kInt64,
                 DType::kUInt8}) {
    if (name == dtype_name(d)) return d;
  }
  throw InvalidArgument(fmt::format(
      "--dtype '{}': expected float32, float16, bfloat16, float64, int32, int64 or uint8", name));
}

int64_t parse_size(const std::string& flag, const std::string& text) {
  auto v = detail::parse_bytes(text);
  if (!v) throw InvalidArgument(fmt::format("{} '{}': expected bytes such as 8, 1K, 64M, 2G", flag, text));
  return *v;
}

Plan validate(const Options& o) {
  Plan p;
  p.op = o.op == "allgather" ? BenchOp::kAllgather : BenchOp::kAllreduce;
  p.min_bytes = parse_size("-b", o.min_bytes);
  p.max_bytes = parse_size("-e", o.max_bytes);
  if (p.min_bytes < 1 || p.min_bytes > p.max_bytes) {
    throw InvalidArgument(fmt::format("-b {} -e {}: need 1 <= -b <= -e", o.min_bytes, o.max_bytes));
  }
  if (o.factor < 2) throw InvalidArgument(fmt::format("-f {}: the size factor must be at least 2", o.factor));
  if (o.iters < 1 || o.warmup < 0) throw InvalidArgument("-n must be at least 1 and -w at least 0");
  p.dtype = parse_dtype(o.dtype);
  p.input = o.input == "pattern" ? TimingInput::kPattern : TimingInput::kGradient;
  p.device.type = o.device == "cuda" ? DeviceType::kCuda : DeviceType::kCpu;
  if (p.device.type == DeviceType::kCuda) p.device.index = bench_cuda_device();
  if (p.op == BenchOp::kAllgather && o.compressor != "none") {
    throw InvalidArgument(fmt::format("--compressor '{}': compressors apply to allreduce only", o.compressor));
  }
  if (o.rows < 0) throw InvalidArgument(fmt::format("--rows {}: must be >= 0 (0: the message is 1-D)", o.rows));
  if (o.check && o.compressor != "none" && p.dtype != DType::kFloat32) {
    throw InvalidArgument(fmt::format("--compressor '{}' takes float32 (--dtype float32)", o.compressor));
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

// ------------------------------------------------------------ measurement ----

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One rank's numbers for one size, shipped to rank 0 through the store as text.
struct RankSample {
  double gc_us = 0, base_us = 0;
  double wire = 0, reduce_us = 0, encode_us = 0, decode_us = 0, comm_us = 0;
  double wrong_gc = 0, wrong_base = 0;

  std::string encode() const {
    return fmt::format("{:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g}", gc_us, base_us,
                       wire, reduce_us, encode_us, decode_us, comm_us, wrong_gc, wrong_base);
  }
  static RankSample decode(const std::string& text) {
    RankSample s;
    std::istringstream in(text);
    in >> s.gc_us >> s.base_us >> s.wire >> s.reduce_us >> s.encode_us >> s.decode_us >> s.comm_us >> s.wrong_gc >>
        s.wrong_base;
    if (!in) throw CorruptPayload(fmt::format("gradcomm-bench: malformed result record '{}'", text));
    return s;
  }
};

class Bench {
 public:
  Bench(const Options& options, const Plan& plan, Communicator& comm, detail::Store& store,
        std::chrono::milliseconds timeout, Baseline* baseline)
      : o_(options), p_(plan), comm_(comm), store_(store), timeout_(timeout), baseline_(baseline) {}

  // Runs one size on every rank; rank 0 gets the row (nullopt elsewhere, or when
  // the size holds no element per rank and is skipped).
  std::optional<Row> run_size(int64_t size, int index);

 private:
  RankSample measure(int64_t count, int64_t per_rank);
  void gradcomm_op(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank,
                   const CompressOptions& copts);
  int64_t count_wrong(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank) const;
  Row gather(int index, int64_t size_bytes, int64_t count, const RankSample& mine);

  const Options& o_;
  const Plan& p_;
  Communicator& comm_;
  detail::Store& store_;
  std::chrono::milliseconds timeout_;  // for rank 0's wait on the other ranks' results
  Baseline* baseline_;
};

void Bench::gradcomm_op(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank,
                        const CompressOptions& copts) {
  if (p_.op == BenchOp::kAllreduce) {
    comm_.allreduce(in.view(p_.dtype, count), ReduceOp::kSum, copts);
  } else {
    comm_.allgather(in.view(p_.dtype, per_rank), out.view(p_.dtype, count));
  }
}

int64_t Bench::count_wrong(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank) const {
  if (p_.op == BenchOp::kAllreduce && o_.compressor != "none") {
    return count_wrong_compressed(in, o_.compressor, count, comm_.size(), p_.device, o_.rows);
  }
  if (p_.op == BenchOp::kAllreduce) return count_wrong_allreduce(in, p_.dtype, count, comm_.size(), p_.device);
  return count_wrong_allgather(out, p_.dtype, per_rank, comm_.size(), p_.device);
}

RankSample Bench::measure(int64_t count, int64_t per_rank) {
  const int64_t elt = static_cast<int64_t>(dtype_size(p_.dtype));
  const bool gather = p_.op == BenchOp::kAllgather;
  const int64_t in_count = gather ? per_rank : count;
  BenchBuffer in(in_count * elt, p_.device);
  BenchBuffer out(gather ? count * elt : 0, p_.device);  // allreduce is in place
  CompressOptions copts;
  copts.compressor = o_.compressor;
  copts.key = fmt::format("bench/{}", count * elt);
  if (o_.rows > 0 && !gather) {
    if (count % o_.rows != 0) {
      throw InvalidArgument(fmt::format("--rows {}: a message of {} elements is not a whole number of rows; pick "
                                        "sizes that are multiples of {} elements",
                                        o_.rows, count, o_.rows));
    }
    copts.shape = {o_.rows, count / o_.rows};
  }
  const bool cuda = p_.device.type == DeviceType::kCuda;
  const int rank = comm_.rank();
  RankSample s;

  // Every call, warm-up or timed, starts from the same input (`pristine`): an
  // in-place allreduce overwrites its input, and a compressor's cost depends on
  // what it compresses (a top-k of the previous call's sparse output is not a
  // top-k of a gradient). The restore and a barrier that releases the ranks
  // together stay outside the timing; a timed call ends with its synchronize on a GPU.
  BenchBuffer pristine(gather ? 0 : in_count * elt, p_.device);
  fill_timing_input(gather ? in : pristine, p_.dtype, in_count, rank, p_.device, p_.input);
  auto restore = [&] {
    if (!gather) copy_buffer(in, pristine, in_count * elt, p_.device);
  };

  // gradcomm: warm-up, then the timed calls, each between two stats snapshots
  // (the barriers between calls are not counted).
  for (int i = 0; i < o_.warmup; ++i) {
    restore();
    gradcomm_op(in, out, count, per_rank, copts);
  }
  if (cuda) comm_.synchronize();
  double spent_us = 0;
  Stats spent;  // sums of the per-call differences
  for (int i = 0; i < o_.iters; ++i) {
    restore();
    if (cuda) comm_.synchronize();
    comm_.barrier();
    const Stats before = comm_.stats();
    const double t0 = now_us();
    gradcomm_op(in, out, count, per_rank, copts);
    if (cuda) comm_.synchronize();
    spent_us += now_us() - t0;
    const Stats after = comm_.stats();
    spent.bytes_sent += after.bytes_sent - before.bytes_sent;
    spent.reduce_s += after.reduce_s - before.reduce_s;
    spent.encode_s += after.encode_s - before.encode_s;
    spent.decode_s += after.decode_s - before.decode_s;
    spent.total_s += after.total_s - before.total_s;
  }
  const double n = o_.iters;
  s.gc_us = spent_us / n;
  s.wire = static_cast<double>(spent.bytes_sent) / n;
  s.reduce_us = spent.reduce_s * 1e6 / n;
  s.encode_us = spent.encode_s * 1e6 / n;
  s.decode_us = spent.decode_s * 1e6 / n;
  s.comm_us = spent.comm_s() * 1e6 / n;

  // The baseline the same way, on the same buffers.
  if (baseline_ != nullptr) {
    comm_.barrier();
    restore();
    baseline_->prepare(p_.op, p_.dtype, in.data(), out.data(), in_count);
    for (int i = 0; i < o_.warmup; ++i) {
      restore();
      baseline_->run();
      baseline_->synchronize();
    }
    double base_us = 0;
    for (int i = 0; i < o_.iters; ++i) {
      restore();
      baseline_->synchronize();
      comm_.barrier();
      const double b0 = now_us();
      baseline_->run();
      baseline_->synchronize();
      base_us += now_us() - b0;
    }
    s.base_us = base_us / n;
  }

  // --check: one more call each on closed-form inputs, outside the timed loops.
  // Each refill is followed by a barrier: a peer that has already started the next
  // call may be writing into our buffers (Gloo's ring sends its first chunk straight
  // into the neighbour's bound output), and that must not race our memset.
  if (o_.check) {
    fill_check_input(in, p_.dtype, in_count, rank, p_.device);
    if (gather) clear_buffer(out, count * elt, p_.device);
    comm_.barrier();
    // A key with no history: the compressors' bounds hold for one call from zero residual.
    CompressOptions check_options = copts;
    check_options.key = fmt::format("bench/check/{}", count * elt);
    gradcomm_op(in, out, count, per_rank, check_options);
    if (cuda) comm_.synchronize();
    s.wrong_gc = static_cast<double>(count_wrong(in, out, count, per_rank));
    if (baseline_ != nullptr) {
      fill_check_input(in, p_.dtype, in_count, rank, p_.device);
      if (gather) clear_buffer(out, count * elt, p_.device);
      comm_.barrier();
      baseline_->run();
      baseline_->synchronize();
      s.wrong_base = static_cast<double>(count_wrong(in, out, count, per_rank));
    }
  }
  return s;
}

Row Bench::gather(int index, int64_t size_bytes, int64_t count, const RankSample& mine) {
  const int world = comm_.size();
  auto key = [index](int r) { return fmt::format("bench/result/{}/{}", index, r); };
  if (comm_.rank() != 0) {
    std::string text = mine.encode();
    store_.set(key(comm_.rank()), std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    return {};
  }
  // time: max over ranks; wire, phases: mean over ranks; #wrong: total over ranks.
  RankSample max = mine, sum = mine;
  for (int r = 1; r < world; ++r) {
    auto bytes = store_.get(key(r), timeout_);
    RankSample s = RankSample::decode(std::string(bytes.begin(), bytes.end()));
    max.gc_us = std::max(max.gc_us, s.gc_us);
    max.base_us = std::max(max.base_us, s.base_us);
    sum.wire += s.wire;
    sum.reduce_us += s.reduce_us;
    sum.encode_us += s.encode_us;
    sum.decode_us += s.decode_us;
    sum.comm_us += s.comm_us;
    sum.wrong_gc += s.wrong_gc;
    sum.wrong_base += s.wrong_base;
  }
  Row row;
  row.size_bytes = size_bytes;
  row.count = count;
  row.gradcomm.impl = "gradcomm";
  row.gradcomm.time_us = max.gc_us;
  row.gradcomm.wire_bytes = sum.wire / world;
  row.gradcomm.phases = Phases{sum.reduce_us / world, sum.encode_us / world, sum.decode_us / world,
                               sum.comm_us / world};
  if (o_.check) row.gradcomm.wrong = static_cast<int64_t>(sum.wrong_gc);
  if (baseline_ != nullptr) {
    ImplResult b;
    b.impl = baseline_->name();
    b.time_us = max.base_us;
    if (o_.check) b.wrong = static_cast<int64_t>(sum.wrong_base);
    row.baseline = b;
  }
  return row;
}

std::optional<Row> Bench::run_size(int64_t size, int index) {
  const int64_t elt = static_cast<int64_t>(dtype_size(p_.dtype));
  const int64_t world = comm_.size();
  // As nccl-tests: allgather's size is the gathered output, rounded down to whole
  // elements per rank.
  const int64_t per_rank = p_.op == BenchOp::kAllgather ? size / (elt * world) : size / elt;
  const int64_t count = p_.op == BenchOp::kAllgather ? per_rank * world : per_rank;
  if (per_rank == 0) return std::nullopt;  // same decision on every rank
  RankSample mine = measure(count, per_rank);
  Row row = gather(index, count * elt, count, mine);
  if (comm_.rank() != 0) return std::nullopt;
  return row;
}

// --------------------------------------------------------------- the run ----

// A client connection to the job's store, beside the Communicator's own: rank 0's
// Communicator already serves the address, so this one must never serve.
// create_store() serves only when asked as rank 0 (store.h), so every rank asks as
// a non-zero rank, which gives a plain client (or the same file store directory).
// One rank has no store server to reach (its Communicator starts none): it gets a
// store of its own.
std::unique_ptr<detail::Store> open_store_client(const detail::LaunchConfig& cfg) {
  if (cfg.world_size == 1) return std::make_unique<LocalStore>();
  detail::StoreOptions so;
  so.url = cfg.store;
  so.rank = std::max(cfg.rank, 1);
  so.world_size = std::max(cfg.world_size, 2);
  so.job_token = cfg.job_token;
  so.timeout = cfg.timeout;
  return detail::create_store(so);
}

int run(const Options& options) {
  Plan plan = validate(options);
  detail::LaunchConfig cfg = detail::resolve_launch_config(InitOptions{});
  auto comm = Communicator::create();
  auto store = open_store_client(cfg);
  const bool root = comm->rank() == 0;

  std::unique_ptr<Baseline> baseline;
  if (options.baseline != "none") {
    BaselineSetup setup;
    setup.store = store.get();
    setup.store_url = cfg.store;
    setup.rank = comm->rank();
    setup.world_size = comm->size();
    setup.timeout = cfg.timeout;
    setup.device = plan.device;
    baseline = make_baseline(options.baseline, setup);
    baseline->validate(plan.op, plan.dtype);
  }

  TableConfig tc;
  tc.op = plan.op;
  tc.compressor = options.compressor;
  tc.dtype = plan.dtype;
  tc.device = options.device;
  tc.ranks = comm->size();
  tc.warmup = options.warmup;
  tc.iters = options.iters;
  tc.input = options.input;
  tc.check = options.check;
  tc.phases = options.phases;
  if (baseline) {
    tc.baseline = baseline->name();
    tc.baseline_description = baseline->describe();
  }
  BenchTable table(tc, stdout);
  if (root) table.print_header();

  Bench bench(options, plan, *comm, *store, cfg.timeout, baseline.get());
  int index = 0;
  for (int64_t size = plan.min_bytes; size <= plan.max_bytes; ++index) {
    auto row = bench.run_size(size, index);
    if (row) table.print_row(*row);
    if (size > plan.max_bytes / options.factor) break;  // the next step would pass -e (or overflow)
    size *= options.factor;
  }
  if (root) table.print_footer();

  if (root && !options.json.empty()) {
    std::ofstream f(options.json);
    f << table.records().dump(2) << '\n';
    if (!f) throw InvalidArgument(fmt::format("--json {}: cannot write the file", options.json));
  }
  // MPI_Finalize is collective over every connected rank; the barrier keeps rank 0's
  // ompi-server alive until all of them are through it.
  if (baseline) baseline->shutdown();
  comm->barrier();
  return 0;
}

int rank_for_messages() {
  try {
    return detail::resolve_launch_config(InitOptions{}).rank;
  } catch (const Error&) {
    return -1;
  }
}

}  // namespace
}  // namespace gradcomm::bench

int main(int argc, char** argv) {
  using gradcomm::bench::Options;
  Options o;
  CLI::App app{"gradcomm-bench: nccl-tests-style benchmark of gradcomm's collectives, with MPI, Gloo or NCCL "
               "measured in the same run. Start it under a launcher (gradcomm-run -n N, mpirun, srun)."};
  app.add_option("--op", o.op, "Collective")->check(CLI::IsMember({"allreduce", "allgather"}))->capture_default_str();
  app.add_option("-b,--minbytes", o.min_bytes, "Smallest size (bytes; K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "Largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "Multiply the size by this each step")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "Warm-up iterations per size")->capture_default_str();
  app.add_option("--compressor", o.compressor, "Compressor spec for allreduce (e.g. none)")->capture_default_str();
  app.add_option("--dtype", o.dtype, "Element type")->capture_default_str();
  app.add_option("--device", o.device, "Where the buffers live")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--rows", o.rows,
                 "View each allreduce message as a matrix of this many rows (for powersgd; 0: 1-D, sent dense by "
                 "powersgd)")
      ->capture_default_str();
  app.add_flag("--check", o.check, "Verify results on closed-form inputs (once per size, not timed)");
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
  app.footer(
      "--baseline mpi: under gradcomm-run the MPI singletons are joined through ompi-server (Open MPI's TCP "
      "transport between them); under `mpirun -n N -x GRADCOMM_STORE=tcp://127.0.0.1:PORT gradcomm-bench ...` "
      "MPI_COMM_WORLD is used (shared memory within a host).");
  CLI11_PARSE(app, argc, argv);

  try {
    return gradcomm::bench::run(o);
  } catch (const std::exception& e) {
    // gradcomm::Error and anything else that escapes (std::bad_alloc for a huge -e).
    int rank = gradcomm::bench::rank_for_messages();
    std::fprintf(stderr, "gradcomm-bench (rank %s): %s\n", rank >= 0 ? std::to_string(rank).c_str() : "?", e.what());
    return 1;
  }
}
