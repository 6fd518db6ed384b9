// The NCCL communicator: one CUDA device per rank, bootstrapped over MPI (rank 0's
// ncclUniqueId broadcast to every rank). The gradient sum is an ncclAllReduce enqueued on the
// back end's stream, so it needs no host wait; the small host maximum is staged through a device
// buffer on the same kind of stream and waited for; broadcast and barrier are MPI's.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/trainer/communicator.h"

namespace ampscope::trainer {
namespace {

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  throw Error(std::string(what) + " failed: " + ncclGetErrorString(rc));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MpiRuntime& mpi, int cuda_device) : host_(make_mpi_communicator(mpi)) {
    AMPSCOPE_CHECK_CUDA(cudaSetDevice(cuda_device));
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (host_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host_->broadcast(std::as_writable_bytes(std::span(&id, 1)), 0);
    check_nccl(ncclCommInitRank(&comm_, host_->size(), id, host_->rank()), "ncclCommInitRank");
    AMPSCOPE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    if (staging_ != nullptr) (void)cudaFree(staging_);
    (void)cudaStreamDestroy(stream_);
    (void)ncclCommDestroy(comm_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return "nccl"; }
  bool supports(Device device) const override { return device == Device::kCuda; }

  void all_reduce_sum(const Tensor& x, Stream& stream) override {
    AMPSCOPE_CHECK(x.dtype == Format::kFP32, "all_reduce_sum takes FP32 tensors");
    AMPSCOPE_CHECK(x.device == Device::kCuda, "the NCCL communicator takes device memory");
    auto* s = static_cast<cudaStream_t>(stream.native_handle());
    check_nccl(ncclAllReduce(x.data, x.data, static_cast<std::size_t>(x.numel()), ncclFloat,
                             ncclSum, comm_, s),
               "ncclAllReduce");
  }
  void all_reduce_max(std::span<double> values) override {
    const std::size_t bytes = values.size_bytes();
    if (bytes > staging_bytes_) {
      if (staging_ != nullptr) AMPSCOPE_CHECK_CUDA(cudaFree(staging_));
      staging_ = nullptr;
      AMPSCOPE_CHECK_CUDA(cudaMalloc(&staging_, bytes));
      staging_bytes_ = bytes;
    }
    AMPSCOPE_CHECK_CUDA(
        cudaMemcpyAsync(staging_, values.data(), bytes, cudaMemcpyHostToDevice, stream_));
    check_nccl(ncclAllReduce(staging_, staging_, values.size(), ncclFloat64, ncclMax, comm_,
                             stream_),
               "ncclAllReduce");
    AMPSCOPE_CHECK_CUDA(
        cudaMemcpyAsync(values.data(), staging_, bytes, cudaMemcpyDeviceToHost, stream_));
    AMPSCOPE_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }
  void broadcast(std::span<std::byte> data, int root) override { host_->broadcast(data, root); }
  void barrier() override { host_->barrier(); }

 private:
  std::unique_ptr<Communicator> host_;  // MPI: bootstrap and host collectives
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the host maximum's staging copies
  void* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MpiRuntime& mpi, int cuda_device) {
  return std::make_unique<NcclCommunicator>(mpi, cuda_device);
}

}  // namespace ampscope::trainer
