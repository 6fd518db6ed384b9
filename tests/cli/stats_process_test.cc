// End to end: .npy files written here, the real `ampscope` binary run on them as a process, its
// --json output checked against compute_stats_reference on the same values, and every bad input
// checked to fail with one line on stderr and a non-zero exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "ampscope/convert.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "npy_writer.h"

#ifndef AMPSCOPE_BINARY
#error "AMPSCOPE_BINARY must name the ampscope executable"
#endif

namespace ampscope {
namespace {

using nlohmann::json;
using testing::Bytes;
using testing::CommandResult;
using testing::lines_of;
using testing::make_npy;

class StatsProcessTest : public testing::TempDirTest {
 protected:
  // Runs ampscope with `args`, stdout and stderr captured apart. A crash (signal) is reported
  // as 128 + signal, like a shell, so it never looks like success.
  CommandResult run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {AMPSCOPE_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::run_process(argv);
  }

  json run_json(const std::vector<std::string>& args) {
    std::vector<std::string> with_json = {"stats", "--json"};
    with_json.insert(with_json.end(), args.begin(), args.end());
    const CommandResult r = run(with_json);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(lines_of(r.out).size(), 1u) << "--json prints one line";
    return json::parse(r.out);
  }

  // The failure contract: non-zero exit, nothing on stdout, exactly one line on stderr that
  // starts with "ampscope: " and contains `expected`.
  void expect_one_line_failure(const std::vector<std::string>& args, const std::string& expected,
                               int exit_code = 1) {
    SCOPED_TRACE(expected);
    const CommandResult r = run(args);
    EXPECT_EQ(r.code, exit_code);
    EXPECT_EQ(r.out, "");
    const std::vector<std::string> lines = lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_TRUE(r.err.ends_with("\n"));
    EXPECT_EQ(lines[0].rfind("ampscope: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find(expected), std::string::npos) << lines[0];
  }
};

// Values spread over every binade FP32 has, with zeros, NaN, both infinities and subnormals,
// plus values right at the FP16 and E4M3 rounding thresholds so the target counts are exact
// decisions, not approximations.
std::vector<float> mixed_fp32(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> v(n);
  for (float& x : v) x = std::bit_cast<float>(bits(rng));  // NaN/Inf/subnormals included
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            65504.0f,
                            65520.0f,
                            0x1p-25f,
                            0x1.000002p-25f,
                            448.0f,
                            464.0f,
                            465.0f,
                            1.0f,
                            -3.0f};
  for (std::size_t i = 0; i < std::size(specials) && i < n; ++i) v[i * 7 % n] = specials[i];
  return v;
}

// Magnitudes like a gradient: log-normal around 2^-10, so the histogram has a real shape.
std::vector<float> gradient_like(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> log2_mag(-10.0f, 4.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(n);
  for (float& x : v) x = std::exp2(log2_mag(rng)) * (negative(rng) ? -1.0f : 1.0f);
  return v;
}

const std::vector<TargetSpec> kTargets = {{Format::kFP16, 16},
                                          {Format::kFP16, 0},
                                          {Format::kE4M3, -3},
                                          {Format::kE5M2, 8},
                                          {Format::kBF16, 0}};
const std::vector<std::string> kTargetArgs = {"--target", "fp16@16", "--target", "fp16@0",
                                              "--target", "e4m3@-3", "--target", "e5m2@8",
                                              "--target", "bf16"};

// Counts, extrema and histogram must match exactly; the sums are accumulated in another order
// by the dispatched kernel, so they match to FP64 rounding.
void expect_matches(const json& j, const TensorStats& ref) {
  EXPECT_EQ(j.at("numel").get<std::uint64_t>(), ref.numel);
  EXPECT_EQ(j.at("zeros").get<std::uint64_t>(), ref.zeros);
  EXPECT_EQ(j.at("nan").get<std::uint64_t>(), ref.nan);
  EXPECT_EQ(j.at("pos_inf").get<std::uint64_t>(), ref.pos_inf);
  EXPECT_EQ(j.at("neg_inf").get<std::uint64_t>(), ref.neg_inf);
  // Exact: extrema are values of the tensor, and the JSON doubles must round-trip.
  EXPECT_EQ(j.at("max_abs").get<double>(), ref.max_abs);
  EXPECT_EQ(j.at("min_abs_nonzero").get<double>(), ref.min_abs_nonzero);
  // Reordering a sum of n terms moves it by at most about n * eps * sum|x|, and
  // sum|x| <= sqrt(n * sum_sq); real reorderings stay far below that.
  const double n = static_cast<double>(ref.numel);
  EXPECT_NEAR(j.at("sum").get<double>(), ref.sum, 1e-10 * std::sqrt(n * ref.sum_sq));
  EXPECT_NEAR(j.at("sum_sq").get<double>(), ref.sum_sq, 1e-11 * ref.sum_sq);
  EXPECT_EQ(j.at("histogram").at("min_exponent").get<int>(), ref.histogram.min_exponent);
  EXPECT_EQ(j.at("histogram").at("counts").get<std::vector<std::uint64_t>>(), ref.histogram.counts);
  ASSERT_EQ(j.at("targets").size(), ref.targets.size());
  for (std::size_t i = 0; i < ref.targets.size(); ++i) {
    const json& t = j.at("targets")[i];
    const TargetCounts& r = ref.targets[i];
    SCOPED_TRACE(to_string(r.target));
    EXPECT_EQ(t.at("format").get<std::string>(), format_name(r.target.format));
    EXPECT_EQ(t.at("scale_log2").get<int>(), r.target.scale_log2);
    EXPECT_EQ(t.at("overflow").get<std::uint64_t>(), r.overflow);
    EXPECT_EQ(t.at("underflow").get<std::uint64_t>(), r.underflow);
    EXPECT_EQ(t.at("subnormal").get<std::uint64_t>(), r.subnormal);
  }
}

TEST_F(StatsProcessTest, JsonMatchesReferenceForFp32) {
  const std::vector<float> v = mixed_fp32(37 * 53, 1);
  const std::string path = write("fp32.npy", make_npy(v, "<f4", "(37, 53)"));
  std::vector<std::string> args = {path};
  args.insert(args.end(), kTargetArgs.begin(), kTargetArgs.end());
  const json j = run_json(args);
  EXPECT_EQ(j.at("dtype"), "fp32");
  EXPECT_EQ(j.at("shape"), json::array({37, 53}));
  expect_matches(j, compute_stats_reference(v.data(), v.size(), Format::kFP32, kTargets));
}

TEST_F(StatsProcessTest, JsonMatchesReferenceForFp16) {
  std::vector<std::uint16_t> v(4099);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint16_t>(i * 16 + i % 16);
  const std::string path = write("fp16.npy", make_npy(v, "<f2", "(4099,)"));
  std::vector<std::string> args = {path};
  args.insert(args.end(), kTargetArgs.begin(), kTargetArgs.end());
  const json j = run_json(args);
  EXPECT_EQ(j.at("dtype"), "fp16");
  expect_matches(j, compute_stats_reference(v.data(), v.size(), Format::kFP16, kTargets));
}

TEST_F(StatsProcessTest, JsonMatchesReferenceForBf16SavedAsUint16) {
  std::vector<std::uint16_t> v(65536);  // every BF16 bit pattern
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint16_t>(i);
  const std::string path = write("bf16.npy", make_npy(v, "<u2", "(256, 256)"));
  std::vector<std::string> args = {"--dtype", "bf16", path};
  args.insert(args.end(), kTargetArgs.begin(), kTargetArgs.end());
  const json j = run_json(args);
  EXPECT_EQ(j.at("dtype"), "bf16");
  expect_matches(j, compute_stats_reference(v.data(), v.size(), Format::kBF16, kTargets));
}

TEST_F(StatsProcessTest, JsonMatchesReferenceOnLargeTensor) {
  // Above compute_stats' parallel threshold, so the multi-threaded path is what runs.
  const std::vector<float> v = gradient_like((std::size_t{1} << 21) + 13, 2);
  const std::string path = write("big.npy", make_npy(v, "<f4", "(2097165,)", 2));
  std::vector<std::string> args = {path};
  args.insert(args.end(), kTargetArgs.begin(), kTargetArgs.end());
  expect_matches(run_json(args),
                 compute_stats_reference(v.data(), v.size(), Format::kFP32, kTargets));
}

TEST_F(StatsProcessTest, BigEndianFileIsSwapped) {
  const std::vector<float> v = mixed_fp32(1000, 3);
  std::vector<std::uint32_t> be;
  for (float x : v) {
    const auto w = std::bit_cast<std::uint32_t>(x);
    be.push_back(std::endian::native == std::endian::little ? __builtin_bswap32(w) : w);
  }
  const std::string path = write("be.npy", make_npy(be, ">f4", "(10, 100)", 3));
  const json j = run_json({path, "--target", "fp16@16"});
  expect_matches(j, compute_stats_reference(v.data(), v.size(), Format::kFP32,
                                            std::vector<TargetSpec>{{Format::kFP16, 16}}));
}

TEST_F(StatsProcessTest, FortranOrderGivesTheSameStatistics) {
  const std::vector<float> v = gradient_like(6 * 7, 4);
  const json c = run_json({write("c.npy", make_npy(v, "<f4", "(6, 7)"))});
  const json f = run_json({write("f.npy", make_npy(v, "<f4", "(6, 7)", 1, true))});
  EXPECT_EQ(c, f);
}

TEST_F(StatsProcessTest, ScalarAndEmptyTensors) {
  const json scalar = run_json({write("s.npy", make_npy(std::vector<float>{-0.75f}, "<f4", "()"))});
  EXPECT_EQ(scalar.at("shape"), json::array());
  EXPECT_EQ(scalar.at("numel"), 1);
  EXPECT_EQ(scalar.at("max_abs"), 0.75);
  EXPECT_EQ(scalar.at("histogram").at("counts"), json::array({1}));
  const json empty = run_json({write("e.npy", make_npy(std::vector<float>{}, "<f4", "(0,)"))});
  EXPECT_EQ(empty.at("shape"), json::array({0}));
  EXPECT_EQ(empty.at("numel"), 0);
  EXPECT_EQ(empty.at("histogram").at("counts"), json::array());
  EXPECT_EQ(empty.at("targets"), json::array());
}

TEST_F(StatsProcessTest, JsonDoublesRoundTrip) {
  // 0.1f and its neighbours need 17 significant digits as doubles.
  const std::vector<float> v = {0.1f, std::nextafter(0.1f, 1.0f), 1.0f / 3.0f, 0x1p-149f};
  const json j = run_json({write("rt.npy", make_npy(v, "<f4", "(4,)"))});
  EXPECT_EQ(j.at("max_abs").get<double>(), static_cast<double>(1.0f / 3.0f));
  EXPECT_EQ(j.at("min_abs_nonzero").get<double>(), 0x1p-149);
  const TensorStats ref = compute_stats_reference(v.data(), v.size(), Format::kFP32);
  EXPECT_EQ(j.at("sum_sq").get<double>(), ref.sum_sq);
}

TEST_F(StatsProcessTest, ReadableReportShowsCountsHistogramAndTargets) {
  std::vector<float> v = gradient_like(10000, 5);
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = 0.0f;
  v[2] = 1e6f;  // overflows fp16@16 and everything narrower
  const std::string path = write("r.npy", make_npy(v, "<f4", "(100, 100)"));
  const CommandResult r = run({"stats", path, "--target", "fp16@16"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.rfind(path + ": fp32 ('<f4'), shape (100, 100)\n", 0), 0u) << r.out;
  for (const char* needle :
       {"  elements                  10000\n", "  NaN                           1  0.01%\n",
        "  zeros                         1  0.01%\n", "max |x|", "dynamic range", "mean", "RMS",
        "binade histogram", " fp16 bf16 e4m3 e5m2",
        "     19               1    0.01%    X    N"
        "    X    X  |#\n",
        "targets: x * 2^k", "  fp16@16  "}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << "missing '" << needle << "' in\n" << r.out;
  }
}

// Recipes beside FORMAT@K targets: the JSON carries every RecipeCounts field, equal to what
// recipe_counts gives in process for the same values and row length (the last dimension).
TEST_F(StatsProcessTest, JsonRecipesMatchRecipeCounts) {
  std::vector<float> v = gradient_like(6 * 100, 9);
  v[7] = 480.0f;  // saturates its MXFP8 E4M3 block (floor scale 2^0)
  v[150] = std::numeric_limits<float>::quiet_NaN();
  const std::string path = write("rc.npy", make_npy(v, "<f4", "(2, 3, 100)"));
  const std::vector<std::string> recipes = {
      "mxfp8_e4m3",      "nvfp4",           "e4m3:current:margin=1",
      "e5m2:scale=1024", "e4m3:tile=1x128", "mxfp4:ceil"};
  std::vector<std::string> args = {path, "--target", "fp16@16"};
  for (const std::string& r : recipes) {
    args.push_back("--target");
    args.push_back(r);
  }
  const json j = run_json(args);
  ASSERT_EQ(j.at("targets").size(), 1u);
  ASSERT_EQ(j.at("recipes").size(), recipes.size());
  for (std::size_t i = 0; i < recipes.size(); ++i) {
    SCOPED_TRACE(recipes[i]);
    const json& got = j.at("recipes")[i];
    const RecipeCounts c =
        recipe_counts(v.data(), v.size(), Format::kFP32, 100, *parse_recipe(recipes[i]));
    EXPECT_EQ(got.at("recipe"), recipes[i]);
    EXPECT_EQ(got.at("element"), std::string(format_name(c.recipe.element)));
    for (const auto& [key, value] : std::vector<std::pair<const char*, std::uint64_t>>{
             {"values", c.values},
             {"nonfinite", c.nonfinite},
             {"underflow", c.underflow},
             {"subnormal", c.subnormal},
             {"saturated", c.saturated},
             {"overflow", c.overflow},
             {"blocks", c.blocks},
             {"zero_blocks", c.zero_blocks},
             {"saturated_blocks", c.saturated_blocks},
             {"nan_blocks", c.nan_blocks}}) {
      EXPECT_EQ(got.at(key).get<std::uint64_t>(), value) << key;
    }
    EXPECT_EQ(got.at("amax").get<double>(), c.amax);
    EXPECT_EQ(got.at("signal_sq").get<double>(), c.signal_sq);
    EXPECT_EQ(got.at("error_sq").get<double>(), c.error_sq);
    EXPECT_EQ(got.at("sqnr_db").get<double>(), c.sqnr_db());
    EXPECT_EQ(got.at("tensor_scale").get<double>(), c.tensor_scale);
    EXPECT_EQ(got.at("scale_histogram").at("min_exponent").get<int>(),
              c.scale_histogram.min_exponent);
    EXPECT_EQ(got.at("scale_histogram").at("counts").get<std::vector<std::uint64_t>>(),
              c.scale_histogram.counts);
  }
  // At least the 480 (other blocks saturate too when their amax sits just below a power of two).
  EXPECT_GE(j.at("recipes")[0].at("saturated").get<std::uint64_t>(), 1u);
  EXPECT_EQ(j.at("recipes")[0].at("nan_blocks").get<std::uint64_t>(), 1u);
  EXPECT_EQ(j.at("recipes")[0].at("scale_rounding"), "floor");
  EXPECT_EQ(j.at("recipes")[2].at("margin"), 1);
}

// FP16 files go through the same recipe code, converted to FP32.
TEST_F(StatsProcessTest, JsonRecipesOnFp16) {
  const std::vector<float> v = gradient_like(4 * 64, 10);
  std::vector<std::uint16_t> h(v.size());
  std::vector<float> widened(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    h[i] = fp32_to_fp16(v[i]);
    widened[i] = fp16_to_fp32(h[i]);
  }
  const json j = run_json({write("h.npy", make_npy(h, "<f2", "(4, 64)")), "--target", "mxfp4"});
  const RecipeCounts c =
      recipe_counts(widened.data(), v.size(), Format::kFP32, 64, *parse_recipe("mxfp4"));
  EXPECT_EQ(j.at("recipes")[0].at("underflow").get<std::uint64_t>(), c.underflow);
  EXPECT_EQ(j.at("recipes")[0].at("error_sq").get<double>(), c.error_sq);
  EXPECT_EQ(j.at("recipes")[0].at("blocks").get<std::uint64_t>(), 8u);
}

// FP8 bits saved as uint8 and read with --dtype e4m3: the recipes see the decoded values.
TEST_F(StatsProcessTest, JsonRecipesOnE4M3Bits) {
  std::vector<std::uint8_t> bits(2 * 32);
  std::vector<float> decoded(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    const auto b = static_cast<std::uint8_t>((i * 37) % 256);  // codes spread over all 256
    bits[i] = (b & 0x7F) == 0x7F ? 0 : b;                      // S.1111.111 is NaN: none here
    decoded[i] = e4m3_to_fp32(bits[i]);
  }
  const json j = run_json({write("e.npy", make_npy(bits, "|u1", "(2, 32)")), "--dtype", "e4m3",
                           "--target", "mxfp4", "--target", "e5m2:current"});
  for (std::size_t i = 0; i < 2; ++i) {
    const json& got = j.at("recipes")[i];
    const RecipeCounts c = recipe_counts(decoded.data(), decoded.size(), Format::kFP32, 32,
                                         *parse_recipe(got.at("recipe").get<std::string>()));
    EXPECT_EQ(got.at("values").get<std::uint64_t>(), 64u);
    EXPECT_EQ(got.at("underflow").get<std::uint64_t>(), c.underflow);
    EXPECT_EQ(got.at("saturated").get<std::uint64_t>(), c.saturated);
    EXPECT_EQ(got.at("error_sq").get<double>(), c.error_sq);
  }
}

TEST_F(StatsProcessTest, ReadableReportShowsRecipes) {
  std::vector<float> v(2 * 64, 1.0f);
  v[0] = 480.0f;  // block 0: X = 2^0, 480 saturates to 448
  const std::string path = write("rr.npy", make_npy(v, "<f4", "(2, 64)"));
  const CommandResult r =
      run({"stats", path, "--target", "mxfp8_e4m3", "--target", "e4m3:current:margin=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* needle :
       {"recipes: x scaled, rounded to nearest even", "SQNR dB\n",
        "  mxfp8_e4m3                    0      0%          0      0%          1   0.78%         0",
        "    4 blocks (0 zero, 1 with a saturated value, 0 NaN); scales 2^-8 .. 2^0: -8:3 0:1\n",
        "  e4m3:current:margin=1\n", "    scale 0.4666667 (= 2^-1.10), amax 480\n"}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << "missing '" << needle << "' in\n" << r.out;
  }
  for (const std::string& line : lines_of(r.out)) EXPECT_LE(line.size(), 100u) << line;
}

TEST_F(StatsProcessTest, BadRecipesFailWithOneLine) {
  const std::string f4 = write("b.npy", make_npy(std::vector<float>{1, 2, 3, 4}, "<f4", "(2, 2)"));
  expect_one_line_failure({"stats", f4, "--target", "mxfp8_e4m3:block=0x32"},
                          "--target 'mxfp8_e4m3:block=0x32': block must be ROWSxCOLS with each "
                          "from 1 to 65536 (found '0x32')",
                          2);
  expect_one_line_failure({"stats", f4, "--target", "mxfp7"}, "unknown recipe 'mxfp7'", 2);
  expect_one_line_failure({"stats", f4, "--target", "e4m3:current:scale=2"},
                          "give one of current, scale=S and tile=RxC, once", 2);
  const std::string fortran =
      write("f.npy", make_npy(std::vector<float>{1, 2, 3, 4}, "<f4", "(2, 2)", 1, true));
  expect_one_line_failure({"stats", fortran, "--target", "nvfp4"},
                          "Fortran-order array of shape (2, 2): block recipes read blocks along "
                          "the last dimension",
                          1);
  // Per-tensor recipes do not care about the order.
  EXPECT_EQ(run_json({fortran, "--target", "e4m3:current"}).at("recipes")[0].at("values"), 4);
}

TEST_F(StatsProcessTest, HelpListsTheStatsSubcommand) {
  const CommandResult r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("stats"), std::string::npos);
  const CommandResult sub = run({"stats", "--help"});
  EXPECT_EQ(sub.code, 0);
  EXPECT_NE(sub.out.find("--target"), std::string::npos);
  for (const char* recipe : {"mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "nvfp4", ":ceil", ":block=RxC",
                             "ELEMENT:current[:margin=M]", "ELEMENT:scale=S", "ELEMENT:tile=RxC"}) {
    EXPECT_NE(sub.out.find(recipe), std::string::npos) << recipe;
  }
}

// ---- Bad inputs: one line on stderr, non-zero exit -------------------------------------------

TEST_F(StatsProcessTest, TruncatedDataNamesFileAndSizes) {
  Bytes file = make_npy(std::vector<float>(1000, 1.0f), "<f4", "(1000,)");
  file.resize(file.size() - 4);
  const std::string path = write("x.npy", file);
  expect_one_line_failure(
      {"stats", path},
      path + ": truncated data: header says 1000 elements (4000 bytes), file has 3996");
}

TEST_F(StatsProcessTest, MalformedFilesFailWithOneLine) {
  const std::vector<float> one = {1.0f};
  Bytes bad_magic = make_npy(one, "<f4", "(1,)");
  bad_magic[0] = std::byte{'P'};
  Bytes trailing = make_npy(one, "<f4", "(1,)");
  trailing.push_back(std::byte{0});
  Bytes short_header = make_npy(one, "<f4", "(1,)");
  short_header.resize(30);
  const std::pair<std::string, Bytes> cases[] = {
      {"not a .npy file (bad magic", bad_magic},
      {"trailing data", trailing},
      {"truncated header", short_header},
      {"header has no 'shape'",
       testing::concat(testing::npy_preamble_and_header("{'descr': '<f4', 'fortran_order': False}"),
                       testing::as_bytes(one))},
      {"empty file", {}},
  };
  int i = 0;
  for (const auto& [expected, bytes] : cases) {
    const std::string path = write("bad" + std::to_string(i++) + ".npy", bytes);
    expect_one_line_failure({"stats", path}, path + ": " + expected);
  }
}

TEST_F(StatsProcessTest, UnsupportedDtypesFailWithOneLine) {
  const std::string f8 = write("f8.npy", make_npy(std::vector<double>{1.0}, "<f8", "(1,)"));
  expect_one_line_failure({"stats", f8}, f8 + ": unsupported dtype '<f8' (float64)");
  const std::string i4 = write("i4.npy", make_npy(std::vector<std::int32_t>{1}, "<i4", "(1,)"));
  expect_one_line_failure({"stats", i4}, i4 + ": unsupported dtype '<i4' (int32)");
  const std::string obj = write("o.npy", make_npy(std::vector<std::uint64_t>{0}, "|O", "(1,)"));
  expect_one_line_failure({"stats", obj}, obj + ": unsupported dtype '|O' (object arrays");
  const std::string u2 = write("u2.npy", make_npy(std::vector<std::uint16_t>{1}, "<u2", "(1,)"));
  expect_one_line_failure({"stats", u2}, u2 + ": dtype '<u2' (uint16) holds raw 16-bit words");
  const std::string f4 = write("f4.npy", make_npy(std::vector<float>{1.0f}, "<f4", "(1,)"));
  expect_one_line_failure({"stats", "--dtype", "bf16", f4}, f4 + ": --dtype bf16 reads 2-byte");
}

TEST_F(StatsProcessTest, MissingFileAndDirectoryFailWithOneLine) {
  const std::string missing = (dir_ / "missing.npy").string();
  expect_one_line_failure({"stats", missing}, missing + ": cannot open: No such file or directory");
  expect_one_line_failure({"stats", dir_.string()}, dir_.string() + ": is a directory");
}

TEST_F(StatsProcessTest, BadCommandLinesExitWithUsageCode) {
  const std::string f4 = write("ok.npy", make_npy(std::vector<float>{1.0f}, "<f4", "(1,)"));
  expect_one_line_failure({"stats", f4, "--target", "fp17@3"},
                          "--target 'fp17@3': unknown format 'fp17'", 2);
  expect_one_line_failure({"stats", f4, "--target", "fp16@1000"},
                          "--target 'fp16@1000': scale exponent 1000 outside [-256, 256]", 2);
  expect_one_line_failure({"stats", f4, "--dtype", "f64"}, "--dtype 'f64'", 2);
  expect_one_line_failure({"stats"}, "FILE is required", 2);
  expect_one_line_failure({}, "A subcommand is required", 2);
  expect_one_line_failure({"stats", f4, "--bogus"}, "--bogus", 2);
  expect_one_line_failure({"frobnicate"}, "unknown subcommand 'frobnicate' (expected stats", 2);
}

}  // namespace
}  // namespace ampscope
