// Device tensor statistics against compute_stats_reference, parameterised over storage dtype x
// shape (sizes around warp, block, vector and grid boundaries, primes, and views that are
// element- or byte-misaligned), plus special values and the job's API contract.
//
// Tolerances: counts, the histogram, target counts, max_abs, min_abs_nonzero and sum are exact
// (the device's sum is exactly rounded, as the reference's); sum_sq within 8 ulps (the
// device's is exactly rounded, the reference's within a few ulps).
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/cuda/tensor_stats.h"
#include "cuda_test_util.h"
#include "../expect_same_stats.h"

namespace ampscope::cuda::testing {
namespace {

const std::vector<TargetSpec>& eight_targets() {
  // Every format family, FP6/FP4 (saturating, no Inf or NaN) included, at several scales.
  static const std::vector<TargetSpec> targets = {
      {Format::kFP16, 0},  {Format::kE2M1, 0}, {Format::kBF16, 0},  {Format::kE4M3, 0},
      {Format::kE3M2, -4}, {Format::kE5M2, 0}, {Format::kE2M3, 10}, {Format::kFP32, -100},
  };
  return targets;
}

// A tensor in host memory as raw storage bytes.
struct HostTensor {
  Format dtype;
  std::vector<unsigned char> bytes;
  std::size_t size() const { return bytes.size() / static_cast<std::size_t>(storage_bytes(dtype)); }
};

void append(HostTensor& t, std::uint32_t storage_bits) {
  const auto width = static_cast<std::size_t>(storage_bytes(t.dtype));
  const std::size_t at = t.bytes.size();
  t.bytes.resize(at + width);
  std::memcpy(&t.bytes[at], &storage_bits, width);  // little-endian: the low bytes
}

// A mixture that reaches every branch: typical values over a wide range of scales, uniformly
// random bit patterns (every binade, subnormals, NaN and Inf), signed zeros and infinities.
HostTensor random_tensor(Format dtype, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-40, 20);
  std::uniform_int_distribution<int> kind(0, 99);
  HostTensor t{dtype, {}};
  t.bytes.reserve(n * static_cast<std::size_t>(storage_bytes(dtype)));
  const std::uint32_t mask = dtype == Format::kFP32 ? 0xFFFFFFFFu : 0xFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    const int k = kind(rng);
    if (k < 45) {
      append(t, encode(std::ldexp(normal(rng), scale(rng)), dtype));
    } else if (k < 90) {
      append(t, static_cast<std::uint32_t>(rng()) & mask);
    } else if (k < 96) {
      append(t, encode(k % 2 ? 0.0f : -0.0f, dtype));
    } else {
      append(t, encode(k % 2 ? INFINITY : -INFINITY, dtype));
    }
  }
  return t;
}

// Uploads t at `byte_offset` into a device buffer, runs a job on a fresh stream, waits.
TensorStats device_stats(const HostTensor& t, std::size_t byte_offset,
                         const std::vector<TargetSpec>& targets) {
  DeviceBuffer buffer(t.bytes.size(), byte_offset + 16);
  if (!t.bytes.empty()) buffer.upload(byte_offset, t.bytes.data(), t.bytes.size());
  Stream stream;
  CudaStatsJob job;
  job.launch(t.size() == 0 ? nullptr : buffer.at(byte_offset), t.size(), t.dtype, targets,
             stream.get());
  return job.wait();
}

// The device sums sum_sq in another order than the reference: within 16 ulps (at least the 16u
// relative it was allowed before).
void expect_device_stats(const TensorStats& got, const TensorStats& want) {
  expect_same_stats(got, want, /*sum_sq_ulps=*/16);
}

// The sum of values that cancel: exact on the device whatever the order of the blocks.
TEST(CudaStatsSumTest, CancellingValuesSumExactly) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA driver or device on this machine";
  HostTensor t{Format::kFP32, {}};
  std::vector<float> values = {3.4e38f, -3.4e38f};
  for (int i = 0; i < 100000; ++i) values.push_back(std::ldexp(1.0f + i % 7, i % 60 - 30));
  values.push_back(-3.4e38f);
  values.push_back(3.4e38f);
  for (float v : values) append(t, std::bit_cast<std::uint32_t>(v));
  const TensorStats got = device_stats(t, 0, {});
  EXPECT_EQ(got.sum, compute_stats_reference(t.bytes.data(), t.size(), t.dtype).sum);
  EXPECT_GT(got.sum, 1e9);  // the small values' sum, not lost to the large ones
}

