// One test per validation rule: a valid report, broken in exactly one way, is rejected whole
// (a rule of the report) or has one part refused alone (a rule of a tensor, a name, a notice),
// with the field named and the rule's reason token.
#include "validation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/recipe.h"
#include "server_harness.h"

namespace ampscope::server {
namespace {

using testing::make_hello;
using testing::make_report;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

StreamIdentity stream_of(const char* run = "run-v", std::uint32_t rank = 0,
                         std::uint64_t previous = 0) {
  return StreamIdentity{run, rank, previous, {}};
}

v1::StepReport valid() { return make_report("run-v", 0, 1, 0, 2); }

// validate_report on a copy of `r`: the violation that rejects it whole.
std::optional<Violation> rejection(v1::StepReport r, const StreamIdentity& stream) {
  return validate_report(r, stream).rejected;
}

// validate_report on a copy of `r`: the one part refused alone (none when the report is
// rejected whole or more than one part is refused).
std::optional<Violation> refusal(v1::StepReport r, const StreamIdentity& stream) {
  ReportVerdict v = validate_report(r, stream);
  if (v.rejected || v.refused.size() != 1) return std::nullopt;
  return v.refused[0].violation;
}

// True when validate_report takes a copy of `r` whole: nothing rejected, nothing refused.
bool passes_whole(v1::StepReport r, const StreamIdentity& stream) {
  ReportVerdict v = validate_report(r, stream);
  return !v.rejected && v.refused.empty();
}

void expect_violation(const std::optional<Violation>& v, const std::string& field,
                      const std::string& reason) {
  ASSERT_TRUE(v.has_value()) << "expected a violation of " << field;
  EXPECT_EQ(v->field, field);
  EXPECT_EQ(v->reason, reason);
  EXPECT_EQ(v->message.rfind(field + ": ", 0), 0u) << v->message;
  EXPECT_NE(std::find(kRejectReasons.begin(), kRejectReasons.end(), v->reason),
            kRejectReasons.end());
}

TEST(ServerValidationTest, ValidMessagesPass) {
  EXPECT_FALSE(validate_hello(make_hello("run-v")).has_value());
  EXPECT_TRUE(passes_whole(valid(), stream_of()));
}

TEST(ServerValidationTest, QuotedClientTextKeepsAMessageOnOneLine) {
  EXPECT_EQ(quote("a\nb\tc\x7f"
                  "d \xc3\xa9\xff"),
            "a?b?c?d \xc3\xa9?");
  // A C1 control character (U+0085) is one character, and one '?'.
  EXPECT_EQ(quote("a\xc2\x85"
                  "b"),
            "a?b");
  auto r = valid();
  r.set_run_id("seed\rrun\nx");
  const auto v = rejection(r, stream_of());
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->message.find_first_of("\r\n"), std::string::npos) << v->message;
  EXPECT_NE(v->message.find("'seed?run?x'"), std::string::npos) << v->message;
  // The stream's side is quoted too, whatever identity the caller hands in.
  const auto w = rejection(valid(), stream_of("seed\rrun"));
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->message.find_first_of("\r\n"), std::string::npos) << w->message;
}

TEST(ServerValidationTest, RunIdLengthAndCharacters) {
  expect_violation(check_run_id("", "hello.run_id"), "hello.run_id", "run_id");
  expect_violation(check_run_id(std::string(129, 'a'), "hello.run_id"), "hello.run_id", "run_id");
  expect_violation(check_run_id("run/1", "hello.run_id"), "hello.run_id", "run_id");
  expect_violation(check_run_id("rün", "hello.run_id"), "hello.run_id", "run_id");
  EXPECT_FALSE(check_run_id(std::string(128, 'a'), "x").has_value());
  EXPECT_FALSE(check_run_id("A-z_0.9", "x").has_value());
}

TEST(ServerValidationTest, HelloRankAndWorldSize) {
  v1::Hello h = make_hello("run-v", 4, 4);
  expect_violation(validate_hello(h), "hello.rank", "rank");
  h.set_world_size(0);
  h.set_rank(0);
  expect_violation(validate_hello(h), "hello.world_size", "rank");
}

TEST(ServerValidationTest, HelloScalerRanges) {
  v1::Hello h = make_hello("run-v");
  h.mutable_scaler()->set_init_scale(kInf);
  expect_violation(validate_hello(h), "hello.scaler.init_scale", "non_finite");
  h = make_hello("run-v");
  h.mutable_scaler()->set_backoff_factor(1.5);
  expect_violation(validate_hello(h), "hello.scaler.backoff_factor", "range");
}

