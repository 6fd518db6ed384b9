// Table columns of the CLI under UTF-8 names: the width a terminal gives a name, not its bytes.
#include "display_width.h"

#include <gtest/gtest.h>

namespace ampscope::cli {
namespace {

TEST(DisplayWidthTest, ColumnsNotBytes) {
  EXPECT_EQ(display_width(""), 0u);
  EXPECT_EQ(display_width("h0.attn.qkv"), 11u);
  EXPECT_EQ(display_width("temp\xc3\xa9rature"), 11u);       // é: 2 bytes, 1 column
  EXPECT_EQ(display_width("\xe7\xba\xbf\xe6\x80\xa7"), 4u);  // 线性: wide, 2 columns each
  EXPECT_EQ(display_width("e\xcc\x81"), 1u);                 // e + combining acute
  EXPECT_EQ(display_width("\xf0\x9f\x94\xa5"), 2u);          // an emoji
  EXPECT_EQ(display_width("a\xff"
                          "b"),
            3u);                              // a byte that does not decode
  EXPECT_EQ(display_width("a\xe7\xba"), 3u);  // a sequence cut short
}

TEST(DisplayWidthTest, PadsToColumns) {
  const std::string name = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";  // 24 columns
  EXPECT_EQ(pad_columns(name, 36), name + std::string(12, ' '));
  EXPECT_EQ(pad_columns("abc", 5), "abc  ");
  EXPECT_EQ(pad_columns("abcdef", 5), "abcdef");
}

}  // namespace
}  // namespace ampscope::cli
