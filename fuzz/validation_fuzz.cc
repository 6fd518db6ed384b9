// Target: the server's validation of what an agent sends (server/src/validation.h).
// Input: one stream (support.h, parse_stream): its first message should be a Hello, the rest
// reports, checked as the stream's reactor checks them (identity from the Hello, seq above the
// stream's previous one).
// Properties:
//   - a violation names a field, carries a reason of kRejectReasons and one line that starts
//     with the field;
//   - a rejected report is left as it came;
//   - a part refused alone is a part of its own (a tensor, a notice, a layer name, a policy
//     outcome, the first offender's name), and its notice is one line of clean text within the
//     notice limit;
//   - a message that passes (without its refused parts) re-serialises to a message that is
//     equal and passes again with nothing refused;
//   - a report passes only with the stream's identity and a seq above the previous one.
#include <algorithm>
#include <optional>

#include "ampscope/text.h"
#include "support.h"
#include "validation.h"

namespace ampscope::fuzz {
namespace {

using server::StreamIdentity;
using server::Violation;

void check_violation(const Violation& v) {
  FUZZ_CHECK(!v.field.empty(), v.message);
  FUZZ_CHECK(std::find(server::kRejectReasons.begin(), server::kRejectReasons.end(), v.reason) !=
                 server::kRejectReasons.end(),
             v.reason);
  FUZZ_CHECK(v.message.starts_with(v.field), v.field + " | " + v.message);
  FUZZ_CHECK(one_line(v.message), v.message);
}

template <typename Message>
Message reparsed(const Message& m) {
  std::string bytes;
  FUZZ_CHECK(m.SerializeToString(&bytes), "a valid message does not serialise");
  Message again;
  FUZZ_CHECK(again.ParseFromString(bytes), "a valid message does not parse back");
  // Compared serialised: a NaN loss or grad_norm is valid, and equal to nothing field by field.
  FUZZ_CHECK(again.SerializeAsString() == bytes, m.ShortDebugString());
  return again;
}

void check_hello(const v1::Hello& hello) {
  const auto v = server::validate_hello(hello);
  if (v) {
    check_violation(*v);
    return;
  }
  FUZZ_CHECK(!server::validate_hello(reparsed(hello)), "a valid Hello fails after a round trip");
  FUZZ_CHECK(hello.rank() < hello.world_size(), hello.ShortDebugString());
  FUZZ_CHECK(!server::check_run_id(hello.run_id(), "hello.run_id"), hello.run_id());
}

bool refusable(const std::string& field) {
  for (std::string_view part :
       {"report.tensors[", "report.fp32_layers[", "report.bf16_gemms[", "report.policy_outcomes[",
        "report.notices[", "report.quantizers["}) {
    if (field.starts_with(part)) return true;
  }
  if (field == "report.first_offender.tensor") return true;
  return field.starts_with("report.history[") && field.find("].tensors[") != std::string::npos;
}

// Returns whether the report passed.
bool check_report(const v1::StepReport& sent, const StreamIdentity& stream) {
  v1::StepReport report = sent;
  server::ReportVerdict verdict = server::validate_report(report, stream);
  if (verdict.rejected) {
    check_violation(*verdict.rejected);
    FUZZ_CHECK(verdict.refused.empty(), "a rejected report had parts refused");
    FUZZ_CHECK(report.SerializeAsString() == sent.SerializeAsString(),
               "a rejected report was changed");
    return false;
  }
  for (const server::Refusal& r : verdict.refused) {
    check_violation(r.violation);
    FUZZ_CHECK(refusable(r.violation.field), r.violation.field);
    FUZZ_CHECK(one_line(r.notice), r.notice);
    FUZZ_CHECK(text::is_clean_text(r.notice), r.notice);
    FUZZ_CHECK(r.notice.size() <= text::kNoticeMaxBytes, r.notice);
  }
  FUZZ_CHECK(report.run_id() == stream.run_id && report.rank() == stream.rank,
             "a report of another stream passed");
  FUZZ_CHECK(report.seq() > stream.previous_seq, "a report with an old seq passed");
  v1::StepReport again = reparsed(report);
  const server::ReportVerdict second = server::validate_report(again, stream);
  FUZZ_CHECK(!second.rejected && second.refused.empty(),
             "a valid report fails after a round trip");
  for (int i = 0; i < report.tensors_size(); ++i) {
    const std::string field = "report.tensors[" + std::to_string(i) + "]";
    FUZZ_CHECK(!server::check_tensor_stats(report.tensors(i), field), field);
  }
  return true;
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ampscope;
  const std::vector<v1::AgentMessage> stream = fuzz::parse_stream(data, size);
  if (stream.empty()) return 0;
  // A stream whose first message is not a valid Hello is refused; its reports are still
  // checked against a Hello of their own run, so every report reaches the report rules.
  std::optional<server::StreamIdentity> identity;
  for (const v1::AgentMessage& m : stream) {
    if (m.has_hello()) {
      fuzz::check_hello(m.hello());
      if (!identity && !server::validate_hello(m.hello())) {
        identity = server::stream_identity(m.hello());
      }
    } else if (m.has_report()) {
      if (!identity) {
        identity = server::StreamIdentity{m.report().run_id(), m.report().rank(), 0, {}};
      }
      // As the reactor does: an accepted report raises the stream's seq, a rejected one too when
      // its seq is higher.
      fuzz::check_report(m.report(), *identity);
      identity->previous_seq = std::max(identity->previous_seq, m.report().seq());
    }
  }
  return 0;
}