TEST(ServerValidationTest, HelloStringsAndLists) {
  v1::Hello h = make_hello("run-v");
  h.set_host(std::string(300, 'h'));
  expect_violation(validate_hello(h), "hello.host", "string");
  h = make_hello("run-v");
  for (int i = 0; i < 4097; ++i) h.add_fp32_capable_layers("l" + std::to_string(i));
  expect_violation(validate_hello(h), "hello.fp32_capable_layers", "too_many");
}

TEST(ServerValidationTest, ReportIdentityMustMatchTheHello) {
  v1::StepReport r = valid();
  r.set_run_id("other");
  expect_violation(rejection(r, stream_of()), "report.run_id", "identity");
  r = valid();
  r.set_rank(1);
  expect_violation(rejection(r, stream_of()), "report.rank", "identity");
}

TEST(ServerValidationTest, SeqStrictlyIncreasingPerStream) {
  v1::StepReport r = valid();
  r.set_seq(0);
  expect_violation(rejection(r, stream_of()), "report.seq", "seq_order");
  r.set_seq(5);
  expect_violation(rejection(r, stream_of("run-v", 0, 5)), "report.seq", "seq_order");
  EXPECT_TRUE(passes_whole(r, stream_of("run-v", 0, 4)));
}

TEST(ServerValidationTest, StepScalarsRangesAndFiniteness) {
  v1::StepReport r = valid();
  r.set_step(-1);
  expect_violation(rejection(r, stream_of()), "report.step", "range");
  r = valid();
  r.set_loss_scale(0);
  expect_violation(rejection(r, stream_of()), "report.loss_scale", "range");
  r = valid();
  r.set_scale_after(kNaN);
  expect_violation(rejection(r, stream_of()), "report.scale_after", "non_finite");
  r = valid();
  r.set_grad_norm(kInf);
  expect_violation(rejection(r, stream_of()), "report.grad_norm", "non_finite");
  r.set_found_inf(true);  // then a non-finite norm is the expected outcome
  EXPECT_TRUE(passes_whole(r, stream_of()));
  r = valid();
  r.set_loss(kNaN);  // a diverged loss is data, not a malformed report
  EXPECT_TRUE(passes_whole(r, stream_of()));
  r = valid();
  r.set_tensor_core_active_ratio(1.5);
  expect_violation(rejection(r, stream_of()), "report.tensor_core_active_ratio", "range");
  r = valid();
  r.set_lr(-1);
  expect_violation(rejection(r, stream_of()), "report.lr", "range");
}

TEST(ServerValidationTest, FirstOffenderWithoutANameIsStoredUnnamed) {
  v1::StepReport r = valid();
  r.mutable_first_offender()->set_order(3);
  expect_violation(refusal(r, stream_of()), "report.first_offender.tensor", "string");
  ASSERT_FALSE(validate_report(r, stream_of()).rejected);
  EXPECT_EQ(r.first_offender().tensor(), "(unnamed)");
  EXPECT_EQ(r.first_offender().order(), 3u);
}

TEST(ServerValidationTest, TensorCountBounded) {
  v1::StepReport r = valid();
  const v1::TensorStats t = r.tensors(0);
  for (int i = 0; i < 4095; ++i) *r.add_tensors() = t;
  expect_violation(rejection(r, stream_of()), "report.tensors", "too_many");
}

TEST(ServerValidationTest, TensorNameRoleDtypeLevel) {
  v1::StepReport r = valid();
  r.mutable_tensors(1)->set_name("");
  expect_violation(refusal(r, stream_of()), "report.tensors[1].name", "string");
  r = valid();
  r.mutable_tensors(0)->set_role(v1::TENSOR_ROLE_UNSPECIFIED);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].role", "enum");
  r = valid();
  r.mutable_tensors(0)->set_dtype(v1::FORMAT_E4M3);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].dtype", "enum");
  r = valid();
  r.mutable_tensors(0)->set_held(v1::FORMAT_UNSPECIFIED);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].held", "enum");
  r = valid();
  r.mutable_tensors(0)->set_held(static_cast<v1::Format>(99));
  expect_violation(refusal(r, stream_of()), "report.tensors[0].held", "enum");
  r = valid();
  r.mutable_tensors(0)->set_held(v1::FORMAT_FP32);
  EXPECT_TRUE(passes_whole(r, stream_of()));
  r = valid();
  r.mutable_tensors(0)->set_level(v1::STATS_LEVEL_UNSPECIFIED);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].level", "enum");
}

