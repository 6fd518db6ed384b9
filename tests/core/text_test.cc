// Text on the wire (ampscope/text.h): the UTF-8 decoder against a reference written from the
// code point arithmetic (every 1-, 2- and 3-byte string, every code point, the boundaries), and
// the escape: clean text unchanged, anything else escaped so that it decodes back to what was
// written, within the limit, idempotent.
#include "ampscope/text.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>

namespace ampscope::text {
namespace {

// Reference decoder: the code point of the sequence at s[0..], by the bits of the lead byte,
// then the rules of RFC 3629 (shortest form, no surrogates, at most U+10FFFF). Returns the
// length and code point, or nullopt.
struct Decoded {
  std::size_t length;
  char32_t code_point;
};
std::optional<Decoded> reference_decode(std::string_view s) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = b(0);
  std::size_t n = 0;
  char32_t cp = 0;
  if (lead < 0x80) return Decoded{1, lead};
  if ((lead & 0xe0) == 0xc0) {
    n = 2;
    cp = lead & 0x1f;
  } else if ((lead & 0xf0) == 0xe0) {
    n = 3;
    cp = lead & 0x0f;
  } else if ((lead & 0xf8) == 0xf0) {
    n = 4;
    cp = lead & 0x07;
  } else {
    return std::nullopt;
  }
  if (s.size() < n) return std::nullopt;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (b(k) & 0x3f);
  }
  const char32_t shortest_min[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < shortest_min[n]) return std::nullopt;
  if (cp >= 0xd800 && cp <= 0xdfff) return std::nullopt;
  if (cp > 0x10ffff) return std::nullopt;
  return Decoded{n, cp};
}

bool reference_control(char32_t cp) { return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f); }

bool reference_clean(std::string_view s) {
  while (!s.empty()) {
    const auto d = reference_decode(s);
    if (!d || reference_control(d->code_point)) return false;
    s.remove_prefix(d->length);
  }
  return true;
}

// UTF-8 of a code point by the arithmetic, surrogates included (they must then be refused).
std::string encode(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return out;
}

// Undoes the escape of a text that was escaped and not cut: \xHH is the byte HH; nothing else
// in an escaped text starts with a backslash.
std::optional<std::string> unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 4 > s.size() || s[i + 1] != 'x') return std::nullopt;
    out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 2, 2)), nullptr, 16)));
    i += 3;
  }
  return out;
}

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

TEST(TextTest, EveryOneByteString) {
  for (int c = 0; c < 256; ++c) {
    const std::string s(1, static_cast<char>(c));
    EXPECT_EQ(is_clean_text(s), c >= 0x20 && c < 0x7f) << c;
    EXPECT_EQ(is_clean_text(s), reference_clean(s)) << c;
  }
}

TEST(TextTest, EveryTwoByteString) {
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const std::string s = bytes({a, b});
      ASSERT_EQ(is_clean_text(s), reference_clean(s)) << a << " " << b;
      const auto d = reference_decode(s);
      ASSERT_EQ(utf8_sequence(s, 0), d ? d->length : 0) << a << " " << b;
    }
  }
}

TEST(TextTest, EveryThreeByteString) {
  std::string s(3, '\0');
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      for (int c = 0; c < 256; ++c) {
        s[0] = static_cast<char>(a);
        s[1] = static_cast<char>(b);
        s[2] = static_cast<char>(c);
        const auto d = reference_decode(s);
        if (utf8_sequence(s, 0) != (d ? d->length : 0) || is_clean_text(s) != reference_clean(s)) {
          FAIL() << a << " " << b << " " << c;
        }
      }
    }
  }
}

