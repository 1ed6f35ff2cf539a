#include "transport/nccl/nccl_loader.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "env.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

#define GRADCOMM_NCCL_STR2(x) #x
#define GRADCOMM_NCCL_STR(x) GRADCOMM_NCCL_STR2(x)
// The major version we compiled against: its ABI is the one the prototypes describe.
constexpr const char* kLibrary = "libnccl.so." GRADCOMM_NCCL_STR(NCCL_MAJOR);

const char* or_no_reason(const char* why) { return why != nullptr ? why : "no reason given"; }

template <class Fn>
void resolve(void* library, const char* library_name, const char* name, Fn& out) {
  dlerror();  // clear a stale message, so the one read below is this lookup's
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    throw TransportError(fmt::format("NCCL: {} has no symbol {} ({}); gradcomm was built against NCCL {}.{}: install "
                                     "NCCL {}.{} or later",
                                     library_name, name, or_no_reason(dlerror()), NCCL_MAJOR, NCCL_MINOR, NCCL_MAJOR,
                                     NCCL_MINOR));
  }
  out = reinterpret_cast<Fn>(symbol);
}

NcclApi load() {
  // GRADCOMM_NCCL_LIBRARY: a path (or name) to open instead, and only that (e.g. the
  // NCCL that ships inside a torch wheel).
  const std::optional<std::string> chosen = env_string("GRADCOMM_NCCL_LIBRARY");
  const bool user_chosen = chosen.has_value();
  const char* name = user_chosen ? chosen->c_str() : kLibrary;
  // RTLD_LOCAL: its symbols stay out of the global namespace (torch may bring its own NCCL).
  void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  std::string why;
  if (library == nullptr) why = or_no_reason(dlerror());
#ifdef GRADCOMM_NCCL_LIBRARY_DIR
  if (library == nullptr && !user_chosen) {  // not on the loader's path: where the NCCL we built against lives
    const std::string beside_build = std::string(GRADCOMM_NCCL_LIBRARY_DIR) + "/" + kLibrary;
    library = dlopen(beside_build.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) why += fmt::format("; {}", or_no_reason(dlerror()));
  }
#endif
  if (library == nullptr) {
    throw TransportError(fmt::format("NCCL: cannot open {}{} ({}); collectives on CUDA tensors need it: install NCCL "
                                     "(it comes with the CUDA toolkit) or put its directory on LD_LIBRARY_PATH",
                                     name, user_chosen ? " (GRADCOMM_NCCL_LIBRARY)" : "", why));
  }
  NcclApi api{};
  resolve(library, name, "ncclGetVersion", api.get_version);
  resolve(library, name, "ncclGetUniqueId", api.get_unique_id);
  resolve(library, name, "ncclCommInitRankConfig", api.comm_init_rank_config);
  resolve(library, name, "ncclCommFinalize", api.comm_finalize);
  resolve(library, name, "ncclCommDestroy", api.comm_destroy);
  resolve(library, name, "ncclCommAbort", api.comm_abort);
  resolve(library, name, "ncclCommGetAsyncError", api.comm_get_async_error);
  resolve(library, name, "ncclGetErrorString", api.get_error_string);
  resolve(library, name, "ncclGetLastError", api.get_last_error);
  resolve(library, name, "ncclGroupStart", api.group_start);
  resolve(library, name, "ncclGroupEnd", api.group_end);
  resolve(library, name, "ncclSend", api.send);
  resolve(library, name, "ncclRecv", api.recv);
  resolve(library, name, "ncclAllReduce", api.all_reduce);
  resolve(library, name, "ncclAllGather", api.all_gather);
  return api;  // the library stays open for the process's lifetime
}

}  // namespace

const char* nccl_library_name() noexcept { return kLibrary; }

const NcclApi& nccl_api() {
  static std::once_flag once;
  static NcclApi api;
  std::call_once(once, [] { api = load(); });  // a throw leaves `once` unset: the next call retries
  return api;
}

}  // namespace gradcomm::detail