struct Shape {
  const char* name;
  std::size_t n;
  std::size_t byte_offset;
};
void PrintTo(const Shape& shape, std::ostream* os) { *os << shape.name; }

constexpr Shape kShapes[] = {
    {"empty", 0, 0},
    {"n1", 1, 0},
    {"n7", 7, 0},
    {"n31", 31, 0},
    {"n1023", 1023, 0},
    {"n65537", 65537, 0},
    {"n1048579", (std::size_t{1} << 20) + 3, 0},
    {"n31_element_offset", 31, 4},        // element-aligned for every dtype
    {"n65537_element_offset", 65537, 6},  // element-aligned for 16-bit, not for FP32
    {"n1023_byte_offset", 1023, 1},
    {"n1048579_byte_offset", (std::size_t{1} << 20) + 3, 3},
};

using StatsParam = std::tuple<Format, Shape>;

class CudaStatsTest : public DeviceTest<::testing::TestWithParam<StatsParam>> {};

TEST_P(CudaStatsTest, MatchesReference) {
  const auto& [dtype, shape] = GetParam();
  const HostTensor t = random_tensor(dtype, shape.n, static_cast<std::uint32_t>(shape.n) + 7);
  const TensorStats want =
      compute_stats_reference(t.bytes.data(), t.size(), dtype, eight_targets());
  const TensorStats got = device_stats(t, shape.byte_offset, eight_targets());
  expect_device_stats(got, want);
}

TEST_P(CudaStatsTest, MatchesReferenceWithoutTargets) {
  const auto& [dtype, shape] = GetParam();
  const HostTensor t = random_tensor(dtype, shape.n, 99);
  const TensorStats want = compute_stats_reference(t.bytes.data(), t.size(), dtype);
  expect_device_stats(device_stats(t, shape.byte_offset, {}), want);
}

