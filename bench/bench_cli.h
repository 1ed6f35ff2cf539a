// gradcomm-bench's command line: gradcomm's own long options, and nccl-tests' flags
// with nccl-tests' meanings (src/common.cu there), so that a command typed for
// all_reduce_perf runs here:
//
//   -b -e        smallest and largest size (bytes; K/M/G suffixes)
//   -f / -i      multiply the size by -f each step when -f > 1, else add -i bytes
//                (nccl-tests: -f 1 and -i 1M by default; here -f 2, and -i alone
//                means -f 1, as it does there)
//   -n -w        timed and warm-up iterations per size
//   -c N         check the result N times per size on closed-form inputs (0: off, the
//                default here; nccl-tests checks once by default). --check = -c 1
//   -o OP        sum, avg, min, max or all (allreduce; prod and mulsum refused)
//   -d TYPE      nccl-tests' type names (float, half, bfloat16, double, int32, int64,
//                uint8) or gradcomm's (float32, ...), or all
//   -a A         time over ranks: 0 rank 0's, 1 the mean, 2 the min, 3 the max (the
//                default here; nccl-tests' default is 1)
//   -z Z         only 3 (wait for each call, barrier between calls, not timed): what
//                gradcomm-bench always does; 0, 1 and 2 are refused
//
// Every other nccl-tests flag (-t -g -m -N -p -r -y -T -G -C -S -J -R -x -D -V -M -u
// -I -K, short or long) is refused by name, with what to do instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "baselines/baseline.h"
#include "bench_data.h"
#include "gradcomm/types.h"

namespace gradcomm::bench {

// As typed; validate() turns it into a Plan.
struct Options {
  std::string op = "allreduce";  // --op: allreduce | allgather, or a reduction (as -o)
  std::string min_bytes = "8", max_bytes = "256M", step_bytes = "1M";
  int64_t factor = 2;
  bool factor_given = false, step_bytes_given = false;
  int iters = 20, warmup = 5;
  int check_iters = 0;  // -c N; --check = 1
  std::string redop = "sum";
  int average = 3;      // -a
  int blocking = 3;     // -z
  std::string compressor = "none";
  std::string dtype = "float32";
  std::string device = "cpu";
  std::string buffers = "private";  // --buffers: private | shared (Communicator::alloc_shared)
  bool phases = false;
  std::string json;
  std::string baseline = "none";
  std::string input = "gradient";
  int64_t rows = 0;  // --rows: each message is a rows x (count / rows) matrix (powersgd); 0 = 1-D
};

// How each rank's time per call becomes the row's time (-a, nccl-tests' numbering).
enum class RankTime { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };
const char* rank_time_name(RankTime t);  // "rank 0's", "mean", "min", "max"

// What the options mean once validated.
struct Plan {
  BenchOp op = BenchOp::kAllreduce;
  int64_t min_bytes = 0, max_bytes = 0;
  int64_t factor = 2;      // > 1: multiply each step
  int64_t step_bytes = 0;  // factor <= 1: add this each step
  std::vector<DType> dtypes;
  std::vector<ReduceOp> redops;  // allreduce; allgather runs once, redop "none"
  Device device{};
  TimingInput input = TimingInput::kGradient;
  RankTime rank_time = RankTime::kMax;
};

// Parses argv into `o`. Returns an exit code when the run should stop here (--help,
// --version, a usage error or a refused nccl-tests flag, with its message printed),
// nullopt to go on.
std::optional<int> parse_command_line(int argc, char** argv, Options& o);

// Throws InvalidArgument / Unsupported naming the flag and the value.
Plan validate(const Options& o);

// nccl-tests' name of a type ("float", "half"), printed in the table's type column.
const char* nccl_type_name(DType dtype);

}  // namespace gradcomm::bench
