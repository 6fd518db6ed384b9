// ampscope-train --device cuda as a real process, in every build: where the back end cannot run
// (no CUDA in the build, no driver or device) it says why in one line on stderr and exits 2
// before doing anything; where it can, a short run trains and reports the CUDA back end.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cuda_backend.h"

namespace ampscope::trainer {
namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code = -1;
  std::string out, err;
};

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result run(const std::string& args) {
  const fs::path dir =
      fs::temp_directory_path() / ("ampscope_cuda_cli_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  const fs::path out = dir / "stdout", err = dir / "stderr";
  const std::string cmd = std::string("'") + AMPSCOPE_TRAIN_BIN + "' " + args + " >'" +
                          out.string() + "' 2>'" + err.string() + "' </dev/null";
  const int status = std::system(cmd.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read(out);
  r.err = read(err);
  fs::remove_all(dir);
  return r;
}

TEST(CudaCliTest, DeviceCudaTrainsOrSaysWhyNotInOneLine) {
  const std::string why = cuda_backend_unavailable_reason();
  const Result r =
      run("--device cuda --steps 3 --context 16 --width 16 --heads 2 --layers 1 "
          "--batch 4 --quiet");
  if (why.empty()) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("cuda:"), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("steps 3"), std::string::npos) << r.out;
    return;
  }
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err, "ampscope-train: error: --device cuda: " + why + "\n");
  EXPECT_EQ(r.out, "");
  if (!kCudaBackendBuilt) {
    EXPECT_NE(why.find("no CUDA support"), std::string::npos) << why;
  }
}

TEST(CudaCliTest, UnknownDeviceIsAUsageError) {
  const Result r = run("--device tpu --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ampscope::trainer
