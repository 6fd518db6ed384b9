// Validation of every message an agent sends. Each rule is one function
// that names the offending field and a stable reason token. A report that breaks a rule of the
// report itself (identity, seq, step scalars, a bound on a list, the history's shape) is
// rejected whole; a part that breaks a rule of its own (one tensor, one notice, one layer name,
// one quantiser, one policy outcome, the first offender's name) is refused alone and the rest of the step is
// stored, so that one bad name never costs a step. The reason tokens are the `reason` label of
// ampscope_reports_rejected_total and ampscope_report_parts_refused_total and Reject.reason on
// the wire, so they form a closed set (kRejectReasons) and never change meaning.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/text.h"
#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::server {

// Bounds the server enforces (documented next to each field in the .proto files).
namespace limits {
inline constexpr std::size_t kRunIdMaxBytes = 128;
inline constexpr std::uint32_t kMaxWorldSize = 65536;
// Text: clean text (ampscope/text.h) of at most so many bytes.
inline constexpr std::size_t kShortStringMaxBytes = text::kShortTextMaxBytes;  // precision, ...
inline constexpr std::size_t kNameMaxBytes = text::kNameMaxBytes;      // host, trainer, names
inline constexpr std::size_t kNoticeMaxBytes = text::kNoticeMaxBytes;  // notices, reasons
inline constexpr int kMaxTensorsPerReport = 4096;
inline constexpr int kMaxQuantizersPerReport = 4096;  // StepReport.quantizers
inline constexpr int kMaxAmaxHistory = 1024;          // QuantizerStats.amax_history
inline constexpr std::size_t kRecipeMaxBytes = 64;    // QuantizerStats.recipe
inline constexpr int kMaxLayerNames = 4096;
inline constexpr int kMaxShapeDims = 8;
inline constexpr int kMaxTargets = 16;
inline constexpr int kMaxNotices = 16;
inline constexpr int kMaxPolicyOutcomes = 64;
// StepReport.history: steps and tensors over all of them (the agent's flight recorder stays
// within both).
inline constexpr int kMaxHistorySteps = 1024;
inline constexpr int kMaxHistoryTensors = 65536;
inline constexpr int kHistogramMinExponent = -149;
inline constexpr int kHistogramMaxExponent = 127;
inline constexpr int kMaxHistogramBins = kHistogramMaxExponent - kHistogramMinExponent + 1;
inline constexpr int kMaxScaleLog2 = 256;
// Sequence numbers the store keeps as signed 64-bit integers: a seq above this one would not
// read back as itself after a restart.
inline constexpr std::uint64_t kMaxSeq = std::numeric_limits<std::int64_t>::max();
// Steps below 2^62 leave room for effective_from_step = step + lead_steps (at most 10^6)
// without overflowing int64.
inline constexpr std::int64_t kMaxStep = (std::int64_t{1} << 62) - 1;
// A pid_t is a signed 32-bit integer on every platform an agent runs on.
inline constexpr std::uint64_t kMaxPid = std::numeric_limits<std::int32_t>::max();
// Client text quoted in a Reject or status message (and stored with a rejection), in bytes.
inline constexpr std::size_t kQuoteMaxBytes = 256;
}  // namespace limits

struct Violation {
  std::string field;    // "report.tensors[3].histogram.counts"
  std::string reason;   // one of kRejectReasons
  std::string message;  // one line for people, starts with the field
};

// The closed set of reasons, in the order they are exported.
inline constexpr std::array<std::string_view, 20> kRejectReasons = {
    "missing_hello",        // first message of a stream is not a Hello
    "identity",             // run_id / rank of a report differ from the stream's Hello
    "run_id",               // run id length or characters
    "rank",                 // rank >= world_size, world_size out of range
    "seq_order",            // seq 0 or not above the previous seq of the stream
    "range",                // a number outside its documented range
    "non_finite",           // NaN/Inf where a finite value is required
    "string",               // a string too long, empty where required, or not clean text
                            // (valid UTF-8 without control characters)
    "too_many",             // a repeated field above its bound
    "enum",                 // an enum value unspecified or unknown
    "shape",                // shape rank or product inconsistent with numel
    "counts_exceed_numel",  // zeros + nan + pos_inf + neg_inf > numel
    "histogram_presence",   // histogram present without level FULL, or missing with it
    "histogram_range",      // exponent range outside [-149, 127] or too many bins
    "histogram_total",      // histogram counts do not sum to the finite nonzero elements
    "target_counts",        // target counts above the finite nonzero elements
    "history",              // flight_event without history (or history without it), or a
                            // history tensor below level FULL
    "recipe",               // a quantiser's recipe text that parse_recipe does not read as its
                            // canonical text, or an element format not the recipe's
    "quantizer_counts",     // a quantiser's counts above its values, or block counts above its
                            // blocks
    "layer",                // a quantiser's layer that is not one of the Hello's
                            // bf16_capable_gemms
};

// Per-stream facts a report is checked against.
struct StreamIdentity {
  std::string run_id;
  std::uint32_t rank = 0;
  std::uint64_t previous_seq = 0;  // highest seq seen on this stream, 0 before any
  // The Hello's bf16_capable_gemms, sorted: the layers a quantiser may name.
  std::vector<std::string> bf16_capable_gemms;
};

// The stream's facts from its (validated) Hello.
StreamIdentity stream_identity(const v1::Hello& hello);

// A part of a report refused alone: the rule it broke, and one line for the run's notices
// that names the part (stable from step to step, so that a part refused every step is noted
// once).
struct Refusal {
  Violation violation;
  std::string notice;
};

// What validation made of a report: rejected whole (`rejected`; the report is left as it came),
// or accepted once the parts in `refused` were taken out of it (a refused tensor, notice, layer
// name or policy outcome is removed; a first offender's name that is not clean text is escaped
// with text::clean_text, or "(unnamed)" when empty).
struct ReportVerdict {
  std::optional<Violation> rejected;
  std::vector<Refusal> refused;
};

std::optional<Violation> validate_hello(const v1::Hello& hello);
ReportVerdict validate_report(v1::StepReport& report, const StreamIdentity& stream);

// Client text as a message may quote it: clean text (an invalid byte or a control character
// becomes '?', so that a message stays one line), at most
// limits::kQuoteMaxBytes bytes cut on a character boundary, and then marked
// "...(truncated, N bytes)".
std::string quote(std::string_view text);

// Individual rules, exposed for the unit tests.
std::optional<Violation> check_run_id(std::string_view run_id, std::string_view field);
std::optional<Violation> check_tensor_stats(const v1::TensorStats& t, const std::string& field);
std::optional<Violation> check_quantizer_stats(const v1::QuantizerStats& q,
                                               const std::string& field);

}  // namespace ampscope::server
