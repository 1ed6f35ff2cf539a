// PowerSGD's CUDA arithmetic, the twin of powersgd.h (the rules and the step are
// powersgd_logic.h's; the step on the NCCL path is src/collectives/nccl_powersgd_allreduce.cc).
// Host-callable, stream-ordered launchers on device pointers: each enqueues its work on
// `stream` on the current device and returns without synchronizing. The kernels'
// element and reduction arithmetic is gpu_powersgd_logic.h's (GRADCOMM_HD), which the
// host test (tests/unit/test_powersgd_gpu_logic.cc) holds to powersgd.h.
//
// What equals the CPU and what does not:
//  - the initial Q draws: bit for bit (initial_q);
//  - the reconstruction P Q^T (and its /N, the residual, the dense parts): bit for bit
//    for the same P and Q (same summation order, no FMA: --fmad=false);
//  - the Gram-Schmidt: the same steps and rounding, but each dot product is summed in
//    double in a fixed tree over kOrthoThreads partial sums instead of in row order, so a
//    column can differ from the CPU's by an ulp when its double sum rounds differently;
//  - the two products against the gradient (cuBLAS sgemm, full fp32: no TF32 and no
//    BF16x9 emulation) sum in another order than OpenBLAS.
// Tolerance: for a well-conditioned input (a gradient whose leading r singular values
// are separated from each other and from the rest, so the rank-r subspace is stable),
// the output, the residual and the kept Q are each within 1e-4 relative Frobenius
// error of the CPU path's, over several warm-started steps. Reordering an fp32 sum
// of `cols` products moves it by a few ulps (relative 1e-7 to 1e-6; the host test's
// emulated step, products summed backwards, lands there); 1e-4 leaves two orders of
// magnitude for its amplification by Gram-Schmidt and the power iteration. Near-equal
// singular values have no such bound on either device: there the chosen subspace
// itself is ill-posed, and the two paths may keep different ones.
//
// Ranks: every kernel here is deterministic (fixed reduction order, no atomics) and the
// inputs of orthonormalize and reconstruct are the allreduced P and Q, identical on all
// ranks, so every rank ends bitwise identical (the products against each rank's own
// gradient need not agree across ranks: their results are summed by the ring).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "compressors/philox.h"
#include "compressors/lowrank/gpu_powersgd_logic.h"
#include "compressors/lowrank/powersgd_logic.h"
#include "cuda/buffer.h"

struct cublasContext;  // cublas_api.h's handle type; only gpu_powersgd.cu includes cuBLAS

namespace gradcomm::detail {

// A cuBLAS handle on the device current at construction, with its own workspace, used
// from one thread (the communicator's engine) at a time. bind() points it at a stream
// before each call's products.
class GpuBlas {
 public:
  GpuBlas();  // throws CudaError
  ~GpuBlas();
  GpuBlas(const GpuBlas&) = delete;
  GpuBlas& operator=(const GpuBlas&) = delete;

  // Enqueues the following products on `stream`. cublasSetStream drops a user
  // workspace, so the workspace is set again each time (a host-side call, no sync).
  cublasContext* bind(cudaStream_t stream);

 private:
  int device_ = -1;
  cublasContext* handle_ = nullptr;
  DeviceBuffer workspace_;  // cuBLAS's recommendation for Hopper: 32 MiB
};

// Element e of q[0, floats) = initial_q(s, e): the CPU's draw_initial_q.
void gpu_powersgd_draw_q(float* q, int64_t floats, const PhiloxStream& s, cudaStream_t stream);

// Orthonormalizes, in place, every matrix's P (buf = the P buffer, at p_offset, rows x
// rank) or Q (buf = the Q buffer, at q_offset, cols x rank): one block per matrix.
void gpu_powersgd_orthonormalize(const powersgd::Plan& plan, float* buf, Factor factor, cudaStream_t stream);

// p_buf = [P_1 .. P_m, dense parts]: P_i = M_i Q_i (cuBLAS) and the dense parts copied.
void gpu_powersgd_project(GpuBlas& blas, const powersgd::Plan& plan, const float* data, const float* q, float* p_buf,
                          cudaStream_t stream);

// Q_i = M_i^T P_i for every matrix (cuBLAS).
void gpu_powersgd_project_back(GpuBlas& blas, const powersgd::Plan& plan, const float* data, const float* p_buf,
                               float* q, cudaStream_t stream);

// data (acc on entry) receives the result: matrices P_i Q_i^T, dense parts their sum from
// p_buf, divided by n when `average` (powersgd.h's reconstruct). With a residual:
// residual = acc - P_i Q_i^T / n for matrices, 0 for the dense parts.
void gpu_powersgd_reconstruct(const powersgd::Plan& plan, const float* p_buf, const float* q, int n, bool average,
                              float* data, float* residual, cudaStream_t stream);

}  // namespace gradcomm::detail
