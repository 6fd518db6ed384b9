#include "ampscope/formats.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace ampscope {

std::optional<Format> parse_format(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::erase(s, '_');
  std::erase(s, '-');
  if (s == "fp32" || s == "float32" || s == "float" || s == "f32") return Format::kFP32;
  if (s == "fp16" || s == "float16" || s == "half" || s == "f16" || s == "binary16") {
    return Format::kFP16;
  }
  if (s == "bf16" || s == "bfloat16") return Format::kBF16;
  if (s == "e4m3" || s == "fp8e4m3" || s == "e4m3fn" || s == "fp8e4m3fn" || s == "float8e4m3fn") {
    return Format::kE4M3;
  }
  if (s == "e5m2" || s == "fp8e5m2" || s == "float8e5m2") return Format::kE5M2;
  return std::nullopt;
}

}  // namespace ampscope
