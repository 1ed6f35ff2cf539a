#include "gradcomm/errors.h"

namespace gradcomm {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kUnsupported: return "Unsupported";
    case ErrorCode::kTimeout: return "TimeoutError";
    case ErrorCode::kPeerFailure: return "PeerFailure";
    case ErrorCode::kMismatch: return "MismatchError";
    case ErrorCode::kCorruptPayload: return "CorruptPayload";
    case ErrorCode::kTransport: return "TransportError";
    case ErrorCode::kCuda: return "CudaError";
  }
  return "Error";
}

void throw_error(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kInvalidArgument: throw InvalidArgument(message);
    case ErrorCode::kUnsupported: throw Unsupported(message);
    case ErrorCode::kTimeout: throw TimeoutError(message);
    case ErrorCode::kPeerFailure: throw PeerFailure(message);
    case ErrorCode::kMismatch: throw MismatchError(message);
    case ErrorCode::kCorruptPayload: throw CorruptPayload(message);
    case ErrorCode::kTransport: throw TransportError(message);
    case ErrorCode::kCuda: throw CudaError(message);
  }
  throw TransportError(message);  // unknown code from the wire: still an Error
}

}  // namespace gradcomm