TEST(ServerValidationTest, CountsAddUpToAtMostNumel) {
  v1::StepReport r = valid();
  v1::TensorStats* t = r.mutable_tensors(0);
  t->set_zeros(t->numel());
  t->set_nan(1);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].numel", "counts_exceed_numel");
  // Wrap-around cannot hide it.
  t->set_zeros(std::numeric_limits<std::uint64_t>::max());
  t->set_nan(2);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].numel", "counts_exceed_numel");
}

TEST(ServerValidationTest, ShapeMustMatchNumel) {
  v1::StepReport r = valid();
  r.mutable_tensors(0)->add_shape(3);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].shape", "shape");
  r = valid();
  r.mutable_tensors(0)->set_shape(0, -1);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].shape[0]", "shape");
}

TEST(ServerValidationTest, MagnitudesFiniteAndOrdered) {
  v1::StepReport r = valid();
  r.mutable_tensors(0)->set_max_abs(kInf);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].max_abs", "non_finite");
  r = valid();
  r.mutable_tensors(0)->set_min_abs_nonzero(r.tensors(0).max_abs() * 2);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].min_abs_nonzero", "range");
  r = valid();
  r.mutable_tensors(0)->set_sum(kNaN);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].sum", "non_finite");
  r = valid();
  r.mutable_tensors(0)->set_scale(0);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].scale", "range");
}

TEST(ServerValidationTest, HistogramPresentExactlyWithFullLevel) {
  v1::StepReport r = valid();
  r.mutable_tensors(0)->clear_histogram();
  expect_violation(refusal(r, stream_of()), "report.tensors[0].histogram", "histogram_presence");
  r = valid();
  r.mutable_tensors(0)->set_level(v1::STATS_LEVEL_COUNTS);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].histogram", "histogram_presence");
}

TEST(ServerValidationTest, HistogramExponentRangeBounded) {
  v1::StepReport r = valid();
  r.mutable_tensors(0)->mutable_histogram()->set_min_exponent(-150);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].histogram.min_exponent",
                   "histogram_range");
  r = valid();
  v1::BinadeHistogram* h = r.mutable_tensors(0)->mutable_histogram();
  h->set_min_exponent(127 - h->counts_size() + 2);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].histogram.min_exponent",
                   "histogram_range");
  r = valid();
  for (int i = 0; i < 300; ++i) r.mutable_tensors(0)->mutable_histogram()->add_counts(0);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].histogram.counts",
                   "histogram_range");
}

TEST(ServerValidationTest, HistogramSumsToFiniteNonzero) {
  v1::StepReport r = valid();
  v1::BinadeHistogram* h = r.mutable_tensors(0)->mutable_histogram();
  h->set_counts(0, h->counts(0) + 1);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].histogram.counts",
                   "histogram_total");
}

TEST(ServerValidationTest, TargetCountsBounded) {
  v1::StepReport r = valid();
  v1::TargetCounts* c = r.mutable_tensors(0)->mutable_targets(0);
  c->set_underflow(r.tensors(0).numel() + 1);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].targets[0]", "target_counts");
  r = valid();
  r.mutable_tensors(0)->mutable_targets(0)->set_scale_log2(300);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].targets[0].scale_log2", "range");
  r = valid();
  r.mutable_tensors(0)->mutable_targets(0)->set_format(v1::FORMAT_UNSPECIFIED);
  expect_violation(refusal(r, stream_of()), "report.tensors[0].targets[0].format", "enum");
}

TEST(ServerValidationTest, NoticesAndOutcomesBounded) {
  v1::StepReport r = valid();
  for (int i = 0; i < 17; ++i) r.add_notices("n");
  expect_violation(rejection(r, stream_of()), "report.notices", "too_many");
  r = valid();
  r.add_policy_outcomes()->set_applied(true);
  expect_violation(refusal(r, stream_of()), "report.policy_outcomes[0].policy_id", "string");
}

