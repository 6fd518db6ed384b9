#include "display_width.h"

#include <locale.h>
#include <wchar.h>

#include <cwchar>

namespace ampscope::cli {

std::size_t display_width(std::string_view text) {
  // A locale object of its own, used on this thread only for the call: the program's global
  // locale (and so number formatting) stays as it is.
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  if (utf8 == static_cast<locale_t>(0)) return text.size();
  const locale_t previous = uselocale(utf8);
  std::mbstate_t state{};
  std::size_t width = 0;
  for (std::size_t i = 0; i < text.size();) {
    wchar_t c = 0;
    const std::size_t n = std::mbrtowc(&c, text.data() + i, text.size() - i, &state);
    if (n == 0 || n > text.size() - i) {  // NUL, an invalid or a cut sequence
      state = std::mbstate_t{};
      ++width;
      ++i;
      continue;
    }
    const int w = ::wcwidth(c);
    width += w < 0 ? 1 : static_cast<std::size_t>(w);
    i += n;
  }
  uselocale(previous);
  return width;
}

std::string pad_columns(std::string_view text, std::size_t columns) {
  std::string out(text);
  const std::size_t width = display_width(text);
  if (width < columns) out.append(columns - width, ' ');
  return out;
}

}  // namespace ampscope::cli
