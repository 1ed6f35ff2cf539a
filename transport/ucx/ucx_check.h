// UCX status handling shared by the UCX transport: the GRADCOMM_UCX_CHECK macro
// (set-up calls that must succeed throw TransportError with UCX's words, the call
// and file:line) and the classification of request errors.
#pragma once

#include <fmt/format.h>
#include <ucs/type/status.h>

#include <string>
#include <string_view>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

[[noreturn]] inline void throw_ucx_error(ucs_status_t status, std::string_view what, const char* call, const char* file,
                                         int line) {
  throw TransportError(
      fmt::format("ucx: {} failed: {} ({} at {}:{})", what, ucs_status_string(status), call, file, line));
}

inline void ucx_check(ucs_status_t status, std::string_view what, const char* call, const char* file, int line) {
  if (status != UCS_OK) throw_ucx_error(status, what, call, file, line);
}

// Statuses that mean "the remote side is gone or unreachable", as opposed to a
// local failure: requests that end with one of these become kPeerFailed.
inline bool is_peer_error(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
      return true;
    default:
      return false;
  }
}

}  // namespace gradcomm::detail

// GRADCOMM_UCX_CHECK(ucp_init(...), "creating the UCX context"): throws
// TransportError("ucx: creating the UCX context failed: <status> (<call> at file:line)").
#define GRADCOMM_UCX_CHECK(expr, what) ::gradcomm::detail::ucx_check((expr), (what), #expr, __FILE__, __LINE__)
