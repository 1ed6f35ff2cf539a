// cuBLAS is opened at first use (base/cublas_loader.h), not linked: loading gradcomm
// must not pull it in, and the loader must find every entry point PowerSGD and the
// trainer call. Neither needs a GPU, only the toolkit's library.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cublas_loader.h"

namespace gradcomm::detail {
namespace {

bool cublas_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libcublas.so") != std::string::npos) return true;
  }
  return false;
}

TEST(CublasLoader, NotLoadedUntilFirstUseThenEveryEntryPointResolves) {
  EXPECT_FALSE(cublas_mapped()) << "libcublas is mapped before any PowerSGD call on a CUDA tensor";
  const CublasApi& api = cublas_api("this test");
  EXPECT_TRUE(cublas_mapped());
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.set_workspace, nullptr);
  EXPECT_NE(api.set_math_mode, nullptr);
  EXPECT_NE(api.sgemm, nullptr);
  EXPECT_STREQ(api.status_name(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_EQ(&cublas_api("this test"), &api);  // opened once
}

}  // namespace
}  // namespace gradcomm::detail