TEST(TextTest, EveryCodePointAndTheFourByteLeads) {
  for (char32_t cp = 0; cp <= 0x10ffff; ++cp) {
    const std::string s = encode(cp);
    const bool surrogate = cp >= 0xd800 && cp <= 0xdfff;
    ASSERT_EQ(utf8_sequence(s, 0), surrogate ? 0 : s.size())
        << std::hex << static_cast<std::uint32_t>(cp);
    ASSERT_EQ(is_clean_text(s), !surrogate && !reference_control(cp))
        << std::hex << static_cast<std::uint32_t>(cp);
  }
  // Four-byte leads with every second byte: F0 needs 90..BF, F4 80..8F, F5..F7 nothing.
  for (int lead = 0xf0; lead <= 0xff; ++lead) {
    for (int b = 0; b < 256; ++b) {
      const std::string s = bytes({lead, b, 0x80, 0x80});
      ASSERT_EQ(utf8_sequence(s, 0), reference_decode(s) ? 4u : 0u) << lead << " " << b;
    }
  }
}

TEST(TextTest, Boundaries) {
  EXPECT_FALSE(is_clean_text("\x7f"));                           // U+007F DEL
  EXPECT_FALSE(is_clean_text(bytes({0xc2, 0x80})));              // U+0080, C1 control
  EXPECT_FALSE(is_clean_text(bytes({0xc2, 0x9f})));              // U+009F, C1 control
  EXPECT_TRUE(is_clean_text(bytes({0xc2, 0xa0})));               // U+00A0
  EXPECT_TRUE(is_clean_text(bytes({0xdf, 0xbf})));               // U+07FF
  EXPECT_TRUE(is_clean_text(bytes({0xe0, 0xa0, 0x80})));         // U+0800
  EXPECT_TRUE(is_clean_text(bytes({0xef, 0xbf, 0xbf})));         // U+FFFF
  EXPECT_TRUE(is_clean_text(bytes({0xf0, 0x90, 0x80, 0x80})));   // U+10000
  EXPECT_TRUE(is_clean_text(bytes({0xf4, 0x8f, 0xbf, 0xbf})));   // U+10FFFF
  EXPECT_FALSE(is_clean_text(bytes({0xf4, 0x90, 0x80, 0x80})));  // U+110000
  EXPECT_FALSE(is_clean_text(bytes({0xed, 0xa0, 0x80})));        // U+D800
  EXPECT_FALSE(is_clean_text(bytes({0xed, 0xbf, 0xbf})));        // U+DFFF
  EXPECT_TRUE(is_clean_text(bytes({0xed, 0x9f, 0xbf})));         // U+D7FF
  EXPECT_TRUE(is_clean_text(bytes({0xee, 0x80, 0x80})));         // U+E000
  // Overlong forms of '/' and of the boundaries.
  EXPECT_FALSE(is_clean_text(bytes({0xc0, 0xaf})));
  EXPECT_FALSE(is_clean_text(bytes({0xc1, 0xbf})));
  EXPECT_FALSE(is_clean_text(bytes({0xe0, 0x80, 0xaf})));
  EXPECT_FALSE(is_clean_text(bytes({0xe0, 0x9f, 0xbf})));
  EXPECT_FALSE(is_clean_text(bytes({0xf0, 0x80, 0x80, 0xaf})));
  EXPECT_FALSE(is_clean_text(bytes({0xf0, 0x8f, 0xbf, 0xbf})));
  // Cut short, at the end and before more text.
  EXPECT_FALSE(is_clean_text(bytes({0xe4, 0xb8})));
  EXPECT_FALSE(is_clean_text(bytes({0xf0, 0x9f, 0x94})));
  EXPECT_FALSE(is_clean_text(bytes({0xe4, 0xb8, 'a'})));
  EXPECT_FALSE(is_clean_text(bytes({0x80})));
  EXPECT_TRUE(is_clean_text(""));
  EXPECT_TRUE(is_clean_text("encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7"));
}

TEST(TextTest, CleanTextIsSentAsWritten) {
  for (std::string_view s : {"h0.attn.qkv.weight", "a\\b", "\\x41",
                             "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7", ""}) {
    EXPECT_EQ(clean_text(s, kNameMaxBytes), s);
  }
  EXPECT_EQ(clean_text(std::string(256, 'n'), kNameMaxBytes), std::string(256, 'n'));
}

