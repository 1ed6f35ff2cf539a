// gradcomm-bench: nccl-tests-style table for gradcomm's allreduce/allgather, with
// a peer library (MPI, Gloo on host memory; NCCL on GPU memory) measured in the
// same run on the same sizes.
//
//   gradcomm-run -n 2 gradcomm-bench -b 1K -e 64M -f 4 --baseline mpi --check
//   gradcomm-run -n 2 gradcomm-bench --device cuda -b 1K -e 256M --baseline nccl --check
//   gradcomm-bench -c 1 -d float -o sum -b 8 -e 1M -f 2     (one rank, no launcher)
//
// It takes nccl-tests' flags and prints nccl-tests' table (bench_cli.h, bench_table.h),
// so scripts written for all_reduce_perf read its output. Started with no launcher's
// variables in the environment it is a 1-rank job. Under gradcomm-run, rank 0 asks the
// launcher to pass its stdout through without the "[0] " prefix (the line in
// GRADCOMM_RUN_UNPREFIXED, tools/launcher/launcher.h), so the table parses there too.
// A check that finds a wrong element fails the run (exit 1), as in nccl-tests.
//
// With --device cuda each rank uses GPU (local rank mod visible GPUs); gradcomm's
// calls are stream-ordered on the legacy default stream, and each timed call ends
// with a synchronize (gradcomm's and the baseline's) inside the timing.
//
// Per size: gradcomm warms up and runs its timed calls, then the baseline does the
// same on the same buffers (interleaved by size, so both see the machine in the
// same state); -c N (--check: N = 1) then runs each N more times on closed-form
// inputs. Every call
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
// it uses MPI_COMM_WORLD, shared memory included. See baselines/mpi_baseline.h. Under a
// bare `mpirun -n N gradcomm-bench ...` (no GRADCOMM_STORE) the ranks meet through MPI
// itself, as nccl-tests does (baselines/baseline.h, rendezvous_through_mpi).

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "baselines/baseline.h"
#include "bench_cli.h"
#include "bench_data.h"
#include "bench_table.h"
#include "launch_config.h"
#include "gradcomm/gradcomm.h"
#include "local_store.h"
#include "store/store.h"

namespace gradcomm::bench {
namespace {

// ------------------------------------------------------------ measurement ----

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One rank's numbers for one size, shipped to rank 0 through the store as text.
struct RankSample {
  double gc_us = 0, base_us = 0;
  double wire = 0, reduce_us = 0, encode_us = 0, decode_us = 0, comm_us = 0;
  double wrong_gc = 0, wrong_base = 0;
  double shm_ops = 0;    // collectives on the node's shared segment per call
  double shm_bytes = 0;  // bytes this rank put into the segment's slots per call

  std::string encode() const {
    return fmt::format("{:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g}",
                       gc_us, base_us, wire, reduce_us, encode_us, decode_us, comm_us, wrong_gc, wrong_base, shm_ops,
                       shm_bytes);
  }
  static RankSample decode(const std::string& text) {
    RankSample s;
    std::istringstream in(text);
    in >> s.gc_us >> s.base_us >> s.wire >> s.reduce_us >> s.encode_us >> s.decode_us >> s.comm_us >> s.wrong_gc >>
        s.wrong_base >> s.shm_ops >> s.shm_bytes;
    if (!in) throw CorruptPayload(fmt::format("gradcomm-bench: malformed result record '{}'", text));
    return s;
  }
};

class Bench {
 public:
  Bench(const Options& options, const Plan& plan, Communicator& comm, detail::Store& store,
        std::chrono::milliseconds timeout, Baseline* baseline)
      : o_(options), p_(plan), comm_(comm), store_(store), timeout_(timeout), baseline_(baseline) {}

  // The type and reduction the next run_size() calls measure (-d all, -o all walk them).
  void set_case(DType dtype, ReduceOp redop) {
    dtype_ = dtype;
    redop_ = redop;
  }
  // Runs one size on every rank; rank 0 gets the row (nullopt elsewhere, or when
  // the size holds no element per rank and is skipped).
  std::optional<Row> run_size(int64_t size, int index);

 private:
  RankSample measure(int64_t count, int64_t per_rank);
  void gradcomm_op(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank,
                   const CompressOptions& copts);
  // compressed: gradcomm's own call, checked against its compressor's bound; the baseline
  // is a dense collective and is checked against the exact result.
  int64_t count_wrong(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank,
                      bool compressed) const;
  Row gather(int index, int64_t size_bytes, int64_t count, const RankSample& mine);

