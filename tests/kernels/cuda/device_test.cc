// cuda_device_available() is the one CUDA entry point that must work everywhere: on a machine
// without a driver or device it answers false, quietly and without throwing; with a device it
// answers true and leaves no error behind. So, unlike the device tests, this test runs
// everywhere. (Without a driver the runtime reports its failed initialisation from every call,
// cudaGetLastError included, for the life of the process: nothing can clear that, which is why
// callers ask this first and then leave CUDA alone.)
#include "ampscope/cuda/device.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

namespace ampscope::cuda {
namespace {

TEST(CudaDeviceAvailabilityTest, AnswersQuietlyAndConsistently) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const bool available = cuda_device_available();
  const bool again = cuda_device_available();
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(available, again);
  EXPECT_EQ(out, "");
  EXPECT_EQ(err, "");
  if (available) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    int count = 0;
    EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    EXPECT_GT(count, 0);
  }
}

}  // namespace
}  // namespace ampscope::cuda
