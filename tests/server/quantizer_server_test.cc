// What FP8/FP4 quantisers measured (StepReport.quantizers) through the real server: stored and
// summed per quantiser, kept across a restart, returned by GetRun, printed by `ampscope show`
// (text and --json, the loss cost among them), exported as bounded Prometheus series; a bad
// entry is refused alone.
// The quantisers' counts are fake_quantize's of real data, encoded as the agent encodes them.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/recipe.h"
#include "server_harness.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif

namespace ampscope::testing {
namespace {

using nlohmann::json;

// 4 x 64 activations over 26 binades; step k scales them by 2^k, and one value per step sits
// where MX's rounded-down block scale makes it saturate.
std::vector<float> activations(int step) {
  std::vector<float> x(256);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double sign = i % 5 == 0 ? -1.0 : 1.0;
    x[i] = static_cast<float>(
        sign * std::ldexp(1.0 + (i % 7) / 8.0, static_cast<int>(i % 26) - 18 + step));
  }
  x[3] = std::ldexp(511.0f, step + 1);  // its block's amax: x / X = 511 > 448
  return x;
}

struct Sent {
  RecipeCounts mx;       // "h0.fc.input", mxfp8_e4m3
  RecipeCounts delayed;  // "h0.fc.weight", e4m3 with a delayed scale
};

v1::QuantizerStats encode(const std::string& name, v1::TensorRole role, const RecipeCounts& c,
                          std::span<const float> history = {}) {
  v1::QuantizerStats q;
  q.set_name(name);
  q.set_role(role);
  q.set_phase(v1::TENSOR_PHASE_FORWARD);
  proto::encode_quantizer(c, history, &q);
  return q;
}

// /metrics once it has `n` quantiser series of `run` (a report's series follow its commit).
std::vector<Sample> scrape_quantizers(const ServerProcess& server, const std::string& run,
                                      std::size_t n) {
  std::vector<Sample> samples;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  do {
    samples = parse_samples(scrape(server.metrics_address()));
    if (find_samples(samples, "ampscope_quantizer_amax", {{"run", run}}).size() >= n) break;
    std::this_thread::sleep_for(50ms);
  } while (std::chrono::steady_clock::now() < deadline);
  return samples;
}

class QuantizerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(dir_.path(), dir_ / "store.db");
    AgentStream agent(make_channel(server_->address()));
    ASSERT_TRUE(agent.send_hello(make_hello("run-fp8")));
    const float history[] = {3.0f, 5.0f, 4.0f};
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> x = activations(step);
      Recipe delayed = *parse_recipe("e4m3:current");
      delayed.scaling = Scaling::kDelayed;
      delayed.scale = 448.0f / 64.0f;  // a scale from an older, smaller amax: saturates later
      Sent s{fake_quantize(x.data(), nullptr, 4, 64, *parse_recipe("mxfp8_e4m3")),
             fake_quantize(x.data(), nullptr, 4, 64, delayed)};
      v1::StepReport r = make_report("run-fp8", 0, step + 1, step, 2);
      *r.add_quantizers() = encode("h0.fc.input", v1::TENSOR_ROLE_ACTIVATION, s.mx);
      *r.add_quantizers() = encode("h0.fc.weight", v1::TENSOR_ROLE_WEIGHT, s.delayed, history);
      // The loss cost of the weight's layer on steps 0 and 2 (1 measured none).
      if (step != 1) r.mutable_quantizers(1)->set_loss_cost(step == 0 ? 0.004 : 0.002);
      if (step == 1) {
        // Refused alone: more saturated values than values.
        v1::QuantizerStats bad = encode("h0.bad", v1::TENSOR_ROLE_WEIGHT, s.delayed);
        bad.set_saturated(bad.values() + 1);
        *r.add_quantizers() = bad;
      }
      ASSERT_TRUE(agent.send(r));
      sent_.push_back(s);
    }
    ASSERT_TRUE(agent.wait_ack(3).has_value());
    for (const v1::ServerMessage& m : agent.messages()) EXPECT_FALSE(m.has_reject());
    ASSERT_TRUE(agent.finish().ok());
  }

  CommandResult cli(std::vector<std::string> args) {
    args.insert(args.begin(), AMPSCOPE_CLI_BINARY);
    args.push_back("--server");
    args.push_back(server_->address());
    return run_process(args, 30s);
  }

  // The run's sums over the sent steps.
  RecipeCounts total(RecipeCounts Sent::*which) const {
    RecipeCounts t;
    for (const Sent& s : sent_) {
      const RecipeCounts& c = s.*which;
      t.values += c.values;
      t.underflow += c.underflow;
      t.saturated += c.saturated;
      t.signal_sq += c.signal_sq;
      t.error_sq += c.error_sq;
      t.amax = std::max(t.amax, c.amax);
      t.blocks += c.blocks;
      t.saturated_blocks += c.saturated_blocks;
    }
    return t;
  }

  void expect_record(const v1::QuantizerRecord& q, RecipeCounts Sent::*which) {
    const RecipeCounts t = total(which);
    const RecipeCounts& last = sent_.back().*which;
    EXPECT_EQ(q.recipe(), to_string(last.recipe));
    EXPECT_EQ(q.samples(), 3u);
    EXPECT_EQ(q.values(), t.values);
    EXPECT_EQ(q.underflow(), t.underflow);
    EXPECT_EQ(q.saturated(), t.saturated);
    EXPECT_DOUBLE_EQ(q.saturated_ratio(),
                     static_cast<double>(t.saturated) / static_cast<double>(t.values));
    EXPECT_NEAR(q.sqnr_db(), t.sqnr_db(), 1e-9);
    EXPECT_EQ(q.amax(), t.amax);
    EXPECT_EQ(q.last_amax(), last.amax);
    EXPECT_EQ(q.blocks(), t.blocks);
    EXPECT_EQ(q.saturated_blocks(), t.saturated_blocks);
    EXPECT_EQ(q.last_step(), 2);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::vector<Sent> sent_;
};

