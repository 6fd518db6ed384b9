// Device conversions against the CPU reference (encode/decode): every FP16/BF16/FP8 bit pattern
// to FP32, and the rounding probes of conversion_cases.h from FP32, in both overflow modes and
// for every memory layout the launchers distinguish (aligned groups, element-aligned views,
// byte-misaligned views). Bit-exact except NaN results, compared by NaN-ness (convert.h).
#include "ampscope/cuda/convert.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "ampscope/check.h"
#include "conversion_cases.h"
#include "cuda_test_util.h"

namespace ampscope::cuda::testing {
namespace {

// Byte offsets of the source and destination views inside their buffers.
struct Layout {
  const char* name;
  std::size_t src_offset_elements;
  std::size_t dst_offset_elements;
  std::size_t extra_bytes;  // added to both offsets
};
void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

constexpr Layout kLayouts[] = {
    {"aligned", 0, 0, 0},
    {"element_offset", 1, 1, 0},
    {"mixed_offset", 0, 3, 0},
    {"byte_offset", 0, 0, 1},
};

std::size_t bytes_of(Format f) { return static_cast<std::size_t>(storage_bytes(f)); }

// Runs convert_from_fp32 on the device over `input` laid out as `layout`; returns the narrow
// results as bit patterns.
std::vector<std::uint32_t> device_from_fp32(const std::vector<float>& input, Format f,
                                            OverflowMode mode, const Layout& layout) {
  const std::size_t n = input.size();
  const std::size_t src_off = layout.src_offset_elements * 4 + layout.extra_bytes;
  const std::size_t dst_off = layout.dst_offset_elements * bytes_of(f) + layout.extra_bytes;
  DeviceBuffer src(n * 4), dst(n * bytes_of(f));
  src.upload(src_off, input.data(), n * 4);
  Stream stream;
  convert_from_fp32(reinterpret_cast<const float*>(src.at(src_off)), dst.at(dst_off), n, f, mode,
                    stream.get());
  stream.synchronize();
  const std::vector<unsigned char> raw = dst.download<unsigned char>(dst_off, n * bytes_of(f));
  std::vector<std::uint32_t> out(n, 0);
  for (std::size_t i = 0; i < n; ++i) std::memcpy(&out[i], &raw[i * bytes_of(f)], bytes_of(f));
  return out;
}

std::vector<float> device_to_fp32(const std::vector<std::uint32_t>& patterns, Format f,
                                  const Layout& layout) {
  const std::size_t n = patterns.size();
  std::vector<unsigned char> raw(n * bytes_of(f));
  for (std::size_t i = 0; i < n; ++i) std::memcpy(&raw[i * bytes_of(f)], &patterns[i], bytes_of(f));
  const std::size_t src_off = layout.src_offset_elements * bytes_of(f) + layout.extra_bytes;
  const std::size_t dst_off = layout.dst_offset_elements * 4 + layout.extra_bytes;
  DeviceBuffer src(raw.size()), dst(n * 4);
  src.upload(src_off, raw.data(), raw.size());
  Stream stream;
  convert_to_fp32(src.at(src_off), reinterpret_cast<float*>(dst.at(dst_off)), n, f, stream.get());
  stream.synchronize();
  return dst.download<float>(dst_off, n);
}

using ConvertParam = std::tuple<Format, Layout>;

class CudaConvertTest : public DeviceTest<::testing::TestWithParam<ConvertParam>> {};

TEST_P(CudaConvertTest, FromFp32MatchesReferenceInBothModes) {
  const auto& [f, layout] = GetParam();
  const std::vector<float> probes = conversion_probes(f);
  for (OverflowMode mode : {OverflowMode::kNonSaturating, OverflowMode::kSaturating}) {
    const std::vector<std::uint32_t> got = device_from_fp32(probes, f, mode, layout);
    int failures = 0;
    for (std::size_t i = 0; i < probes.size() && failures < 10; ++i) {
      const auto result = same_narrow(got[i], encode(probes[i], f, mode), probes[i], f);
      EXPECT_TRUE(result) << "mode " << static_cast<int>(mode) << ", element " << i;
      failures += !result;
    }
  }
}

TEST_P(CudaConvertTest, ToFp32MatchesReferenceForEveryPattern) {
  const auto& [f, layout] = GetParam();
  std::vector<std::uint32_t> patterns(decode_patterns(f));
  for (std::size_t b = 0; b < patterns.size(); ++b) patterns[b] = static_cast<std::uint32_t>(b);
  const std::vector<float> got = device_to_fp32(patterns, f, layout);
  for (std::size_t b = 0; b < patterns.size(); ++b) {
    ASSERT_TRUE(same_wide(got[b], patterns[b], f));
  }
}

// Sizes around the group width and the grid: the tail of the grouped path and the grid-stride
// loop must cover every element exactly once.
TEST_P(CudaConvertTest, EveryElementIsWrittenForAwkwardSizes) {
  const auto& [f, layout] = GetParam();
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{5}, std::size_t{31},
                        std::size_t{1023}, std::size_t{65537}, (std::size_t{1} << 20) + 3}) {
    SCOPED_TRACE(n);
    std::vector<float> input(n);
    for (std::size_t i = 0; i < n; ++i) input[i] = static_cast<float>(i % 97) * 0.37f - 11.0f;
    const std::vector<std::uint32_t> got =
        device_from_fp32(input, f, OverflowMode::kNonSaturating, layout);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], encode(input[i], f)) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsAndLayouts, CudaConvertTest,
                         ::testing::Combine(::testing::ValuesIn(kNarrowFormats),
                                            ::testing::ValuesIn(kLayouts)),
                         [](const auto& info) {
                           return std::string(format_name(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param).name;
                         });