  const Options& o_;
  const Plan& p_;
  Communicator& comm_;
  detail::Store& store_;
  std::chrono::milliseconds timeout_;  // for rank 0's wait on the other ranks' results
  Baseline* baseline_;
  DType dtype_ = DType::kFloat32;
  ReduceOp redop_ = ReduceOp::kSum;
};

void Bench::gradcomm_op(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank,
                        const CompressOptions& copts) {
  switch (p_.op) {
    case BenchOp::kAllreduce: comm_.allreduce(in.view(dtype_, count), redop_, copts); break;
    case BenchOp::kAllgather: comm_.allgather(in.view(dtype_, per_rank), out.view(dtype_, count)); break;
    case BenchOp::kReduceScatter:
      comm_.reduce_scatter(in.view(dtype_, count), out.view(dtype_, per_rank), redop_, copts);
      break;
  }
}

int64_t Bench::count_wrong(const BenchBuffer& in, const BenchBuffer& out, int64_t count, int64_t per_rank,
                           bool compressed) const {
  // reduce_scatter: this rank's share of the allreduce's result, from element r x per_rank.
  const int64_t first = static_cast<int64_t>(comm_.rank()) * per_rank;
  if (p_.op != BenchOp::kAllgather && compressed && o_.compressor != "none") {
    return p_.op == BenchOp::kAllreduce
               ? count_wrong_compressed(in, o_.compressor, count, comm_.size(), p_.device, o_.rows)
               : count_wrong_compressed(out, o_.compressor, per_rank, comm_.size(), p_.device, 0, first, count);
  }
  if (p_.op == BenchOp::kAllreduce) return count_wrong_allreduce(in, dtype_, count, comm_.size(), p_.device, redop_);
  if (p_.op == BenchOp::kReduceScatter) {
    return count_wrong_allreduce(out, dtype_, per_rank, comm_.size(), p_.device, redop_, first);
  }
  return count_wrong_allgather(out, dtype_, per_rank, comm_.size(), p_.device);
}

RankSample Bench::measure(int64_t count, int64_t per_rank) {
  const int64_t elt = static_cast<int64_t>(dtype_size(dtype_));
  const bool gather = p_.op == BenchOp::kAllgather;
  const bool in_place = p_.op == BenchOp::kAllreduce;  // the others leave their input as it is
  const int64_t in_count = gather ? per_rank : count;
  const int64_t out_count = gather ? count : p_.op == BenchOp::kReduceScatter ? per_rank : 0;
  // --buffers shared: the input (an allreduce's buffer) from alloc_shared, on the host.
  const bool shared = o_.buffers == "shared" && p_.device.type == DeviceType::kCpu;
  BenchBuffer in = shared ? BenchBuffer(in_count * elt, comm_) : BenchBuffer(in_count * elt, p_.device);
  BenchBuffer out(out_count * elt, p_.device);  // allreduce is in place
  CompressOptions copts;
  copts.compressor = o_.compressor;
  copts.key = fmt::format("bench/{}", count * elt);
  if (o_.rows > 0 && in_place) {
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
  BenchBuffer pristine(in_place ? in_count * elt : 0, p_.device);
  fill_timing_input(in_place ? pristine : in, dtype_, in_count, rank, p_.device, p_.input);
  auto restore = [&] {
    if (in_place) copy_buffer(in, pristine, in_count * elt, p_.device);
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
    spent.node_shm_ops += after.node_shm_ops - before.node_shm_ops;
    spent.node_shm_bytes += after.node_shm_bytes - before.node_shm_bytes;
  }
  const double n = o_.iters;
  s.gc_us = spent_us / n;
  s.wire = static_cast<double>(spent.bytes_sent) / n;
  s.shm_ops = static_cast<double>(spent.node_shm_ops) / n;
  s.shm_bytes = static_cast<double>(spent.node_shm_bytes) / n;
  s.reduce_us = spent.reduce_s * 1e6 / n;
  s.encode_us = spent.encode_s * 1e6 / n;
  s.decode_us = spent.decode_s * 1e6 / n;
  s.comm_us = spent.comm_s() * 1e6 / n;

  // The baseline the same way, on the same buffers.
  if (baseline_ != nullptr) {
    comm_.barrier();
    restore();
    // The baseline's count: allreduce's elements, allgather's and reduce_scatter's per rank.
    baseline_->prepare(p_.op, dtype_, in.data(), out.data(), in_place ? count : per_rank);
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

  // -c N: N more calls each on closed-form inputs, outside the timed loops. A rank
  // reports its first pass with a wrong element (nccl-tests stops there); every rank
  // still runs all N, so the ranks' collectives stay matched.
  // Each refill is followed by a barrier: a peer that has already started the next
  // call may be writing into our buffers (Gloo's ring sends its first chunk straight
  // into the neighbour's bound output), and that must not race our memset.
  for (int c = 0; c < o_.check_iters; ++c) {
    fill_check_input(in, dtype_, in_count, rank, p_.device);
    if (!in_place) clear_buffer(out, out_count * elt, p_.device);
    comm_.barrier();
    // A key with no history: the compressors' bounds hold for one call from zero residual.
    CompressOptions check_options = copts;
    check_options.key = fmt::format("bench/check/{}/{}", count * elt, c);
    gradcomm_op(in, out, count, per_rank, check_options);
    if (cuda) comm_.synchronize();
    const auto wrong_gc = static_cast<double>(count_wrong(in, out, count, per_rank, true));
    if (s.wrong_gc == 0) s.wrong_gc = wrong_gc;
    if (baseline_ != nullptr) {
      fill_check_input(in, dtype_, in_count, rank, p_.device);
      if (!in_place) clear_buffer(out, out_count * elt, p_.device);
      comm_.barrier();
      baseline_->run();
      baseline_->synchronize();
      const auto wrong_base = static_cast<double>(count_wrong(in, out, count, per_rank, false));
      if (s.wrong_base == 0) s.wrong_base = wrong_base;
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
  // time: per -a (rank 0's, mean, min or max over ranks); wire, phases: mean over
  // ranks; #wrong: total over ranks.
  RankSample sum = mine, min = mine, max = mine;
  for (int r = 1; r < world; ++r) {
    auto bytes = store_.get(key(r), timeout_);
    RankSample s = RankSample::decode(std::string(bytes.begin(), bytes.end()));
    min.gc_us = std::min(min.gc_us, s.gc_us);
    min.base_us = std::min(min.base_us, s.base_us);
    max.gc_us = std::max(max.gc_us, s.gc_us);
    max.base_us = std::max(max.base_us, s.base_us);
    min.shm_ops = std::min(min.shm_ops, s.shm_ops);
    max.shm_bytes = std::max(max.shm_bytes, s.shm_bytes);
    sum.gc_us += s.gc_us;
    sum.base_us += s.base_us;
    sum.wire += s.wire;
    sum.reduce_us += s.reduce_us;
    sum.encode_us += s.encode_us;
    sum.decode_us += s.decode_us;
    sum.comm_us += s.comm_us;
    sum.wrong_gc += s.wrong_gc;
    sum.wrong_base += s.wrong_base;
  }
  auto over_ranks = [&](double RankSample::*time) {
    switch (p_.rank_time) {
      case RankTime::kRank0: return mine.*time;
      case RankTime::kMean: return sum.*time / world;
      case RankTime::kMin: return min.*time;
      case RankTime::kMax: return max.*time;
    }
    return max.*time;
  };
  Row row;
  row.size_bytes = size_bytes;
  row.count = count;
  row.dtype = dtype_;
  row.redop = redop_;
  row.gradcomm.impl = "gradcomm";
  row.gradcomm.time_us = over_ranks(&RankSample::gc_us);
  row.gradcomm.wire_bytes = sum.wire / world;
  // Every rank's data went through the node's shared segment (docs/shared-memory.md):
  // through its slots, or read from the ranks' alloc_shared buffers in place (no slot
  // written: "shm-direct").
  row.gradcomm.path = min.shm_ops == 0 ? "transport" : max.shm_bytes == 0 ? "shm-direct" : "shm";
  row.gradcomm.phases = Phases{sum.reduce_us / world, sum.encode_us / world, sum.decode_us / world,
                               sum.comm_us / world};
  if (o_.check_iters > 0) row.gradcomm.wrong = static_cast<int64_t>(sum.wrong_gc);
  if (baseline_ != nullptr) {
    ImplResult b;
    b.impl = baseline_->name();
    b.time_us = over_ranks(&RankSample::base_us);
    if (o_.check_iters > 0) b.wrong = static_cast<int64_t>(sum.wrong_base);
    row.baseline = b;
  }
  return row;
}

std::optional<Row> Bench::run_size(int64_t size, int index) {
  const int64_t elt = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t world = comm_.size();
  // As nccl-tests: allgather's size is the gathered output and reduce_scatter's the
  // reduced input, rounded down to whole elements per rank.
  const bool split = p_.op != BenchOp::kAllreduce;
  const int64_t per_rank = split ? size / (elt * world) : size / elt;
  const int64_t count = split ? per_rank * world : per_rank;
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

// No launcher's variables at all: a 1-rank job (nccl-tests' all_reduce_perf runs the
// same way without mpirun). A launcher that set only half of a pair still gets the
// library's error naming what is missing.
InitOptions init_options() {
  InitOptions init;
  for (const char* name : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                           "SLURM_PROCID", "SLURM_NTASKS"}) {
    if (std::getenv(name) != nullptr) return init;
  }
  init.rank = 0;
  init.world_size = 1;
  return init;
}

std::string type_list(const std::vector<DType>& dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : ",") + std::string(nccl_type_name(d));
  return s;
}

int run(const Options& options) {
  Plan plan = validate(options);
  InitOptions init = init_options();
  if (auto mpi = rendezvous_through_mpi()) {  // bare mpirun: the store's address came through MPI
    init.store = mpi->store;
    init.job_token = mpi->job_token;
  }
  detail::LaunchConfig cfg = detail::resolve_launch_config(init);
  auto comm = Communicator::create(init);
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
    for (DType d : plan.dtypes) baseline->validate(plan.op, d);
  }

  TableConfig tc;
  tc.op = plan.op;
  tc.compressor = options.compressor;
  tc.types = type_list(plan.dtypes);
  tc.device = options.device;
  tc.ranks = comm->size();
  tc.warmup = options.warmup;
  tc.iters = options.iters;
  tc.min_bytes = plan.min_bytes;
  tc.max_bytes = plan.max_bytes;
  tc.factor = plan.factor;
  tc.step_bytes = plan.step_bytes;
  tc.check_iters = options.check_iters;
  tc.rank_time = rank_time_name(plan.rank_time);
  tc.input = options.input;
  tc.phases = options.phases;
  if (baseline) {
    tc.baseline = baseline->name();
    tc.baseline_description = baseline->describe();
  }
  // Under gradcomm-run, rank 0's table goes out without the "[0] " prefix (launcher.h).
  if (const char* line = std::getenv("GRADCOMM_RUN_UNPREFIXED"); root && line != nullptr && *line != '\0') {
    std::printf("%s\n", line);
  }
  BenchTable table(tc, stdout);
  if (root) table.print_header();

  // As nccl-tests: every type, then every reduction, then the sizes; -f > 1 multiplies
  // the size, anything else adds -i.
  Bench bench(options, plan, *comm, *store, cfg.timeout, baseline.get());
  int index = 0;  // names the store keys of one size's results: unique over the whole run
  for (DType dtype : plan.dtypes) {
    for (ReduceOp redop : plan.redops) {
      bench.set_case(dtype, redop);
      for (int64_t size = plan.min_bytes; size <= plan.max_bytes; ++index) {
        auto row = bench.run_size(size, index);
        if (row) table.print_row(*row);
        // Stop where the next step would pass -e (tested so that it cannot overflow).
        if (plan.factor > 1) {
          if (size > plan.max_bytes / plan.factor) break;
          size *= plan.factor;
        } else {
          if (size > plan.max_bytes - plan.step_bytes) break;
          size += plan.step_bytes;
        }
      }
    }
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
  // As nccl-tests: a failed check fails the run (rank 0 knows; the others exit 0).
  if (root && table.failed_checks() > 0) {
    std::fprintf(stderr, "gradcomm-bench: %d check(s) found wrong elements (the #wrong columns)\n",
                 table.failed_checks());
    return 1;
  }
  return 0;
}

int rank_for_messages() {
  try {
    return detail::resolve_launch_config(init_options()).rank;
  } catch (const Error&) {
    return -1;
  }
}

}  // namespace
}  // namespace gradcomm::bench

int main(int argc, char** argv) {
  gradcomm::bench::Options o;
  if (auto code = gradcomm::bench::parse_command_line(argc, argv, o)) return *code;
  try {
    return gradcomm::bench::run(o);
  } catch (const std::exception& e) {
    // gradcomm::Error and anything else that escapes (std::bad_alloc for a huge -e).
    int rank = gradcomm::bench::rank_for_messages();
    std::fprintf(stderr, "gradcomm-bench (rank %s): %s\n", rank >= 0 ? std::to_string(rank).c_str() : "?", e.what());
    return 1;
  }
}