TEST(TextTest, EscapeWritesBadBytesAndBackslashesAsHex) {
  EXPECT_EQ(clean_text("a\x01"
                       "b",
                       kNameMaxBytes),
            "a\\x01b");
  EXPECT_EQ(clean_text("a\\b\xff", kNameMaxBytes), "a\\x5cb\\xff");
  EXPECT_EQ(clean_text(bytes({'x', 0xc2, 0x85}), kNameMaxBytes), "x\\xc2\\x85");
  EXPECT_EQ(clean_text(bytes({0xed, 0xa0, 0x80, 0xc3, 0xa9}), kNameMaxBytes),
            "\\xed\\xa0\\x80\xc3\xa9");
  EXPECT_EQ(clean_text(bytes({0xe4, 0xb8}), kNameMaxBytes), "\\xe4\\xb8");
}

// Every 1- and 2-byte text, and every 3-byte one whose first byte is a multi-byte lead: the
// result is clean, and an escaped result decodes back to the text (so no two texts share one).
TEST(TextTest, EscapeIsCleanAndDecodesBack) {
  const auto check = [](const std::string& s) {
    const std::string out = clean_text(s, kNameMaxBytes);
    if (!is_clean_text(out)) return false;
    if (out == s) return is_clean_text(s);
    const auto back = unescape(out);
    return back && *back == s && clean_text(out, kNameMaxBytes) == out;
  };
  for (int a = 0; a < 256; ++a) {
    ASSERT_TRUE(check(bytes({a}))) << a;
    for (int b = 0; b < 256; ++b) {
      ASSERT_TRUE(check(bytes({a, b}))) << a << " " << b;
    }
  }
  for (int a = 0xe0; a < 0x100; ++a) {
    for (int b = 0; b < 256; ++b) {
      for (int c : {0x00, 0x1b, 0x5c, 0x7f, 0x80, 0x9f, 0xa0, 0xbf, 0xc0}) {
        ASSERT_TRUE(check(bytes({a, b, c}))) << a << " " << b << " " << c;
      }
    }
  }
}

TEST(TextTest, OverLongTextIsCutOnACharacterAndKeepsLongNamesApart) {
  const std::string prefix(250, 'p');
  const std::string a = prefix +
                        "\xe7\xba\xbf"
                        "aaaaaaaaaa";
  const std::string b = prefix +
                        "\xe7\xba\xbf"
                        "bbbbbbbbbb";
  const std::string ca = clean_text(a, kNameMaxBytes);
  const std::string cb = clean_text(b, kNameMaxBytes);
  EXPECT_LE(ca.size(), kNameMaxBytes);
  EXPECT_TRUE(is_clean_text(ca));
  EXPECT_NE(ca, cb);
  EXPECT_EQ(ca.substr(0, 247), prefix.substr(0, 247));
  EXPECT_EQ(ca[ca.size() - 9], '~');
  EXPECT_EQ(clean_text(ca, kNameMaxBytes), ca);
  // A cut never splits a character or an escape.
  for (std::size_t pad = 0; pad < 12; ++pad) {
    for (const std::string& tail : {std::string("\xe7\xba\xbf\xe7\xba\xbf\xe7\xba\xbf"),
                                    std::string("\x01\x02\x03\x04\x05")}) {
      const std::string s = std::string(240 + pad, 'q') + tail + std::string(20, 'r');
      const std::string out = clean_text(s, kNameMaxBytes);
      EXPECT_LE(out.size(), kNameMaxBytes);
      EXPECT_TRUE(is_clean_text(out)) << out;
      const std::string body = out.substr(0, out.size() - 9);
      EXPECT_TRUE(body.size() < 4 || body.find('\\', body.size() - 3) == std::string::npos) << out;
    }
  }
  // Different long texts, different results.
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    seen.insert(clean_text(prefix + std::string(20, 'z') + std::to_string(i), kNameMaxBytes));
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace ampscope::text
