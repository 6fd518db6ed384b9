// Text on the wire: tensor and layer names, notices, run metadata. Defined once here for the
// agent, which makes every string it sends fit (clean_text), and the server, which accepts
// exactly what fits (is_clean_text) and quotes client text with the same decoder.
//
// Clean text is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF) without control characters (Unicode category Cc: U+0000..U+001F, U+007F,
// U+0080..U+009F), so that a name is stored and shown as written and still fits on one line of
// a terminal, a log or a Prometheus exposition.
//
// The escape (documented for users in docs/agent.md, "Names and text"): text that is clean and
// within its limit is sent unchanged. Anything else is sent escaped: every byte that is not
// part of a clean character, and every backslash, becomes \xHH (two lowercase hex digits), so
// that two different texts never escape to the same one. An escaped text still longer than its
// limit is cut on a character boundary and ends in "~" and 8 hex digits of a hash of the
// original bytes (32-bit FNV-1a), so that long names that share a prefix stay apart.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ampscope::text {

// Limits of text fields on the wire, in bytes (the .proto files document them field by field).
inline constexpr std::size_t kNameMaxBytes = 256;      // tensor and layer names, host, trainer
inline constexpr std::size_t kShortTextMaxBytes = 64;  // precision, agent_version, policy ids
inline constexpr std::size_t kNoticeMaxBytes = 512;    // notices, policy outcome reasons

// Length of the valid UTF-8 sequence that starts at s[i] (i < s.size()), or 0 when none starts
// there (a stray continuation byte, an overlong form, a surrogate, a code point above
// U+10FFFF, a sequence cut short by the end of s).
constexpr std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80;  // the second byte's range narrows for E0, ED, F0 and F4
  unsigned char hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // below: overlong
    if (c == 0xed) hi = 0x9f;  // above: surrogates D800..DFFF
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;  // below: overlong
    if (c == 0xf4) hi = 0x8f;  // above: beyond U+10FFFF
  } else {
    return 0;  // 80..C1 (continuation or overlong lead), F5..FF
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return n;
}

// Length of the clean character that starts at s[i], or 0 when the bytes there are not valid
// UTF-8 or encode a control character.
constexpr std::size_t clean_char(std::string_view s, std::size_t i) {
  const std::size_t n = utf8_sequence(s, i);
  const auto c = static_cast<unsigned char>(s[i]);
  if (n == 1 && (c < 0x20 || c == 0x7f)) return 0;
  // U+0080..U+009F are C2 80..C2 9F.
  if (n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0) return 0;
  return n;
}

// True when all of s is clean text (the empty text is clean).
constexpr bool is_clean_text(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = clean_char(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// `s` as it may be sent in a field of at most `max_bytes` bytes: unchanged when it is clean and
// fits, otherwise escaped as the header comment says. The result is clean, at most max_bytes
// long (max_bytes >= 16), and clean_text(clean_text(s, m), m) == clean_text(s, m).
inline std::string clean_text(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes && is_clean_text(s)) return std::string(s);
  constexpr std::string_view kHex = "0123456789abcdef";
  constexpr std::size_t kSuffixBytes = 9;  // "~" and 8 hex digits
  std::string out;
  out.reserve(s.size() < max_bytes ? s.size() + 16 : max_bytes);
  // While escaping, `fits` remembers where the text could be cut and still take the suffix.
  std::size_t fits = 0;
  bool cut = false;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = clean_char(s, i);
    if (n == 0 || s[i] == '\\') {
      const auto c = static_cast<unsigned char>(s[i]);
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
      n = 1;
    } else {
      out.append(s.substr(i, n));
    }
    if (out.size() + kSuffixBytes <= max_bytes) fits = out.size();
    if (out.size() > max_bytes) {
      cut = true;
      break;
    }
    i += n;
  }
  if (!cut) return out;
  std::uint32_t hash = 2166136261u;
  for (char c : s) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
  out.resize(fits);
  out.push_back('~');
  for (int shift = 28; shift >= 0; shift -= 4) out.push_back(kHex[(hash >> shift) & 0xf]);
  return out;
}

}  // namespace ampscope::text