// StepReport.history: past steps below the report's step in increasing order, full tensors
// only, and flight_event set exactly with it.
TEST(ServerValidationTest, HistoryStepsOrderedBelowTheStepWithFullTensorsAndAnEvent) {
  v1::StepReport base = make_report("run-v", 0, 1, 10, 2);
  ASSERT_EQ(base.tensors(0).level(), v1::STATS_LEVEL_FULL);
  base.set_flight_event(v1::FLIGHT_EVENT_NONFINITE);
  for (std::int64_t step : {6, 8, 9}) {
    v1::HistoryStep* h = base.add_history();
    h->set_step(step);
    h->set_loss_scale(65536.0);
    *h->add_tensors() = base.tensors(0);
  }
  EXPECT_TRUE(passes_whole(base, stream_of()));

  v1::StepReport r = base;
  r.clear_flight_event();
  expect_violation(rejection(r, stream_of()), "report.flight_event", "history");
  r = base;
  r.clear_history();
  expect_violation(rejection(r, stream_of()), "report.flight_event", "history");
  r = base;
  r.set_flight_event(static_cast<v1::FlightEvent>(99));
  expect_violation(rejection(r, stream_of()), "report.flight_event", "enum");
  r = base;
  r.mutable_history(2)->set_step(10);  // not below the report's step
  expect_violation(rejection(r, stream_of()), "report.history[2].step", "range");
  r = base;
  r.mutable_history(1)->set_step(6);  // not increasing
  expect_violation(rejection(r, stream_of()), "report.history[1].step", "range");
  r = base;
  r.mutable_history(0)->set_loss_scale(0.0);
  expect_violation(rejection(r, stream_of()), "report.history[0].loss_scale", "range");
  r = base;
  r.mutable_history(1)->mutable_tensors(0)->set_level(v1::STATS_LEVEL_COUNTS);
  expect_violation(refusal(r, stream_of()), "report.history[1].tensors[0].level", "history");
  r = base;
  r.mutable_history(1)->mutable_tensors(0)->set_name("");
  expect_violation(refusal(r, stream_of()), "report.history[1].tensors[0].name", "string");
}

// Names are UTF-8: any Unicode without control characters is taken as written.
constexpr const char* kUnicodeName = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";

TEST(ServerValidationTest, UnicodeNamesNoticesAndMetadataPassAsWritten) {
  v1::StepReport r = valid();
  r.mutable_tensors(0)->set_name(kUnicodeName);
  r.mutable_first_offender()->set_tensor(kUnicodeName);
  r.add_fp32_layers(kUnicodeName);
  r.add_notices(std::string("trainer: ") + kUnicodeName + " \xf0\x9f\x94\xa5");
  const std::string sent = r.SerializeAsString();
  EXPECT_TRUE(passes_whole(r, stream_of()));
  ASSERT_FALSE(validate_report(r, stream_of()).rejected);
  EXPECT_EQ(r.SerializeAsString(), sent);

  v1::Hello h = make_hello("run-v");
  h.set_host("h\xc3\xb4te-\xe4\xb8\x80");
  h.set_trainer(kUnicodeName);
  h.add_fp32_capable_layers(kUnicodeName);
  EXPECT_FALSE(validate_hello(h).has_value());
  h.set_host("bad\x1b[31mhost");
  expect_violation(validate_hello(h), "hello.host", "string");
  h = make_hello("run-v");
  h.set_trainer("t\xc2\x9b");  // C1 control character CSI
  expect_violation(validate_hello(h), "hello.trainer", "string");
}

