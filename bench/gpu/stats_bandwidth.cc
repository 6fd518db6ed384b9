// GPU statistics bandwidth against a device-to-device copy of the same size; bench/gpu/check.sh
// runs it.
//
// For each storage type (FP32, FP16, BF16) it fills one device buffer (1 GiB by default: far
// above the 50-60 MiB L2 of an A100/H100/H200, so every pass streams from HBM) with the
// benchmarks' synthetic gradients (../gradient_data.h) and times, interleaved, on one stream
// with CUDA events:
//   - CudaStatsJob::launch (reset, statistics kernel, copy of the result, event) with the
//     targets the agent counts by default (fp16@0, e4m3@0), as the agent calls it;
//   - cudaMemcpyAsync device-to-device of the same bytes into a second buffer.
//   - the trainer's multi-tensor unscale with fused statistics (nn::unscale_check_and_measure,
//     the buffer as one gradient, its statistics collected with GradientStats::wait), and the
//     plain unscale (nn::unscale_and_check) for reference; the factor is 1, so the data stays
//     the same from one repetition to the next (the kernels do the same work for any factor).
// Bandwidths count bytes moved: the statistics read the buffer once (bytes / t); the copy and
// the unscales read and write it (2 bytes / t). gpu_stats_bandwidth_ratio is the statistics'
// bandwidth over the copy's, median times, the lowest over the three storage types (each is
// also reported); gpu_fused_unscale_bandwidth_ratio the same for the fused unscale. The copy is
// the practical HBM ceiling; 1.0 means the kernel streams its data as fast as the copy engine
// path moves it.
//
// Output: one JSON object (flat keys) on stdout, or in --out.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ampscope/cuda/check.h"
#include "ampscope/cuda/device.h"
#include "ampscope/cuda/nn_optimizer.h"
#include "ampscope/cuda/tensor_stats.h"
#include "ampscope/formats.h"
#include "gradient_data.h"

namespace {

using namespace ampscope;

struct Flags {
  double buffer_mib = 1024;
  int warmup = 3;
  int reps = 15;
  std::string out;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--mib") {
      f.buffer_mib = std::stod(value());
    } else if (a == "--reps") {
      f.reps = std::stoi(value());
    } else if (a == "--warmup") {
      f.warmup = std::stoi(value());
    } else if (a == "--out") {
      f.out = value();
    } else {
      throw std::runtime_error("unknown argument '" + a +
                               "' (--mib N --reps N --warmup N --out F)");
    }
  }
  if (!(f.buffer_mib > 0) || f.reps < 1 || f.warmup < 0) throw std::runtime_error("bad values");
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

class Events {
 public:
  Events() {
    AMPSCOPE_CHECK_CUDA(cudaEventCreate(&start_));
    AMPSCOPE_CHECK_CUDA(cudaEventCreate(&stop_));
  }
  ~Events() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  template <class Fn>
  double seconds(cudaStream_t stream, const Fn& fn) {
    AMPSCOPE_CHECK_CUDA(cudaEventRecord(start_, stream));
    fn();
    AMPSCOPE_CHECK_CUDA(cudaEventRecord(stop_, stream));
    AMPSCOPE_CHECK_CUDA(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    AMPSCOPE_CHECK_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

int run(const Flags& flags) {
  if (!cuda::cuda_device_available()) {
    std::fprintf(stderr, "stats_bandwidth: no CUDA driver or device on this machine\n");
    return 2;
  }
  int device = 0;
  AMPSCOPE_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  AMPSCOPE_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const auto bytes = static_cast<std::size_t>(flags.buffer_mib * 1024 * 1024) / 16 * 16;
  cudaStream_t stream = nullptr;
  AMPSCOPE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void *src = nullptr, *dst = nullptr;
  AMPSCOPE_CHECK_CUDA(cudaMalloc(&src, bytes));
  AMPSCOPE_CHECK_CUDA(cudaMalloc(&dst, bytes));
  std::vector<unsigned char> host(bytes);
  const std::vector<TargetSpec> targets = {{Format::kFP16, 0}, {Format::kE4M3, 0}};
  cuda::CudaStatsJob job(static_cast<int>(targets.size()));
  cuda::nn::GradientStats grad_stats(1);
  float* found_inf = nullptr;
  AMPSCOPE_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&found_inf), sizeof(float)));
  AMPSCOPE_CHECK_CUDA(cudaMemset(found_inf, 0, sizeof(float)));
  Events events;

