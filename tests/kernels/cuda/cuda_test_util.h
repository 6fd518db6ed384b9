// Helpers for the CUDA tests: a fixture that skips when there is no device, and RAII owners for
// device buffers and streams. Everything CUDA-related runs at test time, never at build time.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "ampscope/cuda/check.h"
#include "ampscope/cuda/device.h"
#include "format_printer.h"

namespace ampscope::cuda::testing {

inline constexpr const char* kNoDeviceReason = "no CUDA driver or device on this machine";

// Base of every test that touches the device. GTEST_SKIP() in SetUp skips the test body.
template <typename Base = ::testing::Test>
class DeviceTest : public Base {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << kNoDeviceReason;
  }
};

// `bytes` of device memory plus `slack` bytes, so that views at an offset still fit.
class DeviceBuffer {
 public:
  // Zero-filled. The fill and upload() run on the legacy default stream, which the tests'
  // non-blocking streams do not wait for, so both finish before they return.
  explicit DeviceBuffer(std::size_t bytes, std::size_t slack = 16) : size_(bytes + slack) {
    AMPSCOPE_CHECK_CUDA(cudaMalloc(&data_, size_));
    AMPSCOPE_CHECK_CUDA(cudaMemset(data_, 0, size_));
    AMPSCOPE_CHECK_CUDA(cudaDeviceSynchronize());
  }
  ~DeviceBuffer() { (void)cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  unsigned char* at(std::size_t offset) { return static_cast<unsigned char*>(data_) + offset; }

  void upload(std::size_t offset, const void* host, std::size_t bytes) {
    AMPSCOPE_CHECK_CUDA(cudaMemcpy(at(offset), host, bytes, cudaMemcpyHostToDevice));
    AMPSCOPE_CHECK_CUDA(cudaDeviceSynchronize());
  }
  // Call after the stream that wrote the data has been synchronised.
  template <typename T>
  std::vector<T> download(std::size_t offset, std::size_t count) {
    std::vector<T> out(count);
    AMPSCOPE_CHECK_CUDA(
        cudaMemcpy(out.data(), at(offset), count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* data_ = nullptr;
  std::size_t size_;
};

class Stream {
 public:
  Stream() { AMPSCOPE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  void synchronize() const { AMPSCOPE_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace ampscope::cuda::testing
