// /metrics of the real server, scraped over HTTP with libcurl after scripted reports: the
// families of docs/metrics.md exist with the expected values, counters end in _total, ratios stay in
// [0, 1], per-tensor series are limited to the top K, the gradient histogram has power-of-two
// buckets in the unscaled domain, and per-run series exist only for the most recently active
// runs (--metrics-max-runs) and leave with a deleted run.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>
#include <thread>

#include "server_harness.h"

namespace ampscope::testing {
namespace {

constexpr double kScale = 1024.0;  // 2^10

v1::StepReport scripted(std::uint32_t rank, std::uint64_t seq) {
  v1::StepReport r = make_report("run-m", rank, seq, static_cast<std::int64_t>(seq), 0, kScale);
  // Measured (scaled) binades -20..-18 are unscaled -30..-28.
  *r.add_tensors() =
      crafted_tensor("h0.attn.out.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD, -20, {10, 20, 30}, kScale,
                     /*nan=*/2, /*pos_inf=*/1, /*underflow=*/10);
  // Six weight grads, tensor i underflowing i of its 100 values: the top 3 are w5, w4, w3.
  for (int i = 0; i < 6; ++i) {
    *r.add_tensors() =
        crafted_tensor("w" + std::to_string(i), v1::TENSOR_ROLE_WEIGHT_GRAD, -5, {100}, kScale, 0,
                       0, /*underflow=*/static_cast<std::uint64_t>(i));
  }
  if (seq == 2) {
    r.set_found_inf(true);
    r.set_skipped(true);
    r.set_scale_after(kScale / 2);
    r.mutable_first_offender()->set_tensor("h0.attn.out.grad");
    r.mutable_first_offender()->set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);
    r.set_val_loss(2.5 + rank);  // evaluated at this step only
  }
  return r;
}

TEST(ServerMetricsTest, FamiliesValuesAndCardinality) {
  TempDir dir;
  ServerProcess server(dir.path(), dir / "store.db", {"--top-k", "3"});
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    AgentStream agent(make_channel(server.address()));
    v1::Hello hello = make_hello("run-m", rank, 2);
    if (rank == 1) hello.mutable_scaler()->set_min_scale(8.0);  // rank 0's scaler has none
    ASSERT_TRUE(agent.send_hello(hello));
    for (std::uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(agent.send(scripted(rank, seq)));
    v1::StepReport bad = scripted(rank, 4);
    bad.set_loss_scale(0);  // a rule of the report: rejected whole
    ASSERT_TRUE(agent.send(bad));
    ASSERT_TRUE(agent.wait_ack(4).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }

  // Per-tensor series are refreshed about once a second.
  std::vector<Sample> m;
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  do {
    std::this_thread::sleep_for(100ms);
    text = scrape(server.metrics_address());
    m = parse_samples(text);
  } while (find_samples(m, "ampscope_tensor_underflow_ratio", {{"run", "run-m"}}).size() < 3 &&
           std::chrono::steady_clock::now() < deadline);

  const std::map<std::string, std::string> r0 = {{"run", "run-m"}, {"rank", "0"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(r0.begin(), r0.end());
    return extra;
  };
  EXPECT_EQ(sample_value(m, "ampscope_steps_total", r0), 3);
  EXPECT_EQ(sample_value(m, "ampscope_skipped_steps_total", r0), 1);
  EXPECT_EQ(sample_value(m, "ampscope_found_inf_steps_total", r0), 1);
  EXPECT_EQ(sample_value(m, "ampscope_step", r0), 3);
  EXPECT_EQ(sample_value(m, "ampscope_loss_scale", r0), kScale);
  // The validation loss of the last evaluated step (seq 2), kept over the later report.
  EXPECT_EQ(sample_value(m, "ampscope_validation_loss", r0), 2.5);
  EXPECT_EQ(sample_value(m, "ampscope_validation_loss", {{"run", "run-m"}, {"rank", "1"}}), 3.5);
  // The scaler's minimum, from the Hello: only rank 1 configured one.
  EXPECT_TRUE(find_samples(m, "ampscope_loss_scale_min", r0).empty());
  EXPECT_EQ(sample_value(m, "ampscope_loss_scale_min", {{"run", "run-m"}, {"rank", "1"}}), 8.0);
  EXPECT_EQ(sample_value(m, "ampscope_tokens_total", r0), 3 * 4096);
  EXPECT_EQ(sample_value(m, "ampscope_tensor_stats_total", {{"run", "run-m"}}), 2 * 3 * 7);
  EXPECT_EQ(sample_value(m, "ampscope_nonfinite_values_total",
                         with({{"role", "activation_grad"}, {"kind", "nan"}})),
            3 * 2);
  EXPECT_EQ(sample_value(m, "ampscope_nonfinite_values_total",
                         with({{"role", "activation_grad"}, {"kind", "pos_inf"}})),
            3 * 1);
  EXPECT_EQ(sample_value(m, "ampscope_nonfinite_values_total",
                         with({{"role", "weight_grad"}, {"kind", "nan"}})),
            0);
  EXPECT_EQ(sample_value(m, "ampscope_underflow_values_total",
                         with({{"role", "weight_grad"}, {"format", "fp16"}})),
            3 * (0 + 1 + 2 + 3 + 4 + 5));
  EXPECT_EQ(sample_value(m, "ampscope_checked_values_total",
                         with({{"role", "weight_grad"}, {"format", "fp16"}})),
            3 * 600);
  EXPECT_DOUBLE_EQ(sample_value(m, "ampscope_underflow_ratio",
                                with({{"role", "weight_grad"}, {"format", "fp16"}})),
                   15.0 / 600.0);
  EXPECT_EQ(sample_value(m, "ampscope_reports_rejected_total", {{"reason", "range"}}), 2);

  // Gradient magnitudes, unscaled, power-of-two buckets: the activation grad's 60 values sit
  // in binades -30..-28, so le=2^-29 holds 10, le=2^-28 30, le=2^-27 and above 60 (per report).
  const std::map<std::string, std::string> act = {{"run", "run-m"}, {"role", "activation_grad"}};
  EXPECT_EQ(sample_value(m, "ampscope_gradient_magnitude_count", act), 2 * 3 * 60);
  // prometheus-cpp writes le with 16 significant digits: each is 2^k to within an ulp.
  std::map<int, double> buckets;  // by k; +Inf as 1000
  for (const Sample& s : find_samples(m, "ampscope_gradient_magnitude_bucket", act)) {
    const std::string& le = s.labels.at("le");
    if (le == "+Inf") {
      buckets[1000] = s.value;
      continue;
    }
    const double bound = std::stod(le);
    const int k = static_cast<int>(std::lround(std::log2(bound)));
    EXPECT_NEAR(bound, std::ldexp(1.0, k), std::ldexp(1.0, k) * 1e-15) << le;
    buckets[k] = s.value;
  }
  EXPECT_EQ(buckets.size(), 82u);  // 2^-64 .. 2^16 and +Inf
  EXPECT_EQ(buckets.begin()->first, -64);
  EXPECT_EQ(buckets.rbegin()->first, 1000);
  EXPECT_EQ(buckets[-30], 0);
  EXPECT_EQ(buckets[-29], 6 * 10);
  EXPECT_EQ(buckets[-28], 6 * 30);
  EXPECT_EQ(buckets[-27], 6 * 60);
  EXPECT_EQ(buckets[16], 6 * 60);
  EXPECT_EQ(buckets[1000], 6 * 60);

  // Top-K: only the three worst weight grads (and no more than K series per run).
  const std::vector<Sample> top =
      find_samples(m, "ampscope_tensor_underflow_ratio", {{"run", "run-m"}});
  ASSERT_EQ(top.size(), 3u) << text;
  std::set<std::string> names;
  for (const Sample& s : top) names.insert(s.labels.at("tensor"));
  // The activation grad has non-finite values, so it ranks first; then w5 and w4.
  EXPECT_EQ(names, (std::set<std::string>{"h0.attn.out.grad", "w5", "w4"}));

  // Conventions: counters end in _total, ratios are in [0, 1], every family has the prefix.
  const std::regex type_line("# TYPE (\\S+) (\\S+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), type_line);
       it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    const std::string type = (*it)[2];
    if (name.rfind("exposer_", 0) == 0) continue;  // prometheus-cpp's own
    EXPECT_EQ(name.rfind("ampscope_", 0), 0u) << name;
    if (type == "counter") {
      EXPECT_TRUE(name.ends_with("_total")) << name;
    }
  }
  for (const Sample& s : m) {
    if (s.name.ends_with("_ratio") && !std::isnan(s.value)) {
      EXPECT_GE(s.value, 0.0) << s.name;
      EXPECT_LE(s.value, 1.0) << s.name;
    }
  }
  for (const char* family :
       {"ampscope_build_info", "ampscope_streams_active", "ampscope_ack_delay_seconds_count",
        "ampscope_store_commit_duration_seconds_count", "ampscope_store_live_bytes",
        "ampscope_loss", "ampscope_grad_norm", "ampscope_learning_rate",
        "ampscope_agents_connected", "ampscope_overflow_values_total",
        "ampscope_subnormal_values_total", "ampscope_first_offenders_total"}) {
    EXPECT_FALSE(find_samples(m, family).empty()) << family;
  }
}

// The sample lines of ampscope's families in a scrape, and the runs they name.
struct SeriesCount {
  std::size_t lines = 0;      // every ampscope_* sample
  std::size_t run_lines = 0;  // those with a run label
  std::set<std::string> runs;
};

SeriesCount count_series(const std::string& text) {
  SeriesCount c;
  for (const std::string& line : lines_of(text)) {
    if (line.rfind("ampscope_", 0) != 0) continue;
    ++c.lines;
    const std::size_t at = line.find("run=\"");
    if (at == std::string::npos) continue;
    ++c.run_lines;
    const std::size_t from = at + 5;
    c.runs.insert(line.substr(from, line.find('"', from) - from));
  }
  return c;
}

TEST(ServerMetricsTest, PerRunSeriesStayBoundedToTheMostRecentlyActiveRuns) {
  constexpr std::size_t kBound = 50;
  constexpr int kRounds = 4;
  constexpr int kThreads = 4;
  constexpr int kRunsPerThread = 125;  // 4 x 4 x 125 = 2,000 runs
  TempDir dir;
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--metrics-max-runs", std::to_string(kBound), "--sync", "normal"});
  const auto channel = make_channel(server.address());

  // What one run of this shape exports, top-K tensors included (refreshed about once a second).
  send_reports(channel, "run-first", 1, 1, 2);
  std::this_thread::sleep_for(1500ms);
  const SeriesCount one = count_series(scrape(server.metrics_address()));
  ASSERT_EQ(one.runs, std::set<std::string>{"run-first"});
  const std::size_t per_run = one.run_lines;
  const std::size_t server_level = one.lines - one.run_lines;

  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> agents;
    for (int t = 0; t < kThreads; ++t) {
      agents.emplace_back([&, round, t] {
        for (int i = 0; i < kRunsPerThread; ++i) {
          const std::string run =
              "run-" + std::to_string(round) + "-" + std::to_string(t) + "-" + std::to_string(i);
          send_reports(channel, run, 1, 1, 2);
        }
      });
    }
    for (std::thread& a : agents) a.join();
    const SeriesCount c = count_series(scrape(server.metrics_address()));
    EXPECT_EQ(c.runs.size(), kBound) << "round " << round;
    EXPECT_LE(c.run_lines, kBound * per_run) << "round " << round;
    EXPECT_LE(c.lines, kBound * per_run + server_level) << "round " << round;
  }

  // Exported are the most recently active runs.
  std::set<std::string> latest;
  for (std::size_t i = 0; i < kBound; ++i) {
    latest.insert("run-last-" + std::to_string(i));
    send_reports(channel, "run-last-" + std::to_string(i), 1, 1, 2);
  }
  EXPECT_EQ(count_series(scrape(server.metrics_address())).runs, latest);

  // A deleted run's series go at once.
  ASSERT_TRUE(delete_run(server.address(), "run-last-0").ok());
  latest.erase("run-last-0");
  EXPECT_EQ(count_series(scrape(server.metrics_address())).runs, latest);

  // A run that was evicted is exported again when it is active again.
  send_reports(channel, "run-0-0-0", 2, 2, 2);
  latest.insert("run-0-0-0");
  EXPECT_EQ(count_series(scrape(server.metrics_address())).runs, latest);
  EXPECT_EQ(sample_value(parse_samples(scrape(server.metrics_address())), "ampscope_steps_total",
                         {{"run", "run-0-0-0"}, {"rank", "0"}}),
            1);
}

// A report's flight recorder history (StepReport.history: full statistics of earlier steps) is
// stored, never counted: tensor samples and non-finite values count the report's own tensors.
TEST(ServerMetricsTest, HistoryFeedsNoMetric) {
  TempDir dir;
  ServerProcess server(dir.path(), dir / "store.db");
  AgentStream agent(make_channel(server.address()));
  ASSERT_TRUE(agent.send_hello(make_hello("run-hist")));
  v1::StepReport r = make_report("run-hist", 0, 1, 9, 0, kScale);
  const v1::TensorStats offender = crafted_tensor(
      "h0.attn.out.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD, -20, {10, 20, 30}, kScale, /*nan=*/2);
  *r.add_tensors() = offender;
  r.set_found_inf(true);
  r.set_skipped(true);
  r.set_flight_event(v1::FLIGHT_EVENT_NONFINITE);
  for (std::int64_t step : {6, 7, 8}) {
    v1::HistoryStep* h = r.add_history();
    h->set_step(step);
    h->set_loss_scale(kScale);
    *h->add_tensors() = offender;  // non-finite values too: history must not count them
    *h->add_tensors() = crafted_tensor("w0", v1::TENSOR_ROLE_WEIGHT_GRAD, -5, {100}, kScale);
  }
  ASSERT_TRUE(agent.send(r));
  ASSERT_TRUE(agent.wait_ack(1).has_value());
  EXPECT_TRUE(agent.finish().ok());
  const std::vector<Sample> m = parse_samples(scrape(server.metrics_address()));
  EXPECT_EQ(sample_value(m, "ampscope_tensor_stats_total", {{"run", "run-hist"}}), 1);
  EXPECT_EQ(sample_value(m, "ampscope_nonfinite_values_total",
                         {{"run", "run-hist"}, {"role", "activation_grad"}, {"kind", "nan"}}),
            2);
}

// Label values are the names as written: UTF-8 as it came, and a backslash or double quote as
// the text exposition escapes them (\\ and \").
TEST(ServerMetricsTest, TensorLabelValuesAreTheNamesAsWritten) {
  TempDir dir;
  ServerProcess server(dir.path(), dir / "store.db");
  AgentStream agent(make_channel(server.address()));
  ASSERT_TRUE(agent.send_hello(make_hello("run-names")));
  const std::string unicode = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";
  const std::string quoted = "q\"uote\\back";
  v1::StepReport r = make_report("run-names", 0, 1, 0, 0, kScale);
  *r.add_tensors() = crafted_tensor(unicode, v1::TENSOR_ROLE_ACTIVATION_GRAD, -20, {10, 20, 30},
                                    kScale, /*nan=*/2, /*pos_inf=*/0, /*underflow=*/10);
  *r.add_tensors() = crafted_tensor(quoted, v1::TENSOR_ROLE_WEIGHT_GRAD, -5, {100}, kScale, 0, 0,
                                    /*underflow=*/5);
  ASSERT_TRUE(agent.send(r));
  ASSERT_TRUE(agent.wait_ack(1).has_value());
  EXPECT_TRUE(agent.finish().ok());
  // Per-tensor series are refreshed about once a second.
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  do {
    std::this_thread::sleep_for(100ms);
    text = scrape(server.metrics_address());
  } while (
      find_samples(parse_samples(text), "ampscope_tensor_underflow_ratio", {{"run", "run-names"}})
              .size() < 2 &&
      std::chrono::steady_clock::now() < deadline);
  EXPECT_NE(text.find("tensor=\"" + unicode + "\""), std::string::npos) << text;
  EXPECT_NE(text.find("tensor=\"q\\\"uote\\\\back\""), std::string::npos) << text;
  const std::vector<Sample> m = parse_samples(text);
  std::set<std::string> names;
  for (const Sample& s :
       find_samples(m, "ampscope_tensor_underflow_ratio", {{"run", "run-names"}})) {
    names.insert(s.labels.at("tensor"));
  }
  EXPECT_EQ(names, (std::set<std::string>{unicode, quoted}));
  EXPECT_EQ(sample_value(m, "ampscope_tensor_nonfinite_values",
                         {{"run", "run-names"}, {"tensor", unicode}}),
            2);
}

}  // namespace
}  // namespace ampscope::testing
