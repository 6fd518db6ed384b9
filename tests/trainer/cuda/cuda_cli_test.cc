// ampscope-train --device cuda as a real process, in every build: where the back end cannot run
// (no CUDA in the build, no driver or device) it says why in one line on stderr and exits 2
// before doing anything; where it can, a short run trains and reports the CUDA back end.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "cuda_backend.h"

namespace ampscope::trainer {
namespace {

using Result = ampscope::testing::CommandResult;

Result run(std::vector<std::string> args) {
  args.insert(args.begin(), AMPSCOPE_TRAIN_BIN);
  return ampscope::testing::run_process(args, std::chrono::minutes(2));
}

TEST(CudaCliTest, DeviceCudaTrainsOrSaysWhyNotInOneLine) {
  const std::string why = cuda_backend_unavailable_reason();
  const Result r = run({"--device", "cuda", "--steps", "3", "--context", "16", "--width", "16",
                        "--heads", "2", "--layers", "1", "--batch", "4", "--quiet"});
  if (why.empty()) {
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("cuda:"), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("steps 3"), std::string::npos) << r.out;
    return;
  }
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err, "ampscope-train: error: --device cuda: " + why + "\n");
  EXPECT_EQ(r.out, "");
  if (!kCudaBackendBuilt) {
    EXPECT_NE(why.find("no CUDA support"), std::string::npos) << why;
  }
}

// The FP8/FP4 modes run on the CUDA back end too (device fake_quantize): a short run trains
// where a device exists; elsewhere the answer is the same one line as for any --device cuda run.
TEST(CudaCliTest, Fp8AndFp4ModesTrainOrSayWhyNotInOneLine) {
  const std::string why = cuda_backend_unavailable_reason();
  for (const char* mode : {"fp8-delayed", "fp8-current", "mxfp8", "nvfp4"}) {
    const Result r =
        run({"--device", "cuda", "--precision", mode, "--steps", "2", "--context", "16", "--width",
             "32", "--heads", "2", "--layers", "1", "--batch", "2", "--quiet"});
    if (why.empty()) {
      EXPECT_EQ(r.code, 0) << mode << ": " << r.err;
      EXPECT_NE(r.out.find("steps 2"), std::string::npos) << mode << ": " << r.out;
      continue;
    }
    EXPECT_EQ(r.code, 2) << mode;
    EXPECT_EQ(r.err, "ampscope-train: error: --device cuda: " + why + "\n") << mode;
    EXPECT_EQ(r.out, "");
  }
}

TEST(CudaCliTest, UnknownDeviceIsAUsageError) {
  const Result r = run({"--device", "tpu", "--steps", "1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ampscope::trainer