  std::ostringstream json;
  json.setf(std::ios::fixed);
  json.precision(4);
  json << "{\"gpu_name\": \"" << prop.name << "\", \"gpu_sm\": " << prop.major * 10 + prop.minor
       << ", \"gpu_stats_buffer_mib\": " << flags.buffer_mib
       << ", \"gpu_stats_targets\": \"fp16@0,e4m3@0\", \"gpu_stats_reps\": " << flags.reps;
  double worst = 1e30, worst_fused = 1e30;
  for (Format f : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    const std::size_t n = bytes / static_cast<std::size_t>(storage_bytes(f));
    bench::fill_gradients(host.data(), n, f, bench::GradientSpec{}, 8);
    AMPSCOPE_CHECK_CUDA(cudaMemcpy(src, host.data(), bytes, cudaMemcpyHostToDevice));
    std::vector<double> stats_s, copy_s, fused_s, unscale_s;
    std::uint64_t checksum = 0;
    const cuda::nn::GradientTensor measured[] = {{src, f, static_cast<std::int64_t>(n), 0}};
    const cuda::nn::GradientTensor plain[] = {{src, f, static_cast<std::int64_t>(n)}};
    for (int round = 0; round < flags.warmup + flags.reps; ++round) {
      const double ts = events.seconds(stream, [&] { job.launch(src, n, f, targets, stream); });
      checksum += job.wait().numel;
      const double tc = events.seconds(stream, [&] {
        AMPSCOPE_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      });
      const double tf = events.seconds(stream, [&] {
        cuda::nn::unscale_check_and_measure(measured, 1.0f, found_inf, targets, grad_stats,
                                            stream);
      });
      checksum += grad_stats.wait().at(0).numel;
      const double tu = events.seconds(stream, [&] {
        cuda::nn::unscale_and_check(plain, 1.0f, found_inf, stream);
      });
      if (round >= flags.warmup) {
        stats_s.push_back(ts);
        copy_s.push_back(tc);
        fused_s.push_back(tf);
        unscale_s.push_back(tu);
      }
    }
    if (checksum != 2 * static_cast<std::uint64_t>(n) * (flags.warmup + flags.reps)) {
      throw std::runtime_error("statistics saw the wrong element count");
    }
    const double stats_gbs = static_cast<double>(bytes) / median(stats_s) / 1e9;
    const double copy_gbs = 2.0 * static_cast<double>(bytes) / median(copy_s) / 1e9;
    const double fused_gbs = 2.0 * static_cast<double>(bytes) / median(fused_s) / 1e9;
    const double unscale_gbs = 2.0 * static_cast<double>(bytes) / median(unscale_s) / 1e9;
    const double ratio = stats_gbs / copy_gbs;
    const double fused_ratio = fused_gbs / copy_gbs;
    worst = std::min(worst, ratio);
    worst_fused = std::min(worst_fused, fused_ratio);
    const std::string name(format_name(f));
    std::fprintf(stderr,
                 "stats_bandwidth: %-4s stats %8.1f GB/s  d2d copy %8.1f GB/s  ratio %.3f  "
                 "fused unscale+stats %8.1f GB/s  ratio %.3f  plain unscale %8.1f GB/s\n",
                 name.c_str(), stats_gbs, copy_gbs, ratio, fused_gbs, fused_ratio, unscale_gbs);
    json << ", \"gpu_stats_" << name << "_gbs\": " << stats_gbs << ", \"gpu_copy_" << name
         << "_gbs\": " << copy_gbs << ", \"gpu_stats_bandwidth_ratio_" << name << "\": " << ratio
         << ", \"gpu_fused_unscale_" << name << "_gbs\": " << fused_gbs
         << ", \"gpu_unscale_" << name << "_gbs\": " << unscale_gbs
         << ", \"gpu_fused_unscale_bandwidth_ratio_" << name << "\": " << fused_ratio;
  }
  json << ", \"gpu_stats_bandwidth_ratio\": " << worst
       << ", \"gpu_fused_unscale_bandwidth_ratio\": " << worst_fused << "}";
  AMPSCOPE_CHECK_CUDA(cudaFree(found_inf));
  AMPSCOPE_CHECK_CUDA(cudaFree(src));
  AMPSCOPE_CHECK_CUDA(cudaFree(dst));
  AMPSCOPE_CHECK_CUDA(cudaStreamDestroy(stream));
  if (flags.out.empty()) {
    std::cout << json.str() << "\n";
  } else {
    std::ofstream(flags.out) << json.str() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stats_bandwidth: error: %s\n", e.what());
    return 1;
  }
}
