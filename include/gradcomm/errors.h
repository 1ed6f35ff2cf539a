// The error hierarchy. Every failure of the library is one of these exceptions;
// each message names the rank, the operation and its sequence number, and what
// was expected versus what was found.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace gradcomm {

enum class ErrorCode : uint8_t {
  kInvalidArgument = 1,  // the caller passed something wrong (size, spec, option)
  kUnsupported,          // valid, but not available here (no CUDA device, transport not built)
  kTimeout,              // a wait passed its deadline
  kPeerFailure,          // another rank died or its connection broke
  kMismatch,             // ranks disagree on the collective they called
  kCorruptPayload,       // bytes failed validation (wire message, state, payload)
  kTransport,            // the transport (UCX, NCCL, sockets) failed
  kCuda,                 // a CUDA runtime call failed
};
const char* error_code_name(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define GRADCOMM_DECLARE_ERROR(Name, Code)                                            \
  class Name : public Error {                                                        \
   public:                                                                           \
    explicit Name(const std::string& message) : Error(ErrorCode::Code, message) {}   \
  };
GRADCOMM_DECLARE_ERROR(InvalidArgument, kInvalidArgument)
GRADCOMM_DECLARE_ERROR(Unsupported, kUnsupported)
GRADCOMM_DECLARE_ERROR(TimeoutError, kTimeout)
GRADCOMM_DECLARE_ERROR(PeerFailure, kPeerFailure)
GRADCOMM_DECLARE_ERROR(MismatchError, kMismatch)
GRADCOMM_DECLARE_ERROR(CorruptPayload, kCorruptPayload)
GRADCOMM_DECLARE_ERROR(TransportError, kTransport)
GRADCOMM_DECLARE_ERROR(CudaError, kCuda)
#undef GRADCOMM_DECLARE_ERROR

// Throws the subclass that matches `code`, so an error that crossed a process
// boundary (as a code and a text) is rethrown as the same C++ type.
[[noreturn]] void throw_error(ErrorCode code, const std::string& message);

}  // namespace gradcomm
