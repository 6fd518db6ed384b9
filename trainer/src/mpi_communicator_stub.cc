// MPI's entry points in a build without MPI (AMPSCOPE_ENABLE_MPI=OFF or no MPI found): they
// say so, so that ampscope-train under mpirun gives one clear line.
#include <cstdlib>

#include "ampscope/check.h"
#include "ampscope/trainer/communicator.h"

namespace ampscope::trainer {
namespace {
constexpr const char* kNoMpi =
    "this build has no MPI support (install an MPI, e.g. libopenmpi-dev, and reconfigure)";
}

MpiRuntime::MpiRuntime(int*, char***) { throw Error(kNoMpi); }
MpiRuntime::~MpiRuntime() = default;
void MpiRuntime::abort(int code) const { std::exit(code); }

std::unique_ptr<Communicator> make_mpi_communicator(MpiRuntime&) { throw Error(kNoMpi); }

}  // namespace ampscope::trainer