class CudaConvertApiTest : public DeviceTest<> {};

TEST_F(CudaConvertApiTest, ZeroElementsEnqueueNothing) {
  Stream stream;
  EXPECT_NO_THROW(convert_from_fp32(nullptr, nullptr, 0, Format::kFP16,
                                    OverflowMode::kNonSaturating, stream.get()));
  EXPECT_NO_THROW(convert_to_fp32(nullptr, nullptr, 0, Format::kE4M3, stream.get()));
}

TEST_F(CudaConvertApiTest, Fp32ToFp32IsACopy) {
  const std::vector<float> input = {1.0f, -0.0f, from_bits(0x7FC12345u), 3e-45f};
  DeviceBuffer src(16), dst(16);
  src.upload(0, input.data(), 16);
  Stream stream;
  convert_from_fp32(reinterpret_cast<const float*>(src.at(0)), dst.at(0), 4, Format::kFP32,
                    OverflowMode::kSaturating, stream.get());
  stream.synchronize();
  const std::vector<float> out = dst.download<float>(0, 4);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(to_bits(out[i]), to_bits(input[i]));
}

TEST_F(CudaConvertApiTest, RejectsPageableHostMemory) {
  std::vector<float> host(8, 1.0f);
  DeviceBuffer dst(16);
  Stream stream;
  EXPECT_THROW(convert_from_fp32(host.data(), dst.at(0), 8, Format::kFP16,
                                 OverflowMode::kNonSaturating, stream.get()),
               Error);
  EXPECT_THROW(convert_to_fp32(dst.at(0), host.data(), 8, Format::kFP16, stream.get()), Error);
}

TEST_F(CudaConvertApiTest, RejectsOverlappingBuffers) {
  DeviceBuffer buffer(64);
  Stream stream;
  EXPECT_THROW(convert_from_fp32(reinterpret_cast<const float*>(buffer.at(0)), buffer.at(8), 8,
                                 Format::kFP16, OverflowMode::kNonSaturating, stream.get()),
               Error);
}

TEST_F(CudaConvertApiTest, RejectsNullAndUnknownFormat) {
  DeviceBuffer buffer(64);
  Stream stream;
  EXPECT_THROW(convert_to_fp32(nullptr, reinterpret_cast<float*>(buffer.at(0)), 4, Format::kBF16,
                               stream.get()),
               Error);
  EXPECT_THROW(convert_to_fp32(buffer.at(0), reinterpret_cast<float*>(buffer.at(32)), 4,
                               static_cast<Format>(17), stream.get()),
               Error);
}

}  // namespace
}  // namespace ampscope::cuda::testing
