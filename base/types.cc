#include "gradcomm/types.h"

namespace gradcomm {

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

bool dtype_valid(uint8_t value) noexcept { return value <= static_cast<uint8_t>(DType::kUInt8); }

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "unknown";
}

}  // namespace gradcomm
