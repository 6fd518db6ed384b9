// `ampscope stats FILE.npy`: statistics of a tensor saved with NumPy.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"
#include "npy.h"

namespace CLI {
class App;
}

namespace ampscope::cli {

// Registers the subcommand and its options on `app`; its callback runs the command.
void add_stats_command(CLI::App& app);

// The --dtype value: nullopt for "auto", else fp32, fp16 or bf16 (or an alias parse_format
// knows). Throws UsageError otherwise.
std::optional<Format> parse_dtype_option(const std::string& text);

// The storage format to read the file's elements as. Without --dtype, float32 and float16 files
// are read as they are; with it, raw words of the right width (uint16 holding bfloat16 bits,
// say) are reinterpreted too. Throws InputError naming `path` when the two do not fit.
Format resolve_dtype(const npy::Header& header, std::optional<Format> requested,
                     const std::string& path);

// Parses every --target value. Throws UsageError naming the bad one.
std::vector<TargetSpec> parse_targets(const std::vector<std::string>& texts);

}  // namespace ampscope::cli
