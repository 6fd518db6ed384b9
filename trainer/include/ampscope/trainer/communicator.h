// Collectives between the ranks of a data-parallel run (docs/multi-rank.md), over existing
// engines: none (one process), MPI (CPU back end) or NCCL (CUDA back end, bootstrapped over MPI).
//
// Every rank calls the same collectives in the same order. Implementations:
//   - single: one process; every collective is the identity. Always built; needs no MPI.
//   - mpi: MPI_COMM_WORLD (a duplicate of it); host memory. Built when CMake finds MPI
//     (AMPSCOPE_ENABLE_MPI).
//   - nccl: one CUDA device per rank; all_reduce_sum is an ncclAllReduce enqueued on the back
//     end's stream; the host collectives go through MPI (max staged through a device buffer).
//     Built with CUDA, MPI and NCCL.
// A build without MPI or NCCL still declares every entry point; the factories then throw
// ampscope::Error saying what the build lacks, so callers need no #ifdef.
//
// Ownership and threads: a Communicator is used by the one training thread. MpiRuntime owns
// MPI's lifetime for the whole process: create exactly one (in main), before any MPI or NCCL
// communicator, and destroy it after them.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ampscope/trainer/backend.h"
#include "ampscope/vocabulary.h"

namespace ampscope::trainer {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single", "mpi", "nccl"
  // Whether all_reduce_sum takes tensors in `device` memory.
  virtual bool supports(Device device) const = 0;

  // x (FP32, in back-end memory on a supported device) = the sum of x over ranks, in place,
  // ordered on `stream` (the back end's): the host implementations finish before returning,
  // NCCL's is enqueued. Every rank gets the same bits.
  virtual void all_reduce_sum(const Tensor& x, Stream& stream) = 0;
  // values (host) = the elementwise maximum over ranks, in place; returns when done. NaN is not
  // a value here (MPI and NCCL order it differently): callers encode it.
  virtual void all_reduce_max(std::span<double> values) = 0;
  // data (host) on every rank = root's data; returns when done.
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  virtual void barrier() = 0;
};

// One process: rank 0 of 1, supports every device.
std::unique_ptr<Communicator> make_single_communicator();

// MPI_Init_thread at construction (MPI_THREAD_FUNNELED: only the training thread calls MPI),
// MPI_Finalize at destruction. Throws ampscope::Error when the build has no MPI or MPI fails.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // This rank's index among the ranks on its node (the CUDA device it takes).
  int local_rank() const { return local_rank_; }
  // Ends every rank of the job (MPI_Abort): for an error on one rank that the others, blocked in
  // a collective, would otherwise wait for forever. Does not return.
  [[noreturn]] void abort(int code) const;

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
};

inline constexpr bool kMpiBuilt = AMPSCOPE_TRAINER_MPI != 0;
inline constexpr bool kNcclBuilt = AMPSCOPE_TRAINER_NCCL != 0;

// Throw ampscope::Error when the build lacks MPI (NCCL), or on failure.
std::unique_ptr<Communicator> make_mpi_communicator(MpiRuntime& mpi);
// Makes `cuda_device` current; the CUDA back end of this rank must use the same device.
std::unique_ptr<Communicator> make_nccl_communicator(MpiRuntime& mpi, int cuda_device);

// Whether this process was started by an MPI launcher (mpirun/mpiexec of Open MPI, PMIx or
// Hydra set these variables), so that a plain run never initialises MPI.
bool launched_by_mpi();

enum class CommKind { kAuto, kSingle, kMpi, kNccl };
std::string_view comm_kind_name(CommKind kind);
// "auto", "single", "mpi", "nccl"; nullopt otherwise.
std::optional<CommKind> parse_comm_kind(std::string_view name);
// kAuto: single outside an MPI launch; under one, mpi for the CPU back end and nccl for CUDA.
// Other kinds are returned as they are.
CommKind resolve_comm_kind(CommKind requested, Device device, bool under_mpi);

}  // namespace ampscope::trainer