TEST(ServerValidationTest, OneBadTensorIsRefusedAloneAndNamedInANotice) {
  v1::StepReport r = make_report("run-v", 0, 1, 0, 3);
  r.mutable_tensors(1)->set_name("bad\x01name");
  const std::string good0 = r.tensors(0).SerializeAsString();
  const std::string good2 = r.tensors(2).SerializeAsString();
  const ReportVerdict v = validate_report(r, stream_of());
  ASSERT_FALSE(v.rejected) << v.rejected->message;
  ASSERT_EQ(v.refused.size(), 1u);
  expect_violation(v.refused[0].violation, "report.tensors[1].name", "string");
  EXPECT_EQ(v.refused[0].notice,
            "server: refused tensor 'bad?name' alone (string at name); the rest of its step is "
            "stored");
  ASSERT_EQ(r.tensors_size(), 2);
  EXPECT_EQ(r.tensors(0).SerializeAsString(), good0);
  EXPECT_EQ(r.tensors(1).SerializeAsString(), good2);

  // Too long a name, and a broken histogram, are refused alike; each notice is the same from
  // step to step.
  r = make_report("run-v", 0, 1, 0, 3);
  r.mutable_tensors(0)->set_name(std::string(257, 'n'));
  v1::BinadeHistogram* h = r.mutable_tensors(2)->mutable_histogram();
  h->set_counts(0, h->counts(0) + 1);
  const ReportVerdict w = validate_report(r, stream_of());
  ASSERT_FALSE(w.rejected);
  ASSERT_EQ(w.refused.size(), 2u);
  expect_violation(w.refused[0].violation, "report.tensors[0].name", "string");
  expect_violation(w.refused[1].violation, "report.tensors[2].histogram.counts", "histogram_total");
  EXPECT_NE(w.refused[1].notice.find("(histogram_total at histogram.counts)"), std::string::npos)
      << w.refused[1].notice;
  ASSERT_EQ(r.tensors_size(), 1);
  EXPECT_EQ(r.tensors(0).name(), make_report("run-v", 0, 1, 0, 3).tensors(1).name());
}

TEST(ServerValidationTest, FirstOffenderNameIsEscapedAndTheStepKept) {
  v1::StepReport r = valid();
  r.mutable_first_offender()->set_tensor("h0\x1b[2Jattn");
  const ReportVerdict v = validate_report(r, stream_of());
  ASSERT_FALSE(v.rejected);
  ASSERT_EQ(v.refused.size(), 1u);
  expect_violation(v.refused[0].violation, "report.first_offender.tensor", "string");
  EXPECT_EQ(r.first_offender().tensor(), "h0\\x1b[2Jattn");
  EXPECT_EQ(v.refused[0].notice,
            "server: first offender 'h0?[2Jattn' (string): stored as 'h0\\x1b[2Jattn'");
  EXPECT_EQ(r.tensors_size(), valid().tensors_size());
}

TEST(ServerValidationTest, BadNoticesLayersAndOutcomesAreRefusedAlone) {
  v1::StepReport r = valid();
  r.add_notices("fine");
  r.add_notices("two\nlines");
  r.add_fp32_layers("h0.mlp");
  r.add_fp32_layers("");
  v1::PolicyOutcome* o = r.add_policy_outcomes();
  o->set_policy_id("7");
  o->set_reason("why\tnot");
  const ReportVerdict v = validate_report(r, stream_of());
  ASSERT_FALSE(v.rejected);
  ASSERT_EQ(v.refused.size(), 3u);
  expect_violation(v.refused[0].violation, "report.fp32_layers[1]", "string");
  expect_violation(v.refused[1].violation, "report.policy_outcomes[0].reason", "string");
  expect_violation(v.refused[2].violation, "report.notices[1]", "string");
  EXPECT_EQ(v.refused[2].notice,
            "server: refused notice 'two?lines' alone (string); the rest of its step is stored");
  ASSERT_EQ(r.notices_size(), 1);
  EXPECT_EQ(r.notices(0), "fine");
  ASSERT_EQ(r.fp32_layers_size(), 1);
  EXPECT_EQ(r.fp32_layers(0), "h0.mlp");
  EXPECT_EQ(r.policy_outcomes_size(), 0);
  EXPECT_EQ(r.tensors_size(), valid().tensors_size());
}

// --- StepReport.quantizers: each entry a part of its own -----------------------------------

// A valid report with one valid quantiser: an MX block recipe's sample, history and all.
v1::StepReport with_quantizer() {
  v1::StepReport r = valid();
  v1::QuantizerStats* q = r.add_quantizers();
  q->set_name("h0.fc.input");
  q->set_role(v1::TENSOR_ROLE_ACTIVATION);
  q->set_phase(v1::TENSOR_PHASE_FORWARD);
  q->set_recipe("mxfp8_e4m3");
  q->set_element(v1::FORMAT_E4M3);
  q->set_values(64);
  q->set_underflow(3);
  q->set_subnormal(5);
  q->set_saturated(1);
  q->set_amax(511);
  q->set_signal_sq(40);
  q->set_error_sq(0.25);
  q->set_blocks(2);
  q->set_zero_blocks(0);
  q->set_saturated_blocks(1);
  q->mutable_scale_histogram()->set_min_exponent(-3);
  q->mutable_scale_histogram()->add_counts(1);
  q->mutable_scale_histogram()->add_counts(1);
  q->add_amax_history(1.5f);
  return r;
}

