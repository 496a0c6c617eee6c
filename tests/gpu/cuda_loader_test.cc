// The CUDA backend loader's checks (kernels/cuda/plugin_abi.h) against fake libraries built from
// fake_cuda/fake_cuda_backend.cc: no GPU and no CUDA library needed (label unit).
#include <string>

#include <gtest/gtest.h>

#include "kernels/cuda/loader.h"
#include "kernels/cuda/plugin_abi.h"

namespace ring::kernels::cuda {
namespace {

const std::string kRule = "rule: the library must come from the same build as this program";

void expect_refused(const std::string& path, const std::string& why) {
  CudaLibrary l = open_cuda_library({path});
  EXPECT_EQ(l.create, nullptr) << path << " was accepted";
  EXPECT_EQ(l.path, "");
  EXPECT_NE(l.error.find(path + ": " + why), std::string::npos) << l.error;
  EXPECT_NE(l.error.find(kRule), std::string::npos) << l.error;
}

TEST(CudaLoader, MatchingLibraryIsUsed) {
  CudaLibrary l = open_cuda_library({RING_FAKE_CUDA_GOOD});
  ASSERT_NE(l.create, nullptr) << l.error;
  EXPECT_EQ(l.path, RING_FAKE_CUDA_GOOD);
  char err[128] = {0};
  EXPECT_EQ(l.create(3, err, sizeof err), nullptr);
  EXPECT_STREQ(err, "fake CUDA backend: create(device 3) called");
}

// The real library of this build passes the same checks (creating a backend needs a GPU; the
// checks do not).
TEST(CudaLoader, ThisBuildsLibraryPassesTheChecks) {
  CudaLibrary l = open_cuda_library({RING_KERNELS_CUDA_LIBRARY});
  EXPECT_NE(l.create, nullptr) << l.error;
  EXPECT_EQ(l.path, RING_KERNELS_CUDA_LIBRARY);
}

TEST(CudaLoader, OtherInterfaceHashIsRefusedWithBothBuilds) {
  expect_refused(RING_FAKE_CUDA_HASH, "built against another Backend interface");
  CudaLibrary l = open_cuda_library({RING_FAKE_CUDA_HASH});
  EXPECT_NE(l.error.find("another build"), std::string::npos) << l.error;
  EXPECT_NE(l.error.find("this program has hash "), std::string::npos) << l.error;
  EXPECT_NE(l.error.find(kBuiltWith), std::string::npos) << l.error;
}

TEST(CudaLoader, OtherAbiVersionIsRefused) {
  expect_refused(RING_FAKE_CUDA_VERSION,
                 "built for CUDA backend ABI version " + std::to_string(kRingKernelsCudaAbi + 1) +
                     ", this program needs " + std::to_string(kRingKernelsCudaAbi));
}

TEST(CudaLoader, SmallEntryStructIsRefused) {
  expect_refused(RING_FAKE_CUDA_SMALL, "its entry struct is");
}

TEST(CudaLoader, MissingEntryPointIsRefused) {
  expect_refused(RING_FAKE_CUDA_NO_SYMBOL, "does not export ring_kernels_cuda_entry");
}

TEST(CudaLoader, NullEntryIsRefused) {
  expect_refused(RING_FAKE_CUDA_NULL_ENTRY, "ring_kernels_cuda_entry() returned NULL");
}

// A refused candidate does not stop the search; every refusal is kept for the message.
TEST(CudaLoader, SearchSkipsRefusedLibraries) {
  CudaLibrary l = open_cuda_library({RING_FAKE_CUDA_HASH, RING_FAKE_CUDA_GOOD});
  EXPECT_NE(l.create, nullptr) << l.error;
  EXPECT_EQ(l.path, RING_FAKE_CUDA_GOOD);
  l = open_cuda_library({RING_FAKE_CUDA_HASH, "/nonexistent/libring_kernels_cuda.so"});
  EXPECT_EQ(l.create, nullptr);
  EXPECT_NE(l.error.find(std::string(RING_FAKE_CUDA_HASH) + ": built against another"),
            std::string::npos)
      << l.error;
  EXPECT_NE(l.error.find("/nonexistent/libring_kernels_cuda.so: "), std::string::npos) << l.error;
}

}  // namespace
}  // namespace ring::kernels::cuda