TEST_F(QuantizerServerTest, TheRunSumsEachQuantiserAndKeepsThemAcrossARestart) {
  // What the test relies on: MX saturates, the stale delayed scale saturates, both lose values.
  ASSERT_GT(total(&Sent::mx).saturated, 0u);
  ASSERT_GT(total(&Sent::delayed).saturated, 0u);
  ASSERT_GT(total(&Sent::delayed).underflow, 0u);
  for (int start = 0; start < 2; ++start) {
    if (start == 1) server_->restart();
    const std::optional<v1::GetRunResponse> run = get_run(server_->address(), "run-fp8");
    ASSERT_TRUE(run.has_value());
    ASSERT_EQ(run->quantizers_size(), 2);  // h0.bad was refused
    EXPECT_EQ(run->quantizers(0).name(), "h0.fc.input");
    expect_record(run->quantizers(0), &Sent::mx);
    ASSERT_TRUE(run->quantizers(0).has_scale_binades());
    EXPECT_EQ(run->quantizers(1).name(), "h0.fc.weight");
    expect_record(run->quantizers(1), &Sent::delayed);
    EXPECT_EQ(run->quantizers(1).tensor_scale_min(), 7.0);
    EXPECT_EQ(run->quantizers(1).tensor_scale_max(), 7.0);
    // The refused one is named in a notice of the rank; the rest of its step is stored.
    ASSERT_EQ(run->agents_size(), 1);
    bool named = false;
    for (const std::string& n : run->agents(0).notices()) {
      named = named || n.find("server: refused quantizer 'h0.bad' alone (quantizer_counts") == 0;
    }
    EXPECT_TRUE(named);
    EXPECT_EQ(run->summary().reports(), 3u);
  }
  // The reports as stored carry their quantisers, the amax history included.
  const std::vector<v1::StepReport> reports = stored_reports(server_->address(), "run-fp8");
  ASSERT_EQ(reports.size(), 3u);
  ASSERT_EQ(reports[1].quantizers_size(), 2);
  EXPECT_EQ(reports[1].quantizers(1).amax_history_size(), 3);
  // Without tensors (`ampscope tail`'s polls), without quantisers too.
  auto query = v1::Query::NewStub(make_channel(server_->address()));
  v1::GetReportsRequest request;
  request.set_run_id("run-fp8");
  v1::GetReportsResponse light;
  grpc::ClientContext context;
  ASSERT_TRUE(query->GetReports(&context, request, &light).ok());
  ASSERT_EQ(light.reports_size(), 3);
  for (const v1::StoredReport& r : light.reports()) {
    EXPECT_EQ(r.report().quantizers_size(), 0);
    EXPECT_EQ(r.report().tensors_size(), 0);
  }
}