// Refuses the one quantiser of `r` after `breaks` changed it; the field and reason it names.
void expect_quantizer_refused(void (*breaks)(v1::QuantizerStats&), const std::string& field,
                              const std::string& reason) {
  v1::StepReport r = with_quantizer();
  breaks(*r.mutable_quantizers(0));
  const std::string named = "refused quantizer '" + r.quantizers(0).name() + "' alone (" + reason;
  ReportVerdict v = validate_report(r, stream_of());
  ASSERT_FALSE(v.rejected) << v.rejected->message;
  ASSERT_EQ(v.refused.size(), 1u) << field;
  expect_violation(v.refused[0].violation, "report.quantizers[0]" + field, reason);
  EXPECT_EQ(r.quantizers_size(), 0);
  EXPECT_EQ(r.tensors_size(), valid().tensors_size());  // the rest of the step is kept
  EXPECT_NE(v.refused[0].notice.find(named), std::string::npos) << v.refused[0].notice;
}

TEST(ServerValidationTest, QuantizerRecipeMustBeCanonicalAndMatchItsElement) {
  EXPECT_TRUE(passes_whole(with_quantizer(), stream_of()));
  for (const char* recipe : {"e4m3:current", "e4m3:scale=112", "e4m3:tile=1x128", "nvfp4",
                             "mxfp4", "mxfp8_e4m3:block=32x1", "mxfp8_e4m3:ceil"}) {
    v1::StepReport r = with_quantizer();
    r.mutable_quantizers(0)->set_recipe(recipe);
    const std::optional<Recipe> parsed = parse_recipe(recipe);
    ASSERT_TRUE(parsed.has_value()) << recipe;
    r.mutable_quantizers(0)->set_element(proto::to_proto(parsed->element));
    EXPECT_TRUE(passes_whole(r, stream_of())) << recipe;
  }
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_recipe("fp8"); }, ".recipe",
                           "recipe");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_recipe("MXFP8_E4M3"); }, ".recipe",
                           "recipe");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_recipe(""); }, ".recipe", "string");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_element(v1::FORMAT_E5M2); },
                           ".element", "recipe");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_name(""); }, ".name", "string");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_role(v1::TENSOR_ROLE_UNSPECIFIED); },
                           ".role", "enum");
}

TEST(ServerValidationTest, QuantizerCountsWithinItsValuesAndBlocks) {
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_saturated(65); }, ".saturated",
                           "quantizer_counts");
  // Each within the values, together above them.
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_underflow(60); }, "",
                           "quantizer_counts");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_zero_blocks(3); }, ".blocks",
                           "quantizer_counts");
  expect_quantizer_refused(
      [](v1::QuantizerStats& q) {
        q.set_zero_blocks(1);
        q.set_nan_blocks(2);
      },
      ".blocks", "quantizer_counts");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_saturated_blocks(3); }, ".blocks",
                           "quantizer_counts");
}

TEST(ServerValidationTest, QuantizerMagnitudesHistoryAndScaleHistogramBounded) {
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_amax(kNaN); }, ".amax",
                           "non_finite");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_error_sq(-1); }, ".error_sq",
                           "range");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_tensor_scale(kInf); },
                           ".tensor_scale", "non_finite");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_amax_history(0, -1.0f); },
                           ".amax_history[0]", "range");
  expect_quantizer_refused(
      [](v1::QuantizerStats& q) {
        for (int i = 0; i < 1024; ++i) q.add_amax_history(1.0f);  // 1025 in all
      },
      ".amax_history", "too_many");
  expect_quantizer_refused(
      [](v1::QuantizerStats& q) { q.mutable_scale_histogram()->set_min_exponent(127); },
      ".scale_histogram.min_exponent", "histogram_range");
  // Only blocks that are neither all zero nor NaN have a scale.
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_zero_blocks(1); },
                           ".scale_histogram.counts", "histogram_total");
  // 1024 entries are allowed.
  v1::StepReport r = with_quantizer();
  for (int i = 1; i < 1024; ++i) r.mutable_quantizers(0)->add_amax_history(2.0f);
  EXPECT_TRUE(passes_whole(r, stream_of()));
  // A loss cost is any finite number, negative included (a recipe's rounding can lower the loss
  // to first order).
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_loss_cost(kNaN); }, ".loss_cost",
                           "non_finite");
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_loss_cost(-kInf); }, ".loss_cost",
                           "non_finite");
  r = with_quantizer();
  r.mutable_quantizers(0)->set_loss_cost(-2.5e-3);
  EXPECT_TRUE(passes_whole(r, stream_of()));
}

