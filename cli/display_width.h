// Columns of names in the CLI's tables: names are UTF-8 (a tensor "encoder.température.线性"
// is 28 bytes and 24 columns), so padding by bytes (std::setw) would shift every column after
// them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ampscope::cli {

// Columns a terminal gives `text`: glibc's wcwidth of each character under C.UTF-8 (East Asian
// wide characters 2, combining marks 0); a byte that does not decode, or a character wcwidth
// does not know, counts 1.
std::size_t display_width(std::string_view text);

// `text` followed by spaces up to `columns` columns (none when it is as wide or wider), as
// std::left << std::setw(columns) pads ASCII.
std::string pad_columns(std::string_view text, std::size_t columns);

}  // namespace ampscope::cli