TEST_F(QuantizerServerTest, ShowPrintsTheFp8SectionAndItsJson) {
  const CommandResult text = cli({"show", "run-fp8"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("FP8/FP4 quantisers (2):"), std::string::npos) << text.out;
  const std::size_t line = text.out.find("  h0.fc.input");
  ASSERT_NE(line, std::string::npos) << text.out;
  const std::string input = text.out.substr(line, text.out.find('\n', line) - line);
  EXPECT_NE(input.find("mxfp8_e4m3"), std::string::npos) << input;
  EXPECT_NE(input.find(" dB"), std::string::npos) << input;
  EXPECT_NE(input.find("2^"), std::string::npos) << input;  // the block scales' binades
  EXPECT_NE(text.out.find("LOSS COST"), std::string::npos) << text.out;
  EXPECT_EQ(input.back(), '-') << "no loss cost measured: " << input;
  const std::size_t wline = text.out.find("  h0.fc.weight");
  ASSERT_NE(wline, std::string::npos);
  const std::string weight = text.out.substr(wline, text.out.find('\n', wline) - wline);
  EXPECT_NE(weight.find("s 7"), std::string::npos) << weight;
  // Mean +- 2 standard errors of {0.004, 0.002}: 3e-3 +- 2 x 1.41e-3 / sqrt(2).
  EXPECT_NE(weight.find("+3.0e-03 +-2.0e-03 (n 2)"), std::string::npos) << weight;

  const CommandResult r = cli({"show", "run-fp8", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j.at("quantizers").size(), 2u);
  const json& q = j["quantizers"][0];
  const RecipeCounts t = total(&Sent::mx);
  EXPECT_EQ(q.at("name"), "h0.fc.input");
  EXPECT_EQ(q.at("role"), "activation");
  EXPECT_EQ(q.at("phase"), "forward");
  EXPECT_EQ(q.at("recipe"), "mxfp8_e4m3");
  EXPECT_EQ(q.at("element"), "e4m3");
  EXPECT_EQ(q.at("values"), t.values);
  EXPECT_EQ(q.at("saturated"), t.saturated);
  EXPECT_NEAR(q.at("sqnr_db").get<double>(), t.sqnr_db(), 1e-9);
  EXPECT_EQ(q.at("exact"), false);
  EXPECT_TRUE(q.contains("scale_min_exponent"));
  EXPECT_FALSE(q.contains("tensor_scale_min"));
  EXPECT_EQ(j["quantizers"][1].at("tensor_scale_max"), 7.0);
  EXPECT_FALSE(q.contains("loss_cost_samples"));
  EXPECT_EQ(j["quantizers"][1].at("loss_cost_samples"), 2);
  EXPECT_NEAR(j["quantizers"][1].at("loss_cost_mean").get<double>(), 0.003, 1e-15);
  EXPECT_NEAR(j["quantizers"][1].at("loss_cost_stddev").get<double>(), 0.002 / std::sqrt(2.0),
              1e-15);
}

TEST_F(QuantizerServerTest, MetricsExportTheLatestSamplePerQuantiserWithABoundedRecipeLabel) {
  const std::vector<Sample> samples = scrape_quantizers(*server_, "run-fp8", 2);
  const RecipeCounts& mx = sent_.back().mx;
  const RecipeCounts& delayed = sent_.back().delayed;
  const std::map<std::string, std::string> input = {{"run", "run-fp8"},
                                                    {"tensor", "h0.fc.input"},
                                                    {"role", "activation"},
                                                    {"phase", "forward"},
                                                    {"recipe", "mx_e4m3"}};
  EXPECT_DOUBLE_EQ(sample_value(samples, "ampscope_quantizer_saturated_ratio", input),
                   static_cast<double>(mx.saturated) / static_cast<double>(mx.values));
  EXPECT_DOUBLE_EQ(sample_value(samples, "ampscope_quantizer_underflow_ratio", input),
                   static_cast<double>(mx.underflow) / static_cast<double>(mx.values));
  EXPECT_NEAR(sample_value(samples, "ampscope_quantizer_sqnr_db", input), mx.sqnr_db(), 1e-9);
  EXPECT_EQ(sample_value(samples, "ampscope_quantizer_amax", input), mx.amax);
  // A block recipe has no per-tensor scale series.
  EXPECT_TRUE(find_samples(samples, "ampscope_quantizer_scale", input).empty());
  // The delayed recipe's scale is a value, never a label.
  const std::map<std::string, std::string> weight = {
      {"run", "run-fp8"}, {"tensor", "h0.fc.weight"}, {"recipe", "delayed_e4m3"}};
  EXPECT_EQ(sample_value(samples, "ampscope_quantizer_scale", weight), delayed.tensor_scale);
  // The loss cost: the latest measured value, and no series for a quantiser without one.
  EXPECT_EQ(sample_value(samples, "ampscope_quantizer_loss_cost_nats", weight), 0.002);
  EXPECT_TRUE(find_samples(samples, "ampscope_quantizer_loss_cost_nats", input).empty());
  EXPECT_EQ(find_samples(samples, "ampscope_quantizer_amax").size(), 2u);
  EXPECT_EQ(sample_value(samples, "ampscope_report_parts_refused_total",
                         {{"reason", "quantizer_counts"}}),
            1.0);
}

// --top-k bounds the quantisers with series per run, the worst kept.
TEST(QuantizerMetricsTest, OnlyTheTopKQuantisersHaveSeries) {
  TempDir dir;
  ServerProcess server(dir.path(), dir / "store.db", {"--top-k", "2"});
  AgentStream agent(make_channel(server.address()));
  ASSERT_TRUE(agent.send_hello(make_hello("run-k")));
  v1::StepReport r = make_report("run-k", 0, 1, 0, 1);
  const std::vector<float> x = activations(0);
  const RecipeCounts c = fake_quantize(x.data(), nullptr, 4, 64, *parse_recipe("e4m3:current"));
  for (int i = 0; i < 5; ++i) {
    v1::QuantizerStats q =
        encode("h" + std::to_string(i) + ".fc.input", v1::TENSOR_ROLE_ACTIVATION, c);
    q.set_underflow(static_cast<std::uint64_t>(i));  // h4 and h3 are the worst
    q.set_subnormal(0);
    *r.add_quantizers() = q;
  }
  ASSERT_TRUE(agent.send(r));
  ASSERT_TRUE(agent.wait_ack(1).has_value());
  const std::vector<Sample> samples = scrape_quantizers(server, "run-k", 2);
  const std::vector<Sample> series = find_samples(samples, "ampscope_quantizer_underflow_ratio");
  ASSERT_EQ(series.size(), 2u);
  std::set<std::string> tensors;
  for (const Sample& s : series) tensors.insert(s.labels.at("tensor"));
  EXPECT_EQ(tensors, (std::set<std::string>{"h3.fc.input", "h4.fc.input"}));
  ASSERT_TRUE(agent.finish().ok());
}

}  // namespace
}  // namespace ampscope::testing