std::string stats_param_name(const ::testing::TestParamInfo<StatsParam>& info) {
  return std::string(format_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(DtypesAndShapes, CudaStatsTest,
                         ::testing::Combine(::testing::Values(Format::kFP32, Format::kFP16,
                                                              Format::kBF16),
                                            ::testing::ValuesIn(kShapes)),
                         stats_param_name);

// Special values of each storage format: zeros, infinities, NaNs, every subnormal of FP16 and
// BF16 (a stride through FP32's), the format's extremes, and for FP32 storage the values on
// both sides of every target's overflow, underflow and subnormal thresholds.
HostTensor special_tensor(Format dtype) {
  HostTensor t{dtype, {}};
  const FormatInfo& info = format_info(dtype);
  const std::uint32_t sign = 1u << (info.total_bits - 1);
  const std::uint32_t exp_ones = ((1u << info.exponent_bits) - 1) << info.mantissa_bits;
  const std::uint32_t frac_max = (1u << info.mantissa_bits) - 1;
  for (std::uint32_t s : {0u, sign}) {
    append(t, s);                                                       // zero
    append(t, s | exp_ones);                                            // Inf
    append(t, s | exp_ones | 1u);                                       // signalling NaN
    append(t, s | exp_ones | frac_max);                                 // NaN, all payload bits
    append(t, s | (exp_ones - (1u << info.mantissa_bits)) | frac_max);  // max finite
    append(t, s | (1u << info.mantissa_bits));                          // min normal
    const std::uint32_t stride = dtype == Format::kFP32 ? 4099 : 1;
    for (std::uint32_t frac = 1; frac <= frac_max; frac += stride) append(t, s | frac);
    append(t, s | frac_max);  // largest subnormal
  }
  if (dtype == Format::kFP32) {
    for (const FormatInfo& target : kFormatInfos) {
      for (int scale : {0, 12, -6, 10, -100}) {
        for (double edge :
             {target.overflow_threshold, target.max_finite, 0.5 * target.min_subnormal(),
              target.min_subnormal(), target.min_normal() - 0.5 * target.min_subnormal(),
              target.min_normal()}) {
          const float x = static_cast<float>(std::ldexp(edge, -scale));
          if (!std::isfinite(x) || x == 0.0f) continue;
          const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
          for (std::uint32_t d : {u - 1, u, u + 1}) {
            const float y = std::bit_cast<float>(d);
            if (!std::isfinite(y) || y == 0.0f) continue;  // keep the special counts fixed
            append(t, d);
            append(t, d | 0x80000000u);
          }
        }
      }
    }
  }
  return t;
}

class CudaStatsSpecialValuesTest : public DeviceTest<::testing::TestWithParam<Format>> {};

TEST_P(CudaStatsSpecialValuesTest, MatchesReference) {
  const Format dtype = GetParam();
  const HostTensor t = special_tensor(dtype);
  const TensorStats want =
      compute_stats_reference(t.bytes.data(), t.size(), dtype, eight_targets());
  for (std::size_t offset : {std::size_t{0}, std::size_t{2}, std::size_t{1}}) {
    SCOPED_TRACE(offset);
    expect_device_stats(device_stats(t, offset, eight_targets()), want);
  }
  EXPECT_EQ(want.nan, 4u);
  EXPECT_EQ(want.pos_inf, 1u);
  EXPECT_EQ(want.neg_inf, 1u);
  EXPECT_EQ(want.zeros, 2u);
}

// All values in one binade and one sign: every lane of every warp hits the same histogram bin,
// the worst case for the shared-memory histogram.
TEST_P(CudaStatsSpecialValuesTest, ConstantTensor) {
  const Format dtype = GetParam();
  HostTensor t{dtype, {}};
  for (int i = 0; i < 300000; ++i) append(t, encode(1.5f, dtype));
  const TensorStats got = device_stats(t, 0, eight_targets());
  expect_device_stats(got,
                      compute_stats_reference(t.bytes.data(), t.size(), dtype, eight_targets()));
  EXPECT_EQ(got.histogram.count_at(0), 300000u);
  EXPECT_EQ(got.sum, 450000.0);  // exact: every partial sum is a small multiple of 0.5
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaStatsSpecialValuesTest,
                         ::testing::Values(Format::kFP32, Format::kFP16, Format::kBF16),
                         [](const auto& info) { return std::string(format_name(info.param)); });

class CudaStatsJobTest : public DeviceTest<> {};

TEST_F(CudaStatsJobTest, RejectsBadArgumentsBeforeEnqueueing) {
  DeviceBuffer buffer(1024);
  Stream stream;
  CudaStatsJob job(2);
  const std::vector<TargetSpec> three(3);
  EXPECT_THROW(job.launch(buffer.at(0), 16, Format::kFP32, three, stream.get()), Error);
  EXPECT_THROW(job.launch(buffer.at(0), 16, Format::kE4M3, {}, stream.get()), Error);
  const std::vector<TargetSpec> bad_scale = {{Format::kFP16, kMaxScaleLog2 + 1}};
  EXPECT_THROW(job.launch(buffer.at(0), 16, Format::kFP32, bad_scale, stream.get()), Error);
  std::vector<float> host(16, 1.0f);
  EXPECT_THROW(job.launch(host.data(), 16, Format::kFP32, {}, stream.get()), Error);
  EXPECT_THROW(job.launch(nullptr, 16, Format::kFP32, {}, stream.get()), Error);
  EXPECT_FALSE(job.ready());
  EXPECT_THROW(job.wait(), Error);  // nothing was enqueued
}

TEST_F(CudaStatsJobTest, SupportsExactlyTheMaximumTargets) {
  EXPECT_THROW(CudaStatsJob(kCudaStatsMaxTargets + 1), Error);
  EXPECT_THROW(CudaStatsJob(-1), Error);
  CudaStatsJob job;
  EXPECT_EQ(job.max_targets(), kCudaStatsMaxTargets);
  std::vector<TargetSpec> nine = eight_targets();
  nine.push_back({Format::kFP16, 1});
  DeviceBuffer buffer(64);
  Stream stream;
  EXPECT_THROW(job.launch(buffer.at(0), 16, Format::kFP32, nine, stream.get()), Error);
}

TEST_F(CudaStatsJobTest, OneResultInFlightAtATime) {
  DeviceBuffer buffer(64);
  Stream stream;
  CudaStatsJob job;
  job.launch(buffer.at(0), 16, Format::kFP32, {}, stream.get());
  EXPECT_THROW(job.launch(buffer.at(0), 16, Format::kFP32, {}, stream.get()), Error);
  EXPECT_EQ(job.wait().zeros, 16u);
  EXPECT_FALSE(job.ready());
  EXPECT_THROW(job.wait(), Error);
}

TEST_F(CudaStatsJobTest, IsReusableAndResetsBetweenLaunches) {
  const HostTensor a = random_tensor(Format::kBF16, 5000, 1);
  const HostTensor b = random_tensor(Format::kBF16, 777, 2);
  DeviceBuffer da(a.bytes.size()), db(b.bytes.size());
  da.upload(0, a.bytes.data(), a.bytes.size());
  db.upload(0, b.bytes.data(), b.bytes.size());
  Stream stream;
  CudaStatsJob job;
  for (int round = 0; round < 3; ++round) {
    job.launch(da.at(0), a.size(), Format::kBF16, eight_targets(), stream.get());
    expect_device_stats(
        job.wait(),
        compute_stats_reference(a.bytes.data(), a.size(), Format::kBF16, eight_targets()));
    job.launch(db.at(0), b.size(), Format::kBF16, {}, stream.get());
    expect_device_stats(job.wait(),
                        compute_stats_reference(b.bytes.data(), b.size(), Format::kBF16));
  }
}

// The stream is held by a host function until the test releases it; launch() must return and
// leave the result pending meanwhile, i.e. it neither synchronises the stream nor waits for it.
TEST_F(CudaStatsJobTest, LaunchDoesNotWaitForTheStream) {
  struct Gate {
    std::atomic<bool> open{false};
  } gate;
  // Everything that allocates comes first: only launch() runs while the stream is held.
  DeviceBuffer buffer(4096);
  CudaStatsJob job;
  Stream stream;
  AMPSCOPE_CHECK_CUDA(cudaLaunchHostFunc(
      stream.get(),
      [](void* p) {
        auto* g = static_cast<Gate*>(p);
        // Bounded, so a launch() that wrongly waits fails the test instead of hanging it.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!g->open.load() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      },
      &gate));
  const auto start = std::chrono::steady_clock::now();
  job.launch(buffer.at(0), 1024, Format::kFP32, eight_targets(), stream.get());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_FALSE(job.ready());
  gate.open.store(true);
  EXPECT_EQ(job.wait().zeros, 1024u);
}

TEST_F(CudaStatsJobTest, JobsOnTwoStreamsAreIndependent) {
  const HostTensor a = random_tensor(Format::kFP32, 200003, 3);
  const HostTensor b = random_tensor(Format::kFP16, 100019, 4);
  DeviceBuffer da(a.bytes.size()), db(b.bytes.size());
  da.upload(0, a.bytes.data(), a.bytes.size());
  db.upload(0, b.bytes.data(), b.bytes.size());
  Stream s1, s2;
  CudaStatsJob j1, j2;
  j1.launch(da.at(0), a.size(), Format::kFP32, eight_targets(), s1.get());
  j2.launch(db.at(0), b.size(), Format::kFP16, eight_targets(), s2.get());
  const TensorStats r2 = j2.wait();
  const TensorStats r1 = j1.wait();
  expect_device_stats(
      r1, compute_stats_reference(a.bytes.data(), a.size(), Format::kFP32, eight_targets()));
  expect_device_stats(
      r2, compute_stats_reference(b.bytes.data(), b.size(), Format::kFP16, eight_targets()));
}

TEST_F(CudaStatsJobTest, MovedJobKeepsItsLaunch) {
  DeviceBuffer buffer(64);
  Stream stream;
  CudaStatsJob first;
  first.launch(buffer.at(0), 8, Format::kFP16, {}, stream.get());
  CudaStatsJob second = std::move(first);
  EXPECT_EQ(second.wait().zeros, 8u);
  EXPECT_FALSE(first.ready());  // NOLINT(bugprone-use-after-move): moved-from is valid, empty
  EXPECT_THROW(first.wait(), Error);
}

}  // namespace
}  // namespace ampscope::cuda::testing
