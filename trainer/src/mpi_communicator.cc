// MPI's lifetime (MpiRuntime) and the MPI communicator: host memory, MPI_COMM_WORLD duplicated
// so that no other MPI user of the process can match our messages.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "ampscope/check.h"
#include "ampscope/trainer/communicator.h"

namespace ampscope::trainer {
namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string(what) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

// MPI counts are int: large arrays go in chunks.
template <typename T, typename F>
void in_chunks(T* data, std::size_t count, F&& op) {
  constexpr std::size_t kChunk = INT_MAX / 2;
  for (std::size_t at = 0; at < count; at += kChunk) {
    op(data + at, static_cast<int>(std::min(kChunk, count - at)));
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiCommunicator() override { (void)MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  bool supports(Device device) const override { return device == Device::kCpu; }

  void all_reduce_sum(const Tensor& x, Stream&) override {
    AMPSCOPE_CHECK(x.dtype == Format::kFP32, "all_reduce_sum takes FP32 tensors");
    AMPSCOPE_CHECK(x.device == Device::kCpu, "the MPI communicator takes host memory");
    in_chunks(static_cast<float*>(x.data), static_cast<std::size_t>(x.numel()),
              [this](float* p, int n) {
                check_mpi(MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, comm_),
                          "MPI_Allreduce");
              });
  }
  void all_reduce_max(std::span<double> values) override {
    in_chunks(values.data(), values.size(), [this](double* p, int n) {
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_DOUBLE, MPI_MAX, comm_), "MPI_Allreduce");
    });
  }
  void broadcast(std::span<std::byte> data, int root) override {
    in_chunks(data.data(), data.size(), [this, root](std::byte* p, int n) {
      check_mpi(MPI_Bcast(p, n, MPI_BYTE, root, comm_), "MPI_Bcast");
    });
  }
  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  AMPSCOPE_CHECK(!initialized, "MPI is already initialised: create one MpiRuntime per process");
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  // Errors come back as codes (check_mpi throws) instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_,
                                MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank");
  MPI_Comm_free(&node);
}

MpiRuntime::~MpiRuntime() { MPI_Finalize(); }

void MpiRuntime::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this tells the compiler so
}

std::unique_ptr<Communicator> make_mpi_communicator(MpiRuntime&) {
  return std::make_unique<MpiCommunicator>();
}

}  // namespace ampscope::trainer
