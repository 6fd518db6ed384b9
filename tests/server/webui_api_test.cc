// The web UI's JSON API (WebApi) over a store with known reports (webui_fixture.h): the runs
// list with status and alerts, a run's downsampled series, a tensor's columns in the unscaled
// domain, `since`, and the errors that name their parameter. The alert thresholds are checked
// against dashboards/prometheus/alerts.yml.
#include "webui_api.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "policy_wire.h"
#include "sqlite_connection.h"
#include "webui_fixture.h"

namespace ampscope::server {
namespace {

using nlohmann::json;
using webui_fixture::kSecond;
using webui_fixture::now_ns;
using Params = std::multimap<std::string, std::string>;

class NullSink : public StreamSink {
 public:
  void on_settled(std::uint64_t, int, const std::vector<v1::PolicyUpdate>&) override {}
  void on_policy(const v1::PolicyUpdate&) override {}
  void on_store_failure(const std::string&) override {}
  void on_run_deleted(const std::string&) override {}
  void drain() override {}
};

// A report of one FP16 weight gradient with `checked` values of which `underflow` flush.
v1::StepReport simple_report(const std::string& run, std::int64_t step, std::uint64_t checked,
                             std::uint64_t underflow) {
  v1::StepReport r;
  r.set_run_id(run);
  r.set_seq(static_cast<std::uint64_t>(step + 1));
  r.set_step(step);
  r.set_loss(1.0);
  r.set_loss_scale(1024.0);
  r.set_scale_after(1024.0);
  *r.add_tensors() = testing::crafted_tensor("w.grad", v1::TENSOR_ROLE_WEIGHT_GRAD, -10, {checked},
                                             1024.0, 0, 0, underflow);
  return r;
}

class WebApiTest : public ::testing::Test {
 protected:
  WebApiTest() : writer_(StoreOptions{(dir_ / "store.db").string(), true}), registry_(16) {}

  // A run of `steps` reports (rank 0), each edited by `edit`, received `age_ns` ago.
  void write_run(const std::string& run, std::int64_t steps,
                 const std::function<void(v1::StepReport&)>& edit,
                 std::int64_t age_ns = 60 * kSecond) {
    const std::int64_t at = now_ns() - age_ns;
    writer_.begin();
    writer_.upsert_run(testing::make_hello(run), at);
    writer_.upsert_agent(testing::make_hello(run), at);
    for (std::int64_t step = 0; step < steps; ++step) {
      v1::StepReport r = simple_report(run, step, 100, 0);
      edit(r);
      writer_.insert_report(r, r.SerializeAsString(), at);
    }
    writer_.commit();
  }
  void connect(const std::string& run, std::uint32_t rank = 0) {
    sinks_.push_back(std::make_shared<NullSink>());
    ASSERT_FALSE(streams_.claim(run, rank, AgentProcess{"h", 1, 1}, sinks_.back()).has_value());
  }
  json get(const std::string& path, const Params& params = {}, int status = 200) {
    const ApiResponse r = api().handle(path, params);
    EXPECT_EQ(r.status, status) << path << ": " << r.body;
    return json::parse(r.body);
  }
  WebApi api() {
    if (!reader_) reader_ = std::make_unique<StoreReader>((dir_ / "store.db").string());
    return WebApi(*reader_, streams_, registry_);
  }
  // The alerts of `run` in the runs list, by name.
  std::set<std::string> alerts_of(const std::string& run) {
    std::set<std::string> names;
    const json runs = get("/runs");
    for (const json& row : runs["runs"]) {
      if (row["run_id"] != run) continue;
      for (const json& a : row["alerts"]) names.insert(a["name"].get<std::string>());
    }
    return names;
  }

