// NCCL, opened at its first use (dlopen) instead of linked. Linking libnccl.so.2
// made it a NEEDED entry of libgradcomm.so, so the dynamic loader refused to load
// gradcomm at all on a machine without NCCL, CPU-only ones included, although only
// collectives on CUDA tensors (and the bench's NCCL baseline) call it. cuBLAS is
// handled the same way (base/cublas_loader.h).
//
// nccl.h is still included, for its types and for the prototypes that give each
// entry point its type (decltype); no NCCL symbol is referenced at link time.
// Every NCCL call in gradcomm goes through nccl_api().
#pragma once

#include <nccl.h>

namespace gradcomm::detail {

// The entry points gradcomm uses, resolved from libnccl.so.<NCCL_MAJOR>.
struct NcclApi {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config;
  decltype(&ncclCommFinalize) comm_finalize;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclCommAbort) comm_abort;
  decltype(&ncclCommGetAsyncError) comm_get_async_error;
  decltype(&ncclGetErrorString) get_error_string;
  decltype(&ncclGetLastError) get_last_error;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclAllGather) all_gather;
};

// The file name dlopen is asked for by default ("libnccl.so.2").
const char* nccl_library_name() noexcept;

// Opens the library once (thread-safe) and returns its entry points: libnccl.so.2 on
// the loader's path, else beside the NCCL the build found; GRADCOMM_NCCL_LIBRARY=<path>
// opens that file instead (and nothing else). Throws TransportError naming the
// library, the loader's reason (dlerror) and what to install when the library or one
// of the symbols is missing; a later call retries.
const NcclApi& nccl_api();

}  // namespace gradcomm::detail
