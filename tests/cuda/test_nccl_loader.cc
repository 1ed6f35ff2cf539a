// NCCL is opened at first use (transport/nccl/nccl_loader.h), not linked: a process
// that loaded gradcomm and ran collectives on CPU tensors must not have libnccl
// mapped (on a machine without NCCL it could not even have started); a missing
// library is a typed error naming it; and the loader finds every entry point
// gradcomm calls. None of it needs a GPU, only the NCCL that came with the toolkit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gradcomm/gradcomm.h"
#include "transport/nccl/nccl_loader.h"
#include "unit/test_util.h"

namespace gradcomm::detail {
namespace {

bool nccl_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libnccl.so") != std::string::npos) return true;
  }
  return false;
}

TEST(NcclLoader, NotLoadedByCpuCollectivesNamedWhenMissingThenEveryEntryPointResolves) {
  EXPECT_FALSE(nccl_mapped()) << "libnccl is mapped before any collective ran";

  // A library that is not there: a TransportError that names it and says why; the
  // failure is not remembered, so the next call (with the library there) loads it.
  ::setenv("GRADCOMM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  try {
    nccl_api();
    ADD_FAILURE() << "nccl_api() opened /nonexistent/libnccl.so.2";
  } catch (const TransportError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot open /nonexistent/libnccl.so.2 (GRADCOMM_NCCL_LIBRARY)"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file"), std::string::npos) << what;  // dlerror's reason
  }
  ::unsetenv("GRADCOMM_NCCL_LIBRARY");

  // Two ranks allreduce a CPU tensor (rank r contributes r+1 everywhere): NCCL stays out.
  constexpr int kRanks = 2;
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(1000));
  for (int r = 0; r < kRanks; ++r) data[r].assign(data[r].size(), static_cast<float>(r + 1));
  testing::run_ranks(kRanks,
                     [&](Communicator& comm) { comm.allreduce(TensorView::of(data[comm.rank()].data(), 1000)); });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(data[r][999], 3.0f) << "rank " << r;
  EXPECT_FALSE(nccl_mapped()) << "a CPU allreduce loaded libnccl";

  const NcclApi& api = nccl_api();
  EXPECT_TRUE(nccl_mapped());
  EXPECT_NE(api.get_unique_id, nullptr);
  EXPECT_NE(api.comm_init_rank_config, nullptr);
  EXPECT_NE(api.comm_finalize, nullptr);
  EXPECT_NE(api.comm_destroy, nullptr);
  EXPECT_NE(api.comm_abort, nullptr);
  EXPECT_NE(api.comm_get_async_error, nullptr);
  EXPECT_NE(api.get_last_error, nullptr);
  EXPECT_NE(api.group_start, nullptr);
  EXPECT_NE(api.group_end, nullptr);
  EXPECT_NE(api.send, nullptr);
  EXPECT_NE(api.recv, nullptr);
  EXPECT_NE(api.all_reduce, nullptr);
  EXPECT_NE(api.all_gather, nullptr);
  // Calls that need no GPU: the library answers, with the ABI we compiled
  // against.
  int version = 0;
  ASSERT_EQ(api.get_version(&version), ncclSuccess);
  EXPECT_EQ(version / 10000, NCCL_MAJOR) << "loaded " << nccl_library_name() << " reports version " << version;
  EXPECT_STREQ(api.get_error_string(ncclSuccess), "no error");
  EXPECT_EQ(&nccl_api(), &api);  // opened once
}

}  // namespace
}  // namespace gradcomm::detail