  testing::TempDir dir_;
  StoreWriter writer_;
  StreamTable streams_;
  RunRegistry registry_;
  std::vector<std::shared_ptr<NullSink>> sinks_;
  std::unique_ptr<StoreReader> reader_;
};

TEST_F(WebApiTest, RunsListHasStatusFromTheLiveStreams) {
  webui_fixture::write_web_run(writer_, 10 * kSecond);
  write_run(
      "quiet", 3, [](v1::StepReport&) {}, 120 * kSecond);
  write_run(
      "done", 3, [](v1::StepReport&) {}, 30 * kSecond);
  connect("web");
  connect("quiet");
  const json runs = get("/runs");
  EXPECT_TRUE(runs["now_unix_ns"].is_number_integer());
  ASSERT_EQ(runs["runs"].size(), 3u);
  // Most recently seen first.
  EXPECT_EQ(runs["runs"][0]["run_id"], "web");
  EXPECT_EQ(runs["runs"][0]["status"], "training");
  EXPECT_EQ(runs["runs"][1]["run_id"], "done");
  EXPECT_EQ(runs["runs"][1]["status"], "finished");
  EXPECT_EQ(runs["runs"][2]["status"], "silent");
  const json& web = runs["runs"][0];
  EXPECT_EQ(web["world_size"], 2);
  EXPECT_EQ(web["compute_format"], "fp16");
  EXPECT_EQ(web["policy_mode"], "headroom");
  EXPECT_EQ(web["first_step"], 0);
  EXPECT_EQ(web["last_step"], 9);
  EXPECT_EQ(web["steps"], 10);
  EXPECT_EQ(web["reports"], 19);
  EXPECT_EQ(web["skipped_steps"], 2);
  EXPECT_EQ(web["loss"], 1.0);  // step 9, rank 0
  EXPECT_EQ(web["loss_scale"], 24576.0);
  EXPECT_EQ(web["agents_connected"], 1);
  // NaN in a weight (step 3) and a NaN loss (step 6, rank 1), both critical; the activation
  // gradients' +Inf is the scaler's business, their underflow (10%) is a warning.
  std::multiset<std::string> names;
  for (const json& a : web["alerts"]) {
    names.insert(a["name"].get<std::string>());
    EXPECT_EQ(a["severity"], a["name"] == "AmpscopeUnderflowHigh" ? "warning" : "critical");
    EXPECT_FALSE(a["summary"].get<std::string>().empty());
  }
  EXPECT_EQ(names, (std::multiset<std::string>{"AmpscopeNonFiniteValues", "AmpscopeNonFiniteValues",
                                               "AmpscopeUnderflowHigh"}));
}

TEST_F(WebApiTest, CountSeriesOfZerosAreLeftOut) {
  // Tensors without a target format, all finite (weight gradients after unscaling), give a
  // series of zeros under format "none": it says nothing, so it is not sent. The same tensors
  // with a NaN are sent (the NaN is a count).
  const std::int64_t at = webui_fixture::now_ns();
  writer_.begin();
  const v1::Hello hello = testing::make_hello("plain", 0, 1);
  writer_.upsert_run(hello, at);
  writer_.upsert_agent(hello, at);
  for (std::int64_t step = 0; step < 3; ++step) {
    v1::StepReport r = webui_fixture::web_report(0, step);
    r.set_run_id("plain");
    r.clear_tensors();
    *r.add_tensors() = webui_fixture::fc_weight(1.0, true);
    v1::TensorStats untargeted = webui_fixture::fc_weight(1.0, true);
    untargeted.set_name("h0.mlp.fc.weight.unscaled");
    untargeted.clear_targets();
    *r.add_tensors() = untargeted;
    if (step == 2) {
      untargeted.set_role(v1::TENSOR_ROLE_ACTIVATION);
      untargeted.set_name("h0.mlp.fc");
      untargeted.set_nan(3);
      *r.add_tensors() = untargeted;
    }
    writer_.insert_report(r, r.SerializeAsString(), at);
  }
  writer_.commit();
  connect("plain");
  const json run = get("/runs/plain");
  ASSERT_EQ(run["counts"].size(), 2u) << run["counts"];
  EXPECT_EQ(run["counts"][0]["role"], "activation");  // by role, then format
  EXPECT_EQ(run["counts"][0]["format"], "none");
  EXPECT_EQ(run["counts"][0]["step"], json({2}));
  EXPECT_EQ(run["counts"][0]["nonfinite"], json({3}));
  EXPECT_EQ(run["counts"][1]["role"], "weight_grad");
  EXPECT_EQ(run["counts"][1]["format"], "fp16");
}

TEST_F(WebApiTest, RunAnswerIsDownsampledToTheWidth) {
  webui_fixture::write_web_run(writer_);
  connect("web", 1);
  json run = get("/runs/web", {{"width", "10"}});
  EXPECT_EQ(run["run"]["run_id"], "web");
  EXPECT_EQ(run["run"]["alerts"].size(), 3u);  // as in the runs list
  EXPECT_EQ(run["range"], json({{"first_step", 0},
                                {"last_step", 9},
                                {"from", 0},
                                {"to", 9},
                                {"bucket_steps", 1},
                                {"buckets", 10}}));
  const json& steps = run["steps"];
  ASSERT_EQ(steps["step"].size(), 10u);
  EXPECT_EQ(steps["step"][6], 6);
  EXPECT_EQ(steps["loss"][6], 4.0);  // rank 1's NaN left out
  EXPECT_TRUE(steps["val_loss"][0].is_null());
  EXPECT_EQ(steps["val_loss"][4], 7.5);
  EXPECT_EQ(steps["scale_last"][8], 24576.0);
  EXPECT_EQ(steps["skipped"][5], 1);
  EXPECT_EQ(steps["found_inf"][6], 1);
  // Width clamped to at least 10 points.
  run = get("/runs/web", {{"width", "4"}});
  EXPECT_EQ(run["range"]["bucket_steps"], 1);
  run = get("/runs/web", {{"width", "4"}, {"from", "0"}, {"to", "99"}});
  EXPECT_EQ(run["range"]["bucket_steps"], 10);
  EXPECT_EQ(run["steps"]["reports"][0], 19);
  run = get("/runs/web", {{"from", "2"}, {"to", "7"}});
  EXPECT_EQ(run["range"]["from"], 2);
  EXPECT_EQ(run["run"]["alerts"].size(), 3u);  // the window, whatever the range
  EXPECT_EQ(run["steps"]["step"].size(), 6u);

  run = get("/runs/web");
  ASSERT_EQ(run["counts"].size(), 4u);
  const json& fc = run["counts"][3];
  EXPECT_EQ(fc["role"], "weight_grad");
  EXPECT_EQ(fc["format"], "fp16");
  std::uint64_t checked = 0;
  for (const json& c : fc["checked"]) checked += c.get<std::uint64_t>();
  EXPECT_EQ(checked, 1140u);
  EXPECT_EQ(run["counts"][0]["role"], "weight");
  EXPECT_EQ(run["counts"][0]["format"], "bf16");
  EXPECT_EQ(run["counts"][1]["nonfinite"][5], 4);

  ASSERT_EQ(run["ranks"].size(), 2u);
  EXPECT_EQ(run["ranks"][0]["tensor_core_active_ratio"][0], 0.5);
  EXPECT_TRUE(run["ranks"][1]["tensor_core_active_ratio"][0].is_null());
  EXPECT_EQ(run["ranks"][1]["step_time_s"][0], 0.375);

  ASSERT_EQ(run["skips"].size(), 2u);
  EXPECT_EQ(run["skips"][0]["step"], 5);
  EXPECT_EQ(run["skips"][0]["offender"], "h0.mlp.fc.weight");
  EXPECT_EQ(run["skips"][0]["scale_after"], 32768.0);
  EXPECT_FALSE(run["skips"][0]["why"].get<std::string>().empty());
  EXPECT_EQ(run["scale_changes"].size(), 3u);
  ASSERT_EQ(run["offenders"].size(), 3u);
  EXPECT_EQ(run["offenders"][2], json({{"step", 6},
                                       {"rank", 1},
                                       {"tensor", "h1.attn.out"},
                                       {"role", "activation_grad"},
                                       {"phase", "backward"},
                                       {"order", 3},
                                       {"micro_step", 0}}));
  ASSERT_EQ(run["decisions"].size(), 1u);
  const json& d = run["decisions"][0];
  EXPECT_EQ(d["effective_from_step"], 6);
  EXPECT_EQ(d["mode"], "headroom");
  EXPECT_EQ(d["reason"], "headroom: test");
  EXPECT_EQ(d["update"], json({{"loss_scale", 32768.0},
                               {"bf16_gemms", json::array({"h1.mlp.fc"})},
                               {"amax_history_length", 8}}));
  EXPECT_EQ(d["applications"].size(), 2u);
  EXPECT_EQ(run["tensors"][0]["name"], "h1.attn.out");
  EXPECT_EQ(run["tensors"][0]["underflow_ratio"], 0.1);
  ASSERT_EQ(run["agents"].size(), 2u);
  EXPECT_EQ(run["agents"][0]["connected"], false);
  EXPECT_EQ(run["agents"][1]["connected"], true);
  EXPECT_TRUE(run["agents"][0]["counters"].contains("dropped_reports"));
  EXPECT_TRUE(run["divergences"].empty());
  EXPECT_EQ(run["run"]["agents_connected"], 1);
}

TEST_F(WebApiTest, SinceAnswersUnchangedUntilANewReport) {
  webui_fixture::write_web_run(writer_);
  const std::int64_t max_id = get("/runs/web")["max_report_id"];
  EXPECT_EQ(get("/runs/web", {{"since", std::to_string(max_id)}}),
            json({{"unchanged", true}, {"max_report_id", max_id}}));
  EXPECT_TRUE(get("/runs/web", {{"since", std::to_string(max_id - 1)}}).contains("steps"));
  write_run("other", 1, [](v1::StepReport&) {});  // another run's report changes nothing
  EXPECT_TRUE(get("/runs/web", {{"since", std::to_string(max_id)}})["unchanged"]);
  writer_.begin();
  v1::StepReport r = webui_fixture::web_report(1, 9);
  writer_.insert_report(r, r.SerializeAsString(), now_ns());
  writer_.commit();
  const json now = get("/runs/web", {{"since", std::to_string(max_id)}});
  EXPECT_FALSE(now.contains("unchanged"));
  EXPECT_GT(now["max_report_id"].get<std::int64_t>(), max_id);
}

TEST_F(WebApiTest, TensorColumnsAreInTheUnscaledDomain) {
  webui_fixture::write_web_run(writer_);
  const json t = get("/runs/web/tensor",
                     {{"name", "h0.mlp.fc.weight"}, {"role", "weight_grad"}, {"width", "10"}});
  EXPECT_EQ(t["name"], "h0.mlp.fc.weight");
  EXPECT_EQ(t["role"], "weight_grad");
  EXPECT_EQ(t["phase"], "backward");
  EXPECT_EQ(t["dtype"], "fp16");
  EXPECT_EQ(t["format"], "fp16");
  EXPECT_EQ(t["range"]["buckets"], 10);
  ASSERT_EQ(t["formats"].size(), 4u);
  EXPECT_EQ(t["formats"][0], json({{"name", "fp16"},
                                   {"max", 65504.0},
                                   {"min_normal", 6.103515625e-05},
                                   {"min_subnormal", 5.960464477539063e-08},
                                   {"max_exponent", 15},
                                   {"min_normal_exponent", -14},
                                   {"min_subnormal_exponent", -24}}));
  EXPECT_EQ(t["formats"][2]["name"], "e4m3");
  EXPECT_EQ(t["formats"][2]["max"], 448.0);
  const json& columns = t["columns"];
  ASSERT_EQ(columns.size(), 6u);
  // Binade exponents shifted by -log2(scale): 2^16 at step 0, 2^15 at 6 and 7 (the flight
  // recorder's), and floor(log2(24576)) = 14 at step 8, marked approximate.
  const int shifts[] = {16, 16, 16, 15, 15, 14};
  const std::int64_t steps[] = {0, 2, 4, 6, 7, 8};
  for (std::size_t i = 0; i < 6; ++i) {
    const json& c = columns[i];
    EXPECT_EQ(c["step"], steps[i]);
    EXPECT_EQ(c["histogram"]["min_exponent"], webui_fixture::kScaledMinExponent - shifts[i]);
    EXPECT_EQ(c["histogram"].contains("approximate_shift"), steps[i] == 8);
    EXPECT_EQ(c["from_flight_recorder"], steps[i] == 7);
    EXPECT_EQ(c["loss_scale"], webui_fixture::scale_at(steps[i]));
  }
  EXPECT_EQ(columns[0]["histogram"]["counts"], json({10, 20, 30}));
  EXPECT_EQ(columns[0]["max_abs"], 0.375 / 65536.0);
  EXPECT_EQ(columns[0]["min_abs_nonzero"], 0.0625 / 65536.0);
  EXPECT_EQ(columns[0]["targets"][0], json({{"format", "fp16"},
                                            {"scale_log2", 0},
                                            {"overflow", 0},
                                            {"underflow", 2},
                                            {"subnormal", 5}}));
  EXPECT_EQ(columns[0]["numel"], 63);

  const json unscaled =
      get("/runs/web/tensor",
          {{"name", "h0.mlp.fc.weight"}, {"role", "weight_grad"}, {"phase", "after_unscale"}});
  EXPECT_EQ(unscaled["phase"], "after_unscale");
  ASSERT_EQ(unscaled["columns"].size(), 1u);
  EXPECT_EQ(unscaled["columns"][0]["histogram"]["min_exponent"], -20);
  EXPECT_EQ(unscaled["format"], "fp32");

  // The largest step there is: the buckets' arithmetic stays within int64.
  const json far = get("/runs/web/tensor", {{"name", "h0.mlp.fc.weight"},
                                            {"role", "weight_grad"},
                                            {"to", "9223372036854775807"},
                                            {"width", "10"}});
  ASSERT_EQ(far["columns"].size(), 1u);  // every step of the run in the first bucket
  EXPECT_EQ(far["columns"][0]["step"], 8);
  EXPECT_EQ(get("/runs/web", {{"to", "9223372036854775807"}})["steps"]["reports"][0], 19);

  const json none = get("/runs/web/tensor", {{"name", "nothing"}, {"role", "weight"}});
  EXPECT_TRUE(none["columns"].empty());
  EXPECT_TRUE(none["dtype"].is_null());
}

// A quantiser of one GEMM input: `recipe`, its element, underflow `underflow` of 64 values.
v1::QuantizerStats quantizer(const std::string& name, v1::TensorRole role,
                             const std::string& recipe, v1::Format element,
                             std::uint64_t underflow) {
  v1::QuantizerStats q;
  q.set_name(name);
  q.set_role(role);
  q.set_phase(v1::TENSOR_PHASE_BACKWARD);
  q.set_recipe(recipe);
  q.set_element(element);
  q.set_values(64);
  q.set_underflow(underflow);
  q.set_amax(5.0);
  q.set_signal_sq(4.0);
  q.set_error_sq(0.04);
  return q;
}

TEST(QuantizesTensorTest, SameNameAUseOrARecipeTargetButNotALongerName) {
  EXPECT_TRUE(quantizes_tensor("h0.fc.input", "h0.fc.input"));
  EXPECT_TRUE(quantizes_tensor("h0.fc.input@wgrad", "h0.fc.input"));
  EXPECT_TRUE(quantizes_tensor("h0.fc.input [nvfp4]", "h0.fc.input"));
  EXPECT_FALSE(quantizes_tensor("h0.fc.input2", "h0.fc.input"));
  EXPECT_FALSE(quantizes_tensor("h0.fc", "h0.fc.input"));
}

// A tensor's page gets the samples of its quantisers (one per bucket, with the loss scale their
// input carried) and their totals; the run's page every quantiser and the latest BF16 GEMMs.
TEST_F(WebApiTest, QuantizersOfATensorCarryTheirRecipeSamplesAndTotals) {
  write_run("fp4", 4, [](v1::StepReport& r) {
    const auto u = static_cast<std::uint64_t>(r.step()) + 2;
    v1::QuantizerStats mx = quantizer("h0.fc.output_grad", v1::TENSOR_ROLE_ACTIVATION_GRAD,
                                      "mxfp8_e4m3", v1::FORMAT_E4M3, u);
    mx.set_blocks(3);
    mx.mutable_scale_histogram()->set_min_exponent(-3);
    for (const std::uint64_t n : {2, 0, 1}) mx.mutable_scale_histogram()->add_counts(n);
    if (r.step() % 2 == 1) mx.set_loss_cost(0.01 * static_cast<double>(r.step()));  // 1 and 3
    *r.add_quantizers() = mx;
    *r.add_quantizers() = quantizer("h0.fc.output_grad@wgrad", v1::TENSOR_ROLE_ACTIVATION_GRAD,
                                    "mxfp4", v1::FORMAT_E2M1, 1);
    // Another tensor of a longer name, and the same name in another role: not this tensor's.
    *r.add_quantizers() = quantizer("h0.fc.output_grad2", v1::TENSOR_ROLE_ACTIVATION_GRAD, "mxfp4",
                                    v1::FORMAT_E2M1, 1);
    *r.add_quantizers() =
        quantizer("h0.fc.output_grad", v1::TENSOR_ROLE_ACTIVATION, "mxfp4", v1::FORMAT_E2M1, 1);
    v1::QuantizerStats delayed =
        quantizer("h0.fc.input", v1::TENSOR_ROLE_ACTIVATION, "e4m3:scale=16", v1::FORMAT_E4M3, 0);
    delayed.set_tensor_scale(16.0);
    delayed.add_amax_history(1.0f);
    delayed.add_amax_history(2.0f);
    *r.add_quantizers() = delayed;
    if (r.step() == 3) r.add_bf16_gemms("h0.fc");
  });
  const json t = get("/runs/fp4/tensor",
                     {{"name", "h0.fc.output_grad"}, {"role", "activation_grad"}, {"width", "10"}});
  const json& qs = t["quantizers"];
  ASSERT_EQ(qs.size(), 2u) << qs.dump();
  const json& mx = qs[0];
  EXPECT_EQ(mx["name"], "h0.fc.output_grad");
  EXPECT_EQ(mx["recipe"], "mxfp8_e4m3");
  EXPECT_EQ(mx["scaling"], "mx");
  EXPECT_EQ(mx["block"], true);
  EXPECT_EQ(mx["element"]["name"], "e4m3");
  EXPECT_EQ(mx["element"]["max"], 448.0);
  EXPECT_EQ(mx["element"]["min_normal_exponent"], -6);
  EXPECT_EQ(mx["element"]["min_subnormal_exponent"], -9);
  ASSERT_EQ(mx["samples"].size(), 4u);
  const json& last = mx["samples"][3];
  EXPECT_EQ(last["step"], 3);
  EXPECT_EQ(last["loss_scale"], 1024.0);  // an activation gradient carries the loss scale
  EXPECT_EQ(last["underflow"], 5);
  EXPECT_EQ(last["scale_histogram"], json({{"min_exponent", -3}, {"counts", {2, 0, 1}}}));
  EXPECT_NEAR(last["sqnr_db"].get<double>(), 20.0, 1e-9);
  EXPECT_EQ(last["exact"], false);
  EXPECT_EQ(last["loss_cost"], 0.03);
  EXPECT_TRUE(mx["samples"][2]["loss_cost"].is_null());  // step 2 measured none
  EXPECT_EQ(mx["totals"]["samples"], 4);
  EXPECT_EQ(mx["totals"]["loss_cost_samples"], 2);
  EXPECT_NEAR(mx["totals"]["loss_cost_mean"].get<double>(), 0.02, 1e-15);
  EXPECT_NEAR(mx["totals"]["loss_cost_stddev"].get<double>(), 0.01 * std::sqrt(2.0), 1e-15);
  EXPECT_EQ(mx["totals"]["underflow"], 2 + 3 + 4 + 5);
  EXPECT_EQ(mx["totals"]["scale_min_exponent"], -3);
  EXPECT_EQ(mx["totals"]["scale_max_exponent"], -1);
  EXPECT_EQ(qs[1]["name"], "h0.fc.output_grad@wgrad");
  EXPECT_EQ(qs[1]["element"]["name"], "e2m1");
  EXPECT_EQ(qs[1]["element"]["max"], 6.0);

  const json input =
      get("/runs/fp4/tensor", {{"name", "h0.fc.input"}, {"role", "activation"}, {"width", "10"}});
  ASSERT_EQ(input["quantizers"].size(), 1u);
  const json& d = input["quantizers"][0];
  EXPECT_EQ(d["scaling"], "delayed");
  EXPECT_EQ(d["block"], false);
  EXPECT_EQ(d["samples"][0]["loss_scale"], 1.0);  // an activation carries none
  EXPECT_EQ(d["samples"][0]["tensor_scale"], 16.0);
  EXPECT_TRUE(d["samples"][0]["scale_histogram"].is_null());
  EXPECT_EQ(d["samples"][0]["amax_history"], json({1.0, 2.0}));
  EXPECT_EQ(d["totals"]["tensor_scale_max"], 16.0);
  EXPECT_EQ(d["totals"]["loss_cost_samples"], 0);
  EXPECT_TRUE(d["totals"]["loss_cost_mean"].is_null());

  const json run = get("/runs/fp4");
  EXPECT_EQ(run["quantizers"].size(), 5u);
  EXPECT_EQ(run["bf16_gemms"], json({"h0.fc"}));
  EXPECT_EQ(run["bf16_gemms_step"], 3);
}

// Names are UTF-8 and the JSON carries them as written: the tensors list, a skipped step's and
// the first offenders' tensor, the tensor page asked by that name, the agent's host.
TEST_F(WebApiTest, UnicodeNamesAreInTheJsonAsWritten) {
  const std::string name = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";
  write_run("utf8", 3, [&](v1::StepReport& r) {
    r.mutable_tensors(0)->set_name(name);
    if (r.step() == 1) {
      r.set_found_inf(true);
      r.set_skipped(true);
      r.mutable_first_offender()->set_tensor(name);
      r.mutable_first_offender()->set_role(v1::TENSOR_ROLE_WEIGHT_GRAD);
    }
  });
  TensorTotals totals;
  totals.run_id = "utf8";
  totals.name = name;
  totals.role = v1::TENSOR_ROLE_WEIGHT_GRAD;
  totals.format = v1::FORMAT_FP16;
  totals.samples = 3;
  totals.values = 300;
  totals.max_abs = 1.0;
  totals.last_step = 2;
  writer_.begin();
  writer_.add_tensor_totals(totals);
  writer_.commit();

  const json run = get("/runs/utf8");
  ASSERT_EQ(run["tensors"].size(), 1u) << run.dump();
  EXPECT_EQ(run["tensors"][0]["name"], name);
  ASSERT_EQ(run["skips"].size(), 1u) << run.dump();
  EXPECT_EQ(run["skips"][0]["offender"], name);
  ASSERT_EQ(run["offenders"].size(), 1u) << run.dump();
  EXPECT_EQ(run["offenders"][0]["tensor"], name);
  // The body itself holds the UTF-8 bytes (not \u escapes, not replacement characters).
  EXPECT_NE(api().handle("/runs/utf8", {}).body.find("\"" + name + "\""), std::string::npos);

  const json t = get("/runs/utf8/tensor", {{"name", name}, {"role", "weight_grad"}});
  EXPECT_EQ(t["name"], name);
  EXPECT_EQ(t["columns"].size(), 3u);
}

TEST_F(WebApiTest, BadParametersAreNamedAndUnknownRunsAre404) {
  webui_fixture::write_web_run(writer_);
  const auto error = [&](const std::string& path, const Params& params, int status) {
    return get(path, params, status)["error"].get<std::string>();
  };
  EXPECT_EQ(error("/runs/web", {{"width", "wide"}}, 400).rfind("width:", 0), 0u);
  EXPECT_EQ(error("/runs/web", {{"from", "-1"}}, 400).rfind("from:", 0), 0u);
  EXPECT_EQ(error("/runs/web", {{"to", "x"}}, 400).rfind("to:", 0), 0u);
  EXPECT_EQ(error("/runs/web", {{"from", "5"}, {"to", "4"}}, 400).rfind("to:", 0), 0u);
  EXPECT_EQ(error("/runs/web", {{"since", "1e3"}}, 400).rfind("since:", 0), 0u);
  EXPECT_EQ(error("/runs/web/tensor", {{"role", "weight"}}, 400).rfind("name:", 0), 0u);
  EXPECT_EQ(error("/runs/web/tensor", {{"name", "a"}}, 400).rfind("role:", 0), 0u);
  EXPECT_EQ(error("/runs/web/tensor", {{"name", "a"}, {"role", "grad"}}, 400).rfind("role:", 0),
            0u);
  EXPECT_EQ(error("/runs/web/tensor", {{"name", "a"}, {"role", "weight"}, {"phase", "x"}}, 400)
                .rfind("phase:", 0),
            0u);
  EXPECT_EQ(error("/runs/web/tensor", {{"name", "a"}, {"role", "weight"}, {"width", "?"}}, 400)
                .rfind("width:", 0),
            0u);
  EXPECT_EQ(error("/runs/nope", {}, 404), "unknown run 'nope'");
  EXPECT_EQ(error("/runs/nope", {{"since", "3"}}, 404), "unknown run 'nope'");
  EXPECT_EQ(error("/runs/nope/tensor", {{"name", "a"}, {"role", "weight"}}, 404),
            "unknown run 'nope'");
  get("/nothing", {}, 404);
  get("/runs/web/other", {}, 404);
}

TEST_F(WebApiTest, StoreFailureIs500) {
  webui_fixture::write_web_run(writer_);
  get("/runs/web");  // opens the reader
  {
    SqliteConnection c((dir_ / "store.db").string(), false, false);
    c.exec("DROP TABLE report_counts");
  }
  const json e = get("/runs/web", {}, 500);
  EXPECT_NE(e["error"].get<std::string>().find("report_counts"), std::string::npos) << e;
}

TEST_F(WebApiTest, AlertsFireAboveTheirThresholdsAndNotAtThem) {
  // Underflow: 6 of 100 checked values is above 5%, 5 of 100 is not.
  write_run("uf-above", 1,
            [](v1::StepReport& r) { r.mutable_tensors(0)->mutable_targets(0)->set_underflow(6); });
  write_run("uf-at", 1,
            [](v1::StepReport& r) { r.mutable_tensors(0)->mutable_targets(0)->set_underflow(5); });
  EXPECT_EQ(alerts_of("uf-above"), (std::set<std::string>{"AmpscopeUnderflowHigh"}));
  EXPECT_TRUE(alerts_of("uf-at").empty());

  // Skipped steps: more than 5% and more than 2 of them.
  const auto skip_first = [](std::int64_t n) {
    return [n](v1::StepReport& r) { r.set_skipped(r.step() < n); };
  };
  write_run("skip-above", 58, skip_first(3));  // 3/58 > 5%
  write_run("skip-at", 60, skip_first(3));     // 3/60 = 5%
  write_run("skip-few", 20, skip_first(2));    // 10%, but only 2
  write_run("skip-three", 20, skip_first(3));  // 15% and 3
  EXPECT_EQ(alerts_of("skip-above"), (std::set<std::string>{"AmpscopeSkippedStepsHigh"}));
  EXPECT_TRUE(alerts_of("skip-at").empty());
  EXPECT_TRUE(alerts_of("skip-few").empty());
  EXPECT_EQ(alerts_of("skip-three"), (std::set<std::string>{"AmpscopeSkippedStepsHigh"}));

  // Loss scale below 1 at the latest step (earlier steps do not count).
  write_run("scale-low", 3, [](v1::StepReport& r) { r.set_loss_scale(r.step() == 2 ? 0.5 : 1.0); });
  write_run("scale-one", 3, [](v1::StepReport& r) { r.set_loss_scale(r.step() == 2 ? 1.0 : 0.5); });
  EXPECT_EQ(alerts_of("scale-low"), (std::set<std::string>{"AmpscopeLossScaleCollapsed"}));
  EXPECT_TRUE(alerts_of("scale-one").empty());

  // Non-finite values outside the gradients, or a non-finite loss.
  const auto with_nan = [](v1::TensorRole role) {
    return [role](v1::StepReport& r) {
      v1::TensorStats* t = r.mutable_tensors(0);
      t->set_role(role);
      t->set_nan(1);
      t->set_numel(t->numel() + 1);
    };
  };
  write_run("nan-weight", 1, with_nan(v1::TENSOR_ROLE_WEIGHT));
  write_run("nan-grad", 1, with_nan(v1::TENSOR_ROLE_WEIGHT_GRAD));
  write_run("nan-loss", 1, [](v1::StepReport& r) { r.set_loss(std::nan("")); });
  EXPECT_EQ(alerts_of("nan-weight"), (std::set<std::string>{"AmpscopeNonFiniteValues"}));
  EXPECT_TRUE(alerts_of("nan-grad").empty());
  EXPECT_EQ(alerts_of("nan-loss"), (std::set<std::string>{"AmpscopeNonFiniteValues"}));
  const json runs = get("/runs");
  for (const json& row : runs["runs"]) {
    if (row["run_id"] == "nan-loss") {
      EXPECT_TRUE(row["loss"].is_null()) << row;  // NaN -> null
    }
  }

  // A divergence stored at a step of the window.
  write_run("diverge", 2, [](v1::StepReport&) {});
  MergedStep m;
  m.step = 1;
  m.ranks = {0};
  m.report_ids = {1};
  v1::RankDivergence& d = m.divergences.emplace_back();
  d.set_step(1);
  d.set_field("loss_scale");
  writer_.begin();
  writer_.insert_merged_step("diverge", m);
  writer_.commit();
  EXPECT_EQ(alerts_of("diverge"), (std::set<std::string>{"AmpscopeRankDivergence"}));

  // Nothing fires over reports older than the window.
  write_run("old-nan", 1, with_nan(v1::TENSOR_ROLE_WEIGHT), 11 * 60 * kSecond);
  EXPECT_TRUE(alerts_of("old-nan").empty());
}

// The thresholds WebApi uses are the rules' (dashboards/prometheus/alerts.yml).
std::string rule_text(const std::string& alert) {
  std::ifstream in(AMPSCOPE_ALERTS_FILE);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  const std::size_t begin = all.find("- alert: " + alert + "\n");
  EXPECT_NE(begin, std::string::npos) << alert;
  if (begin == std::string::npos) return {};
  return all.substr(begin, all.find("- alert:", begin + 1) - begin);
}

double threshold(const std::string& alert, const std::string& pattern) {
  const std::string rule = rule_text(alert);
  std::smatch m;
  EXPECT_TRUE(std::regex_search(rule, m, std::regex(pattern))) << alert << ": " << pattern;
  return m.empty() ? std::nan("") : std::stod(m[1].str());
}

// One mapping of the policy modes to the wire and back; the API, the CLI and the server's log
// all say them with the policy library's names ("static-params").
TEST(PolicyWireTest, EveryModeRoundTripsAndUnknownWireValuesAreNone) {
  for (const policy::PolicyMode m : {policy::PolicyMode::kObserve,
                                     policy::PolicyMode::kStaticParams,
                                     policy::PolicyMode::kHeadroom}) {
    EXPECT_NE(mode_to_wire(m), v1::POLICY_MODE_UNSPECIFIED) << policy::mode_name(m);
    EXPECT_EQ(mode_from_wire(mode_to_wire(m)), m) << policy::mode_name(m);
  }
  EXPECT_EQ(mode_to_wire(policy::PolicyMode::kStaticParams), v1::POLICY_MODE_STATIC_PARAMS);
  EXPECT_FALSE(mode_from_wire(v1::POLICY_MODE_UNSPECIFIED).has_value());
  EXPECT_FALSE(mode_from_wire(static_cast<v1::PolicyMode>(99)).has_value());
}

TEST(WebApiAlertsTest, ThresholdsAreTheRulesOnes) {
  using T = AlertThresholds;
  EXPECT_EQ(threshold("AmpscopeUnderflowHigh",
                      R"(ampscope_checked_values_total\[10m\]\)\)\s*\)\s*>\s*([0-9.]+))"),
            T::kUnderflowRatio);
  EXPECT_EQ(threshold("AmpscopeSkippedStepsHigh",
                      R"(ampscope_steps_total\[10m\]\)\)\s*\)\s*>\s*([0-9.]+))"),
            T::kSkippedRatio);
  EXPECT_EQ(threshold("AmpscopeSkippedStepsHigh",
                      R"(ampscope_skipped_steps_total\[10m\]\)\)\s*>\s*([0-9]+))"),
            static_cast<double>(T::kSkippedMinimum));
  EXPECT_EQ(threshold("AmpscopeLossScaleCollapsed", R"(\(ampscope_loss_scale\)\s*<\s*([0-9.]+))"),
            T::kLossScaleFloor);
  // The window: the rules' range over underflow and skipped steps.
  EXPECT_EQ(threshold("AmpscopeUnderflowHigh", R"(ampscope_underflow_values_total\[([0-9]+)m\])") *
                60 * 1e9,
            static_cast<double>(T::kWindowNs));
}

}  // namespace
}  // namespace ampscope::server
