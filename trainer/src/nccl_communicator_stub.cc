// The NCCL communicator's entry point in a build without CUDA, MPI or NCCL: it says so.
#include "ampscope/check.h"
#include "ampscope/trainer/communicator.h"

namespace ampscope::trainer {

std::unique_ptr<Communicator> make_nccl_communicator(MpiRuntime&, int) {
  throw Error(
      "this build has no NCCL support (needs the CUDA toolkit with NCCL and an MPI; reconfigure "
      "with -DAMPSCOPE_ENABLE_CUDA=ON)");
}

}  // namespace ampscope::trainer
