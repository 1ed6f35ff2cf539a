// Benchmark buffers and the closed-form values --check compares against.
//
// Rank r's element i holds (r + 1) * (i % 7 + 1): small integers, so every dtype
// (float16 included) represents them and their sums exactly. Allreduce (sum)
// must give (i % 7 + 1) * N(N+1)/2 everywhere (mod 256 for uint8, which wraps);
// allgather must place rank r's element j at out[r * count + j].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <memory>

#include "gradcomm/communicator.h"
#include "gradcomm/types.h"

namespace gradcomm::bench {

// Host or CUDA memory of `bytes` bytes, uninitialized. On a CUDA device it
// needs a build with CUDA (Unsupported otherwise).
class BenchBuffer {
 public:
  BenchBuffer(int64_t bytes, Device device);
  // Host memory from comm.alloc_shared (a collective: every rank makes the same ones, in
  // the same order), which the node's ranks read in place (--buffers shared).
  BenchBuffer(int64_t bytes, Communicator& comm);
  ~BenchBuffer();
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;

  void* data() const { return data_; }
  TensorView view(DType dtype, int64_t numel) const { return TensorView{data_, numel, dtype, device_}; }

 private:
  void* data_ = nullptr;
  Device device_;
  SharedBuffer shared_;  // holds data_ when it is not null
};

// The GPU this process benchmarks on: its local rank (LOCAL_RANK from gradcomm-run
// or torchrun, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID; else 0) modulo the
// visible devices, so ranks on one host spread over its GPUs. Unsupported without
// a CUDA device or a CUDA build.
int bench_cuda_device();

// Writes rank `rank`'s closed-form input.
void fill_check_input(const BenchBuffer& buf, DType dtype, int64_t count, int rank, Device device);
// What the timed calls compress and sum (--input).
//   gradient: floating types get normal(0, 1) draws from a generator seeded by the
//             rank, the continuous, mostly distinct magnitudes of a real gradient
//             (what a top-k selection or a quantizer's buckets see in training);
//   pattern:  the closed-form check values, 7 distinct magnitudes per rank (every
//             top-k threshold lands on a huge tie: a sparsifier's worst case).
// Integer types get zeros either way.
enum class TimingInput { kGradient, kPattern };
void fill_timing_input(const BenchBuffer& buf, DType dtype, int64_t count, int rank, Device device,
                       TimingInput input);
// dst = src, `bytes` bytes on `device` (restores an in-place call's input).
void copy_buffer(const BenchBuffer& dst, const BenchBuffer& src, int64_t bytes, Device device);
// Zeroes `bytes` bytes: an allgather output starts blank, so an element the collective never
// wrote reads as wrong (every expected value is at least 1).
void clear_buffer(const BenchBuffer& buf, int64_t bytes, Device device);
// Elements that differ from the exact result of `op` over the check inputs: with
// v = i % 7 + 1, sum v * N(N+1)/2 (wrapping like the type), min v, max v * N, avg the
// sum divided by N as gradcomm divides (in the type's arithmetic, integers truncating;
// fp16/bf16 in fp32, rounded once). `first`: the index of buf's first element in the
// reduced tensor (a reduce_scatter's share starts at rank x count).
int64_t count_wrong_allreduce(const BenchBuffer& buf, DType dtype, int64_t count, int world_size, Device device,
                              ReduceOp op = ReduceOp::kSum, int64_t first = 0);
// The same inputs through a compressor (float32, sum, a key with no history): an
// element is wrong when it breaks the compressor's own error bound, which for the
// compressed ring is a per-encode bound times the N encodes an element goes
// through; the sparsifiers must give 0 or the exact sum, with at most as many
// non-zeros as they select; powersgd (the message a rows x count/rows matrix) must be
// an orthogonal projection of the exact sum. See bench_data.cc for each bound.
// For a reduce_scatter's share: `first` as above, and `call_numel` the call's whole input
// (what the library decides dense or compressed on; 0: count).
int64_t count_wrong_compressed(const BenchBuffer& buf, const std::string& spec, int64_t count, int world_size,
                               Device device, int64_t rows = 0, int64_t first = 0, int64_t call_numel = 0);
int64_t count_wrong_allgather(const BenchBuffer& out, DType dtype, int64_t count_per_rank, int world_size,
                              Device device);

}  // namespace gradcomm::bench
