#include "baselines/nccl_baseline.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>

#include "cuda/buffer.h"
#include "cuda/device.h"
#include "gradcomm/errors.h"
#include "transport/nccl/nccl_comm.h"
#include "transport/nccl/nccl_loader.h"  // NCCL is opened at first use, as in the library

namespace gradcomm::bench {
namespace {

constexpr const char* kIdKey = "bench/nccl/id";

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  throw InvalidArgument(fmt::format("--baseline nccl: unknown dtype value {}", static_cast<int>(dtype)));
}

}  // namespace

NcclBaseline::NcclBaseline(const BaselineSetup& setup) : timeout_(setup.timeout), device_(setup.device.index) {
  if (setup.device.type != DeviceType::kCuda) {
    throw InvalidArgument("--baseline nccl runs on GPU memory: use --device cuda");
  }
  detail::require_cuda_device(device_, "--baseline nccl");
  ncclUniqueId id{};
  if (setup.rank == 0) {
    id = detail::nccl_unique_id();
    setup.store->set(kIdKey, std::span(reinterpret_cast<const uint8_t*>(id.internal), sizeof(id.internal)));
  } else {
    const auto bytes = setup.store->get(kIdKey, setup.timeout);
    if (bytes.size() != sizeof(id.internal)) {
      throw CorruptPayload(fmt::format("--baseline nccl: rank {}: the NCCL id in the store has {} bytes, expected {}",
                                       setup.rank, bytes.size(), sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  try {
    comm_ = std::make_unique<detail::NcclComm>(id, setup.rank, setup.world_size, device_, setup.timeout);
  } catch (const Error& e) {
    throw_error(e.code(), fmt::format("--baseline nccl: rank {}: creating the NCCL communicator on cuda:{} failed "
                                      "(NCCL needs one GPU per rank; two ranks on one GPU cannot use it): {}",
                                      setup.rank, device_, e.what()));
  }
  detail::DeviceGuard guard(device_);
  done_ = std::make_unique<detail::Event>();
  int version = 0;
  detail::nccl_api().get_version(&version);
  description_ = fmt::format("NCCL {}.{}.{}, ncclAllReduce / ncclAllGather on the legacy default stream",
                             version / 10000, version / 100 % 100, version % 100);
}

NcclBaseline::~NcclBaseline() = default;

void NcclBaseline::validate(BenchOp op, DType dtype) const {
  if (op == BenchOp::kReduceScatter) {
    throw Unsupported("--baseline nccl: the bench runs ncclAllReduce and ncclAllGather; reduce_scatter on CUDA "
                      "tensors stages through host memory in gradcomm: use --device cpu --baseline mpi");
  }
  (void)nccl_type(dtype);
}

void NcclBaseline::prepare(BenchOp op, DType dtype, void* in, void* out, int64_t count) {
  op_ = op;
  dtype_ = static_cast<int>(nccl_type(dtype));
  in_ = in;
  out_ = out;
  count_ = count;
}

void NcclBaseline::run() {
  detail::DeviceGuard guard(device_);
  const auto type = static_cast<ncclDataType_t>(dtype_);
  const auto count = static_cast<size_t>(count_);
  if (op_ == BenchOp::kAllreduce) {
    comm_->launch(
        [&](ncclComm_t c) { return detail::nccl_api().all_reduce(in_, in_, count, type, ncclSum, c, nullptr); },
        "ncclAllReduce");
  } else {
    comm_->launch([&](ncclComm_t c) { return detail::nccl_api().all_gather(in_, out_, count, type, c, nullptr); },
                  "ncclAllGather");
  }
}

void NcclBaseline::synchronize() {
  detail::DeviceGuard guard(device_);
  done_->record(nullptr);
  comm_->wait(done_->get(), detail::Deadline::after(timeout_), "--baseline nccl: waiting for the collectives");
}

}  // namespace gradcomm::bench
