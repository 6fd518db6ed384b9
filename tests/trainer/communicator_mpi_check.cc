// The MPI communicator's collectives on the ranks mpirun started (MultiRankTest runs it with 2):
// every check prints a line naming the rank and the collective when it fails; exit 0 when all
// pass on this rank. Not a gtest binary: it must run under mpirun, and only there.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "ampscope/trainer/communicator.h"

namespace {

using namespace ampscope::trainer;

int failures = 0;

void expect(bool ok, int rank, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: %s\n", rank, what);
  ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  std::unique_ptr<Communicator> comm = make_mpi_communicator(mpi);
  const int r = comm->rank(), n = comm->size();
  expect(n == mpi.world_size() && r == mpi.world_rank(), r, "rank and size are MPI's");
  expect(comm->name() == "mpi" && comm->supports(ampscope::Device::kCpu) &&
             !comm->supports(ampscope::Device::kCuda),
         r, "the MPI communicator reduces host memory only");

  // Sum: rank r holds (r + 1) * (i + 0.5); the sum is exact in FP32 and the same everywhere.
  // An odd length that no chunking rounds to.
  std::vector<float> x(1001);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((r + 1) * (i + 0.5));
  const ampscope::trainer::Tensor t(x.data(), ampscope::Format::kFP32,
                                    {static_cast<std::int64_t>(x.size())});
  auto backend = make_cpu_backend();
  comm->all_reduce_sum(t, backend->stream());
  const double ranks_sum = n * (n + 1) / 2.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] != static_cast<float>(ranks_sum * (i + 0.5))) {
      expect(false, r, "all_reduce_sum gives the sum over ranks");
      break;
    }
  }

  // Max: a slot each rank owns (-inf elsewhere) gathers; -received_seq gives the minimum.
  std::vector<double> v(2 + static_cast<std::size_t>(n), -std::numeric_limits<double>::infinity());
  v[0] = r == 1 ? 1.0 : 0.0;
  v[1] = -static_cast<double>(10 + r);
  v[2 + static_cast<std::size_t>(r)] = 100.0 + r;
  comm->all_reduce_max(v);
  expect(v[0] == (n > 1 ? 1.0 : 0.0), r, "all_reduce_max: one rank's flag reaches all");
  expect(v[1] == -10.0, r, "all_reduce_max: the lowest seq wins");
  for (int k = 0; k < n; ++k) {
    expect(v[2 + static_cast<std::size_t>(k)] == 100.0 + k, r, "all_reduce_max gathers slots");
  }

  // Broadcast from the last rank.
  std::vector<std::byte> bytes(13, std::byte{0});
  if (r == n - 1) {
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 1);
  }
  comm->broadcast(bytes, n - 1);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    expect(bytes[i] == std::byte(i * 7 + 1), r, "broadcast delivers the root's bytes");
  }
  comm->barrier();
  comm.reset();  // before MPI_Finalize
  if (failures == 0) std::printf("rank %d of %d: collectives ok\n", r, n);
  return failures == 0 ? 0 : 1;
}
