// gradcomm-test-cuda-worker: one rank of the multi-process CUDA tests, started by
// gradcomm-run. Every rank uses GPU 0 (several processes on one GPU: NCCL refuses
// that, so transport=auto must choose the staging path).
//
//   staging     dense allreduce (sizes 0, 1, N-1, 1000003 x sum/avg/min/max x
//               fp32/fp16/bf16/fp64/int32), allgather and broadcast on CUDA tensors,
//               checked against closed form; then every compressor spec, 3 steps
//               each, bitwise identical across ranks (hash allgather). Prints the
//               path the communicator chose.
//
// Prints one "RESULT ..." line per rank; "RESULT rank=R skip=no-cuda-device" (exit
// 0) on a machine without a GPU, so the test can skip.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "comm_impl.h"
#include "common/closed_form.h"
#include "cuda/device.h"
#include "gradcomm/gradcomm.h"

using namespace gradcomm;

namespace {

using gradcomm::testing::contribution;
using gradcomm::testing::store_average;
using gradcomm::testing::store_value;

struct Checker {
  explicit Checker(int rank) : rank(rank) {}
  void operator()(bool ok, const std::string& what) {
    ++checks;
    if (!ok) {
      ++wrong;
      fmt::print(stderr, "rank {}: WRONG {}\n", rank, what);
    }
  }
  int rank, checks = 0, wrong = 0;
};

void cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw CudaError(fmt::format("cuda worker: {}: {}", what, cudaGetErrorString(rc)));
}

// A device copy of host bytes, and back.
class DeviceBytes {
 public:
  explicit DeviceBytes(const std::vector<uint8_t>& host) : bytes_(host.size()) {
    cuda(cudaMalloc(&data_, std::max<size_t>(bytes_, 1)), "cudaMalloc");
    if (bytes_ > 0) cuda(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceBytes() { cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  TensorView view(DType dtype) const {
    return TensorView{data_, static_cast<int64_t>(bytes_ / dtype_size(dtype)), dtype, {DeviceType::kCuda, 0}};
  }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> host(bytes_);
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (bytes_ > 0) cuda(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

uint64_t fnv(const std::vector<uint8_t>& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

// Hashes travel over the host path (a CPU allgather), independent of the CUDA one.
bool same_on_every_rank(Communicator& comm, const std::vector<uint8_t>& bytes) {
  uint64_t mine = fnv(bytes);
  std::vector<uint64_t> all(comm.size());
  comm.allgather(TensorView{&mine, 1, DType::kInt64, {}}, TensorView{all.data(), comm.size(), DType::kInt64, {}});
  for (uint64_t h : all) {
    if (h != mine) return false;
  }
  return true;
}

int run_staging(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  Checker check(r);
  for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{1000003}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
        const size_t bytes = numel * dtype_size(dtype);
        std::vector<uint8_t> x(bytes), expected(bytes);
        for (int64_t i = 0; i < numel; ++i) {
          store_value(dtype, x.data(), i, contribution(r, i));
          double sum = 0, lo = 1e9, hi = -1e9;
          for (int s = 0; s < n; ++s) {
            sum += contribution(s, i);
            lo = std::min(lo, contribution(s, i));
            hi = std::max(hi, contribution(s, i));
          }
          if (op == ReduceOp::kAvg) {
            store_average(dtype, expected.data(), i, sum, n);
          } else {
            store_value(dtype, expected.data(), i, op == ReduceOp::kSum ? sum : op == ReduceOp::kMin ? lo : hi);
          }
        }
        DeviceBytes t(x);
        comm.allreduce(t.view(dtype), op);
        comm.synchronize();
        const auto got = t.read();
        const std::string what = fmt::format("allreduce numel={} {} {}", numel, dtype_name(dtype), reduce_op_name(op));
        check(got == expected, what);
        check(same_on_every_rank(comm, got), what + " bitwise across ranks");
      }
    }
    std::vector<uint8_t> in(numel * 4), gathered(numel * 4 * n);
    for (int64_t i = 0; i < numel; ++i) store_value(DType::kInt32, in.data(), i, r * 7 + static_cast<double>(i));
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < numel; ++i) {
        store_value(DType::kInt32, gathered.data(), s * numel + i, s * 7 + static_cast<double>(i));
      }
    }
    DeviceBytes din(in), dout(std::vector<uint8_t>(gathered.size(), 0xFF));
    comm.allgather(din.view(DType::kInt32), dout.view(DType::kInt32));
    check(dout.read() == gathered, fmt::format("allgather numel={}", numel));
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> b(numel * 4, static_cast<uint8_t>(r == root ? 0x11 * (root + 1) : 0));
      DeviceBytes db(b);
      comm.broadcast(db.view(DType::kInt32), root);
      check(db.read() == std::vector<uint8_t>(numel * 4, static_cast<uint8_t>(0x11 * (root + 1))),
            fmt::format("broadcast numel={} root={}", numel, root));
    }
  }
  const int64_t numel = 100003;
  for (const char* spec : {"fp16", "bf16", "topk:ratio=0.01", "topk:ratio=0.01,select=sample", "randomk:ratio=0.05",
                           "qsgd:levels=16,bucket=512", "quant:bits=4,bucket=256,round=stochastic",
                           "quant:bits=8,round=nearest", "sign:bucket=128", "sketch:rows=3,k=100"}) {
    for (int step = 0; step < 3; ++step) {
      std::vector<uint8_t> x(numel * 4);
      for (int64_t i = 0; i < numel; ++i) {
        const float v = std::sin(0.001f * static_cast<float>(i * (r + 2) + step)) * static_cast<float>(1 + i % 3);
        std::memcpy(x.data() + i * 4, &v, 4);
      }
      DeviceBytes t(x);
      CompressOptions options;
      options.compressor = spec;
      options.key = fmt::format("w/{}", spec);
      comm.allreduce(t.view(DType::kFloat32), ReduceOp::kAvg, options);
      comm.synchronize();
      const auto got = t.read();
      bool finite = true;
      for (int64_t i = 0; i < numel; ++i) {
        float v;
        std::memcpy(&v, got.data() + i * 4, 4);
        finite &= std::isfinite(v);
      }
      check(finite, fmt::format("{} step {} finite", spec, step));
      check(same_on_every_rank(comm, got), fmt::format("{} step {} bitwise across ranks", spec, step));
    }
  }
  fmt::print("RESULT rank={} path={} checks={} wrong={}\n", r, comm.impl().cuda_path(), check.checks, check.wrong);
  return check.wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const char* rank_env = std::getenv("RANK");
  if (detail::cuda_device_count() == 0) {
    fmt::print("RESULT rank={} skip=no-cuda-device\n", rank_env ? rank_env : "?");
    return 0;
  }
  try {
    auto comm = Communicator::create();
    if (mode == "staging") return run_staging(*comm);
    fmt::print(stderr, "unknown mode '{}'\n", mode);
    return 2;
  } catch (const std::exception& e) {
    fmt::print("RESULT rank={} error={}\n", rank_env ? rank_env : "?", e.what());
    return 1;
  }
}