TEST(ServerValidationTest, PerLayerPrecisionNamesOnlyTheHellosLayers) {
  v1::Hello h = make_hello("run-v");
  h.add_bf16_capable_gemms("h1.mlp.fc");
  h.add_bf16_capable_gemms("h0.attn.qkv");
  EXPECT_FALSE(validate_hello(h).has_value());
  const StreamIdentity stream = stream_identity(h);
  EXPECT_EQ(stream.bf16_capable_gemms, (std::vector<std::string>{"h0.attn.qkv", "h1.mlp.fc"}));
  v1::Hello bad = h;
  bad.add_bf16_capable_gemms("");
  expect_violation(validate_hello(bad), "hello.bf16_capable_gemms[2]", "string");
  for (int i = 0; i < 4097; ++i) bad.add_bf16_capable_gemms("l" + std::to_string(i));
  expect_violation(validate_hello(bad), "hello.bf16_capable_gemms", "too_many");

  // A quantiser's layer: none, or one of the Hello's; another is refused alone.
  v1::StepReport r = with_quantizer();
  r.mutable_quantizers(0)->set_layer("h1.mlp.fc");
  r.mutable_quantizers(0)->set_what_if(true);
  EXPECT_TRUE(passes_whole(r, stream));
  r.mutable_quantizers(0)->set_layer("h2.mlp.fc");
  ReportVerdict v = validate_report(r, stream);
  ASSERT_FALSE(v.rejected);
  ASSERT_EQ(v.refused.size(), 1u);
  expect_violation(v.refused[0].violation, "report.quantizers[0].layer", "layer");
  EXPECT_EQ(v.refused[0].violation.message,
            "report.quantizers[0].layer: 'h2.mlp.fc' is not one of the Hello's "
            "bf16_capable_gemms");
  EXPECT_EQ(v.refused[0].notice,
            "server: refused quantizer 'h0.fc.input' alone (layer at layer); the rest of its "
            "step is stored");
  EXPECT_EQ(r.quantizers_size(), 0);
  EXPECT_EQ(r.tensors_size(), valid().tensors_size());
  // A Hello without the list: every named layer is refused.
  expect_quantizer_refused([](v1::QuantizerStats& q) { q.set_layer("h1.mlp.fc"); }, ".layer",
                           "layer");

  // StepReport.bf16_gemms: names like fp32_layers, a bad one refused alone, bounded.
  r = valid();
  r.add_bf16_gemms("h1.mlp.fc");
  r.add_bf16_gemms("bad\x01");
  v = validate_report(r, stream);
  ASSERT_FALSE(v.rejected);
  ASSERT_EQ(v.refused.size(), 1u);
  expect_violation(v.refused[0].violation, "report.bf16_gemms[1]", "string");
  ASSERT_EQ(r.bf16_gemms_size(), 1);
  EXPECT_EQ(r.bf16_gemms(0), "h1.mlp.fc");
  r = valid();
  for (int i = 0; i < 4097; ++i) r.add_bf16_gemms("l" + std::to_string(i));
  expect_violation(rejection(r, stream), "report.bf16_gemms", "too_many");
}

TEST(ServerValidationTest, QuantizerCountBoundedForTheReport) {
  v1::StepReport r = with_quantizer();
  for (int i = 0; i < limits::kMaxQuantizersPerReport; ++i) {
    *r.add_quantizers() = r.quantizers(0);
  }
  expect_violation(rejection(r, stream_of()), "report.quantizers", "too_many");
}

TEST(ServerValidationTest, ARejectedReportIsLeftAsItCame) {
  v1::StepReport r = valid();
  r.set_seq(0);
  r.mutable_tensors(0)->set_name("bad\x01");
  const std::string sent = r.SerializeAsString();
  const ReportVerdict v = validate_report(r, stream_of());
  expect_violation(v.rejected, "report.seq", "seq_order");
  EXPECT_TRUE(v.refused.empty());
  EXPECT_EQ(r.SerializeAsString(), sent);
}

}  // namespace
}  // namespace ampscope::server
