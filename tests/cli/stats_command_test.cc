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
  EXPECT_THROW(parse_dtype_option("e4m3"), UsageError);
  EXPECT_THROW(parse_dtype_option("f8"), UsageError);
}

TEST(ParseTargetsTest, ParsesEachAndNamesTheBadOne) {
  EXPECT_EQ(
      parse_targets({"fp16@16", "e4m3@-3", "bf16"}),
      (std::vector<TargetSpec>{{Format::kFP16, 16}, {Format::kE4M3, -3}, {Format::kBF16, 0}}));
  try {
    parse_targets({"fp16@16", "fp16@x"});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--target 'fp16@x': scale 'x' is not an integer power-of-two exponent");
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
