// The decisions `ampscope stats` makes before and after compute_stats: which format to read a
// file as, which targets the user asked for, and how the histogram marks each binade.
#include "stats_command.h"

#include <gtest/gtest.h>

#include "command.h"
#include "stats_report.h"

namespace ampscope::cli {
namespace {

npy::Header header_with(const std::string& descr) {
  npy::Header h;
  h.descr = descr;
  h.dtype = npy::parse_descr(descr);
  return h;
}

std::string resolve_error(const std::string& descr, std::optional<Format> requested) {
  try {
    resolve_dtype(header_with(descr), requested, "x.npy");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ResolveDtypeTest, AutoReadsFloatFilesAsStored) {
  EXPECT_EQ(resolve_dtype(header_with("<f4"), std::nullopt, "x.npy"), Format::kFP32);
  EXPECT_EQ(resolve_dtype(header_with("<f2"), std::nullopt, "x.npy"), Format::kFP16);
  EXPECT_EQ(resolve_dtype(header_with(">f4"), std::nullopt, "x.npy"), Format::kFP32);
}

TEST(ResolveDtypeTest, ExplicitDtypeReadsRawWordsOfItsWidth) {
  EXPECT_EQ(resolve_dtype(header_with("<u2"), Format::kBF16, "x.npy"), Format::kBF16);
  EXPECT_EQ(resolve_dtype(header_with("<i2"), Format::kBF16, "x.npy"), Format::kBF16);
  EXPECT_EQ(resolve_dtype(header_with("|V2"), Format::kBF16, "x.npy"), Format::kBF16);
  EXPECT_EQ(resolve_dtype(header_with("<u2"), Format::kFP16, "x.npy"), Format::kFP16);
  EXPECT_EQ(resolve_dtype(header_with("<f2"), Format::kFP16, "x.npy"), Format::kFP16);
  EXPECT_EQ(resolve_dtype(header_with("<u4"), Format::kFP32, "x.npy"), Format::kFP32);
}

TEST(ResolveDtypeTest, AutoAsksWhatRawWordsAre) {
  EXPECT_EQ(resolve_error("<u2", std::nullopt),
            "x.npy: dtype '<u2' (uint16) holds raw 16-bit words; pass --dtype bf16 (or fp16) "
            "to say what they are");
}

TEST(ResolveDtypeTest, RejectsOtherDtypes) {
  const std::string tail =
      "; ampscope stats reads float32 ('<f4'), float16 ('<f2') and bfloat16 bits as uint16 "
      "('<u2') with --dtype bf16";
  EXPECT_EQ(resolve_error("<f8", std::nullopt), "x.npy: unsupported dtype '<f8' (float64)" + tail);
  EXPECT_EQ(resolve_error("<i4", std::nullopt), "x.npy: unsupported dtype '<i4' (int32)" + tail);
  EXPECT_EQ(resolve_error("|b1", std::nullopt), "x.npy: unsupported dtype '|b1' (bool)" + tail);
}

TEST(ResolveDtypeTest, RejectsDtypeThatDoesNotFitTheFile) {
  EXPECT_EQ(resolve_error("<f4", Format::kBF16),
            "x.npy: --dtype bf16 reads 2-byte integer words, but the file holds '<f4' (float32)");
  // float16 bits are not bfloat16 bits: reading them so would be a silent misreport.
  EXPECT_EQ(resolve_error("<f2", Format::kBF16),
            "x.npy: --dtype bf16 reads 2-byte integer words, but the file holds '<f2' (float16)");
  EXPECT_EQ(resolve_error("<f2", Format::kFP32),
            "x.npy: --dtype fp32 reads 4-byte float or integer words, but the file holds '<f2' "
            "(float16)");
}

TEST(ParseDtypeOptionTest, AcceptsStorageFormats) {
  EXPECT_EQ(parse_dtype_option("auto"), std::nullopt);
  EXPECT_EQ(parse_dtype_option("bf16"), Format::kBF16);
  EXPECT_EQ(parse_dtype_option("bfloat16"), Format::kBF16);
  EXPECT_EQ(parse_dtype_option("fp32"), Format::kFP32);
  EXPECT_EQ(parse_dtype_option("e4m3"), Format::kE4M3);  // FP8 storage: one byte per element
  EXPECT_EQ(parse_dtype_option("float8_e5m2"), Format::kE5M2);
  EXPECT_THROW(parse_dtype_option("e2m1"), UsageError);
  EXPECT_THROW(parse_dtype_option("f8"), UsageError);
}

TEST(ParseTargetsTest, ParsesEachAndNamesTheBadOne) {
  EXPECT_EQ(
      parse_targets({"fp16@16", "e4m3@-3", "bf16"}).formats,
      (std::vector<TargetSpec>{{Format::kFP16, 16}, {Format::kE4M3, -3}, {Format::kBF16, 0}}));
  try {
    parse_targets({"fp16@16", "fp16@x"});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--target 'fp16@x': scale 'x' is not an integer power-of-two exponent");
  }
}

// Recipes and FORMAT@K targets mixed on one command line land in their own lists, in order;
// a bad recipe is named with the parser's reason.
TEST(ParseTargetsTest, RoutesRecipesApart) {
  const StatsTargets t = parse_targets({"mxfp8_e4m3", "fp16@16", "nvfp4", "e4m3:current"});
  EXPECT_EQ(t.formats, (std::vector<TargetSpec>{{Format::kFP16, 16}}));
  ASSERT_EQ(t.recipes.size(), 3u);
  EXPECT_EQ(to_string(t.recipes[0]), "mxfp8_e4m3");
  EXPECT_EQ(to_string(t.recipes[1]), "nvfp4");
  EXPECT_EQ(to_string(t.recipes[2]), "e4m3:current");
  try {
    parse_targets({"mxfp8_e4m3:block=0x32"});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--target 'mxfp8_e4m3:block=0x32': block must be ROWSxCOLS with each from 1 to "
              "65536 (found '0x32')");
  }
}

// Rows are the last dimension; a scalar is one row of one; Fortran order is refused for block
// recipes on 2-D and larger arrays only.
TEST(RecipeRowLengthTest, LastDimensionAndFortranOrder) {
  npy::Header h = header_with("<f4");
  const std::vector<Recipe> mx = {*parse_recipe("mxfp4")};
  const std::vector<Recipe> current = {*parse_recipe("e4m3:current")};
  h.shape = {3, 5, 64};
  EXPECT_EQ(recipe_row_length(h, mx, "x.npy"), 64u);
  h.shape = {};
  EXPECT_EQ(recipe_row_length(h, mx, "x.npy"), 1u);
  h.shape = {7};
  h.fortran_order = true;
  EXPECT_EQ(recipe_row_length(h, mx, "x.npy"), 7u);
  h.shape = {4, 64};
  EXPECT_EQ(recipe_row_length(h, current, "x.npy"), 64u);
  try {
    recipe_row_length(h, mx, "x.npy");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("x.npy: Fortran-order array of shape (4, 64)"),
              std::string::npos)
        << e.what();
  }
}

TEST(BinadeMarkTest, FollowsTheFormatRanges) {
  // FP16: subnormal from 2^-24, normal from 2^-14 up to 65504 (binade 15); 2^-25 < x < 2^-24
  // rounds up to the smallest subnormal, below that to zero.
  EXPECT_EQ(binade_mark(16, Format::kFP16), 'X');
  EXPECT_EQ(binade_mark(15, Format::kFP16), 'N');
  EXPECT_EQ(binade_mark(-14, Format::kFP16), 'N');
  EXPECT_EQ(binade_mark(-15, Format::kFP16), 's');
  EXPECT_EQ(binade_mark(-24, Format::kFP16), 's');
  EXPECT_EQ(binade_mark(-25, Format::kFP16), 's');
  EXPECT_EQ(binade_mark(-26, Format::kFP16), '0');
  // E4M3: [256, 512) is mostly normal (overflow from 464); 512 and up overflows.
  EXPECT_EQ(binade_mark(8, Format::kE4M3), 'N');
  EXPECT_EQ(binade_mark(9, Format::kE4M3), 'X');
  EXPECT_EQ(binade_mark(-6, Format::kE4M3), 'N');
  EXPECT_EQ(binade_mark(-7, Format::kE4M3), 's');
  EXPECT_EQ(binade_mark(-11, Format::kE4M3), '0');
  // BF16 keeps FP32's exponent range.
  EXPECT_EQ(binade_mark(127, Format::kBF16), 'N');
  EXPECT_EQ(binade_mark(-126, Format::kBF16), 'N');
  EXPECT_EQ(binade_mark(-133, Format::kBF16), 's');
  EXPECT_EQ(binade_mark(-135, Format::kBF16), '0');
  EXPECT_EQ(binade_mark(16, Format::kE5M2), 'X');
  EXPECT_EQ(binade_mark(-16, Format::kE5M2), 's');
}

}  // namespace
}  // namespace ampscope::cli
