// `ampscope runs`, `runs delete`, `show` and `tail`: the real CLI binary against the real
// server, their --json output parsed and checked, and one clear line on stderr (exit 1) when the
// server is unreachable, the run unknown or the credentials refused.
#include <gtest/gtest.h>

#include <future>
#include <limits>
#include <nlohmann/json.hpp>

#include "server_harness.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif

namespace ampscope::testing {
namespace {

using nlohmann::json;

class CliQueryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(dir_.path(), dir_ / "store.db");
    agent_ = std::make_unique<AgentStream>(make_channel(server_->address()));
    ASSERT_TRUE(agent_->send_hello(make_hello("run-cli")));
    for (std::uint64_t seq = 1; seq <= 8; ++seq) send(seq);
    ASSERT_TRUE(agent_->wait_ack(8).has_value());
  }

  void send(std::uint64_t seq) {
    v1::StepReport r = make_report("run-cli", 0, seq, static_cast<std::int64_t>(seq - 1), 2);
    if (seq == 5) {
      r.set_found_inf(true);
      r.set_skipped(true);
      r.set_grad_norm(std::numeric_limits<double>::quiet_NaN());
      r.set_scale_after(32768);
      r.mutable_first_offender()->set_tensor("h0.mlp.fc.out.grad");
      r.mutable_first_offender()->set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);
      r.mutable_first_offender()->set_order(4);
    }
    ASSERT_TRUE(agent_->send(r));
  }

  CommandResult cli(std::vector<std::string> args) {
    args.insert(args.begin(), AMPSCOPE_CLI_BINARY);
    args.push_back("--server");
    args.push_back(server_->address());
    return run_process(args, 30s);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<AgentStream> agent_;
};

TEST_F(CliQueryTest, RunsJsonListsTheRun) {
  const CommandResult r = cli({"runs", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j.at("runs").size(), 1u);
  const json& run = j["runs"][0];
  EXPECT_EQ(run.at("run_id"), "run-cli");
  EXPECT_EQ(run.at("steps"), 8);
  EXPECT_EQ(run.at("reports"), 8);
  EXPECT_EQ(run.at("skipped_steps"), 1);
  EXPECT_EQ(run.at("agents_connected"), 1);

  const CommandResult text = cli({"runs"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("run-cli"), std::string::npos);
}

TEST_F(CliQueryTest, ShowJsonHasTheRunsStory) {
  const CommandResult r = cli({"show", "run-cli", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("run_id"), "run-cli");
  EXPECT_EQ(j.at("steps"), 8);
  EXPECT_EQ(j.at("reports"), 8);
  ASSERT_EQ(j.at("skipped_steps").size(), 1u);
  EXPECT_EQ(j["skipped_steps"][0].at("step"), 4);
  EXPECT_NE(j["skipped_steps"][0].at("why").get<std::string>().find("h0.mlp.fc.out.grad"),
            std::string::npos);
  ASSERT_EQ(j.at("first_offenders").size(), 1u);
  EXPECT_EQ(j["first_offenders"][0].at("tensor"), "h0.mlp.fc.out.grad");
  EXPECT_EQ(j["first_offenders"][0].at("role"), "activation_grad");
  EXPECT_TRUE(j.at("policy_updates").is_array());
  EXPECT_TRUE(j.at("scale_timeline").is_array());
  EXPECT_TRUE(j.at("worst_underflow").is_array());
  EXPECT_TRUE(j.at("worst_overflow").is_array());

  const CommandResult text = cli({"show", "run-cli"});
  ASSERT_EQ(text.code, 0) << text.err;
  for (const char* section : {"skipped steps (1)", "first offenders (1)", "scale timeline",
                              "worst tensors by underflow", "policy decisions", "agents (1)"}) {
    EXPECT_NE(text.out.find(section), std::string::npos) << section << "\n" << text.out;
  }
}

TEST_F(CliQueryTest, TailPrintsTheLatestAndFollows) {
  const CommandResult r = cli({"tail", "run-cli", "-n", "3", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(json::parse(lines[0]).at("seq"), 6);
  EXPECT_EQ(json::parse(lines[2]).at("seq"), 8);
  EXPECT_FALSE(json::parse(lines[0]).contains("tensors")) << "only with --tensors";

  // --tensors: each report's tensors with their identity and counts.
  const CommandResult t = cli({"tail", "run-cli", "-n", "1", "--json", "--tensors"});
  ASSERT_EQ(t.code, 0) << t.err;
  const json last = json::parse(lines_of(t.out).at(0));
  ASSERT_EQ(last.at("tensors").size(), 2u) << t.out;
  const json& first = last.at("tensors").at(0);
  for (const char* key : {"name", "role", "phase", "dtype", "held", "order", "micro_step", "scale",
                          "level", "numel", "zeros", "nan", "pos_inf", "neg_inf", "max_abs"}) {
    EXPECT_TRUE(first.contains(key)) << key << ": " << first.dump();
  }
  EXPECT_GT(first.at("numel").get<std::uint64_t>(), 0u);

  // --follow: new reports appear as they are committed; --count ends it.
  auto follower = std::async(std::launch::async, [&] {
    return cli(
        {"tail", "run-cli", "-n", "0", "--follow", "--interval", "0.1", "--count", "2", "--json"});
  });
  std::this_thread::sleep_for(500ms);
  send(9);
  send(10);
  ASSERT_TRUE(agent_->wait_ack(10).has_value());
  const CommandResult f = follower.get();
  ASSERT_EQ(f.code, 0) << f.err << "\nstdout:\n" << f.out;
  const std::vector<std::string> followed = lines_of(f.out);
  ASSERT_EQ(followed.size(), 2u) << f.out;
  EXPECT_EQ(json::parse(followed[0]).at("seq"), 9);
  EXPECT_EQ(json::parse(followed[1]).at("seq"), 10);
}

bool has_series_of(const std::string& metrics_address, const std::string& run) {
  for (const Sample& s : parse_samples(scrape(metrics_address))) {
    if (s.labels.contains("run") && s.labels.at("run") == run) return true;
  }
  return false;
}

TEST_F(CliQueryTest, RunsDeleteForgetsTheRunWhileItsAgentStreamsAndTheAgentStartsItAgain) {
  ASSERT_TRUE(has_series_of(server_->metrics_address(), "run-cli"));
  const CommandResult r = cli({"runs", "delete", "run-cli"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "deleted run 'run-cli': 8 reports, 1 agent streams ended\n");

  // The agent still streaming the run is told so: its stream ends with ABORTED.
  const grpc::Status ended = agent_->wait_end();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::ABORTED) << ended.error_message();
  EXPECT_NE(ended.error_message().find("deleted"), std::string::npos) << ended.error_message();

  // Gone from the store, the queries and /metrics.
  const CommandResult show = cli({"show", "run-cli"});
  EXPECT_EQ(show.code, 1);
  EXPECT_NE(show.err.find("not known"), std::string::npos) << show.err;
  const CommandResult runs = cli({"runs", "--json"});
  ASSERT_EQ(runs.code, 0) << runs.err;
  EXPECT_EQ(json::parse(runs.out).at("runs").size(), 0u) << runs.out;
  EXPECT_FALSE(has_series_of(server_->metrics_address(), "run-cli"));
  const CommandResult again = cli({"runs", "delete", "run-cli"});
  EXPECT_EQ(again.code, 1);
  EXPECT_EQ(lines_of(again.err).size(), 1u) << again.err;
  EXPECT_NE(again.err.find("run 'run-cli' is not known"), std::string::npos) << again.err;

  // The agent reconnects, as after any stream end: its Hello starts the run again, with what it
  // sends from now on.
  agent_ = std::make_unique<AgentStream>(make_channel(server_->address()));
  ASSERT_TRUE(agent_->send_hello(make_hello("run-cli")));
  send(9);
  ASSERT_TRUE(agent_->wait_ack(9).has_value());
  const CommandResult back = cli({"show", "run-cli", "--json"});
  ASSERT_EQ(back.code, 0) << back.err;
  EXPECT_EQ(json::parse(back.out).at("reports"), 1);
  EXPECT_TRUE(has_series_of(server_->metrics_address(), "run-cli"));

  const CommandResult quiet = cli({"runs", "delete", "run-cli", "--json"});
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  const json j = json::parse(quiet.out);
  EXPECT_EQ(j.at("run_id"), "run-cli");
  EXPECT_EQ(j.at("deleted_reports"), 1);
  EXPECT_EQ(j.at("streams_ended"), 1);
}

TEST_F(CliQueryTest, DeleteRunNamesTheBadArgument) {
  const grpc::Status empty = delete_run(server_->address(), "");
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(empty.error_message().find("run_id"), std::string::npos) << empty.error_message();
  EXPECT_EQ(delete_run(server_->address(), "no-such-run").error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Nothing was deleted on the way.
  EXPECT_TRUE(get_run(server_->address(), "run-cli").has_value());
}

TEST_F(CliQueryTest, ClearErrors) {
  const CommandResult unknown = cli({"show", "no-such-run"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_EQ(lines_of(unknown.err).size(), 1u) << unknown.err;
  EXPECT_NE(unknown.err.find("no-such-run"), std::string::npos) << unknown.err;
  EXPECT_NE(unknown.err.find("not known"), std::string::npos) << unknown.err;

  // A port nobody listens on: the server just stopped.
  const std::string address = server_->address();
  agent_.reset();
  ASSERT_EQ(server_->terminate(), 0);
  const CommandResult down = run_process({AMPSCOPE_CLI_BINARY, "runs", "--server", address}, 30s);
  EXPECT_EQ(down.code, 1);
  EXPECT_EQ(lines_of(down.err).size(), 1u) << down.err;
  EXPECT_NE(down.err.find("cannot reach ampscope-server at " + address), std::string::npos)
      << down.err;
}

TEST(CliAuthTest, TokenFileIsSentAndRefusalsAreExplained) {
  TempDir dir;
  write_text(dir / "token", "cli-token\n");
  write_text(dir / "wrong", "not-the-token\n");
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--auth-token-file", (dir / "token").string()});
  const CommandResult ok =
      run_process({AMPSCOPE_CLI_BINARY, "runs", "--json", "--server", server.address(),
                   "--token-file", (dir / "token").string()});
  EXPECT_EQ(ok.code, 0) << ok.err;
  const CommandResult refused =
      run_process({AMPSCOPE_CLI_BINARY, "runs", "--server", server.address(), "--token-file",
                   (dir / "wrong").string()});
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.err.find("refused the credentials"), std::string::npos) << refused.err;
}

// `show RUN --step S`: what happened at S and, for the tensor that offended there, one line
// per earlier step with full statistics (the flight recorder's history the agent sent with S).
TEST_F(CliQueryTest, ShowStepPrintsTheOffendersHistogramOverTheStepsBefore) {
  AgentStream flight(make_channel(server_->address()));
  ASSERT_TRUE(flight.send_hello(make_hello("run-flight")));
  for (std::int64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(flight.send(make_report("run-flight", 0, step + 1, step, 0)));
  }
  v1::StepReport event = make_report("run-flight", 0, 6, 5, 0);
  event.set_found_inf(true);
  event.set_skipped(true);
  event.set_grad_norm(std::numeric_limits<double>::quiet_NaN());
  event.set_scale_after(32768);
  *event.add_tensors() =
      crafted_tensor("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD, -10, {5, 6}, 65536.0, 2);
  event.mutable_first_offender()->set_tensor("h0.mlp.fc.weight");
  event.mutable_first_offender()->set_role(v1::TENSOR_ROLE_WEIGHT_GRAD);
  event.set_flight_event(v1::FLIGHT_EVENT_NONFINITE);
  for (std::int64_t step = 1; step < 5; ++step) {
    v1::HistoryStep* h = event.add_history();
    h->set_step(step);
    h->set_loss_scale(65536.0);
    // The values drift up one binade a step.
    *h->add_tensors() = synthetic_tensor("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD,
                                         -20 + static_cast<int>(step), -14 + static_cast<int>(step),
                                         65536.0, 256, static_cast<std::uint32_t>(step));
  }
  ASSERT_TRUE(flight.send(event));
  ASSERT_TRUE(flight.wait_ack(6).has_value());

  const CommandResult text = cli({"show", "run-flight", "--step", "5"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("run run-flight, step 5"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("found_inf, skipped"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("h0.mlp.fc.weight  (weight_grad"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("nan 2, +inf 0, -inf 0"), std::string::npos) << text.out;
  std::size_t recorder_lines = 0;
  for (std::size_t at = text.out.find("recorder\n"); at != std::string::npos;
       at = text.out.find("recorder\n", at + 1)) {
    ++recorder_lines;
  }
  EXPECT_EQ(recorder_lines, 4u) << text.out;
  EXPECT_NE(text.out.find("\n  5 <-"), std::string::npos) << text.out;

  const CommandResult j = cli({"show", "run-flight", "--step", "5", "--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  const json parsed = json::parse(j.out);
  ASSERT_EQ(parsed.at("tensors").size(), 1u);
  const json& history = parsed["tensors"][0].at("history");
  ASSERT_EQ(history.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(history[i].at("step"), i + 1);
    EXPECT_EQ(history[i].at("from_flight_recorder"), true);
  }
  EXPECT_LT(history[0].at("min_exponent").get<int>(), history[3].at("min_exponent").get<int>());
  EXPECT_EQ(parsed["reports"][0].at("flight_event"), "non-finite");

  // --limit caps the tensors printed in full and says how many it left out.
  const CommandResult limited = cli({"show", "run-flight", "--step", "5", "--limit", "0"});
  ASSERT_EQ(limited.code, 0) << limited.err;
  EXPECT_EQ(limited.out.find("recorder\n"), std::string::npos) << limited.out;
  EXPECT_NE(limited.out.find("1 more tensors with history"), std::string::npos) << limited.out;

  // Without --step, show is what it was.
  const CommandResult run = cli({"show", "run-flight"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.out.find("recorder"), std::string::npos) << run.out;
  EXPECT_TRUE(flight.finish().ok());
}

// A step of two micro-batches shows each tensor twice: `show`, `show --step S` and their --json
// say which micro-batch each sample and first offender belongs to (two rows of step 0 alike
// otherwise).
TEST_F(CliQueryTest, ShowNamesTheMicroStepOfSamplesAndFirstOffenders) {
  AgentStream micro(make_channel(server_->address()));
  ASSERT_TRUE(micro.send_hello(make_hello("run-micro")));
  v1::StepReport first = make_report("run-micro", 0, 1, 0, 0);
  for (std::uint32_t m = 0; m < 2; ++m) {
    v1::TensorStats t = synthetic_tensor("enc.fc.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD,
                                         -20 + static_cast<int>(m), -14, 65536.0, 256, m + 1);
    t.set_micro_step(m);
    t.set_order(3 + 10 * m);
    *first.add_tensors() = t;
  }
  ASSERT_TRUE(micro.send(first));
  v1::StepReport event = make_report("run-micro", 0, 2, 1, 0);
  event.set_found_inf(true);
  event.set_skipped(true);
  event.set_scale_after(32768);
  v1::TensorStats bad =
      crafted_tensor("enc.fc.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD, -10, {5, 6}, 65536.0, 2);
  bad.set_micro_step(1);
  bad.set_order(13);
  *event.add_tensors() = bad;
  v1::FirstOffender* f = event.mutable_first_offender();
  f->set_tensor("enc.fc.grad");
  f->set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);
  f->set_phase(v1::TENSOR_PHASE_BACKWARD);
  f->set_order(13);
  f->set_micro_step(1);
  ASSERT_TRUE(micro.send(event));
  ASSERT_TRUE(micro.wait_ack(2).has_value());

  const CommandResult step = cli({"show", "run-micro", "--step", "1"});
  ASSERT_EQ(step.code, 0) << step.err;
  EXPECT_NE(step.out.find("first offender enc.fc.grad (activation_grad, order 13, micro-step 1)"),
            std::string::npos)
      << step.out;
  EXPECT_NE(step.out.find("enc.fc.grad  (activation_grad, backward, fp16, rank 0, micro-step 1)"),
            std::string::npos)
      << step.out;
  EXPECT_NE(step.out.find("STEP      MICRO  BINADES"), std::string::npos) << step.out;
  EXPECT_NE(step.out.find("\n  0         0      [-20, -14]"), std::string::npos) << step.out;
  EXPECT_NE(step.out.find("\n  0         1      [-19, -14]"), std::string::npos) << step.out;
  EXPECT_NE(step.out.find("\n  1 <-      1      "), std::string::npos) << step.out;

  const CommandResult step_json = cli({"show", "run-micro", "--step", "1", "--json"});
  ASSERT_EQ(step_json.code, 0) << step_json.err;
  const json sj = json::parse(step_json.out);
  EXPECT_EQ(sj["reports"][0].at("first_offender_micro_step"), 1);
  ASSERT_EQ(sj.at("tensors").size(), 1u);
  EXPECT_EQ(sj["tensors"][0]["at_step"].at("micro_step"), 1);
  const json& history = sj["tensors"][0].at("history");
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].at("step"), 0);
  EXPECT_EQ(history[0].at("micro_step"), 0);
  EXPECT_EQ(history[1].at("step"), 0);
  EXPECT_EQ(history[1].at("micro_step"), 1);

  const CommandResult run = cli({"show", "run-micro"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.out.find("rank 0   enc.fc.grad (activation_grad, order 13, micro-step 1)"),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("first offender enc.fc.grad (activation_grad, order 13, micro-step 1) "
                         "on rank 0"),
            std::string::npos)
      << run.out;
  const CommandResult run_json = cli({"show", "run-micro", "--json"});
  ASSERT_EQ(run_json.code, 0) << run_json.err;
  const json rj = json::parse(run_json.out);
  ASSERT_EQ(rj.at("skipped_steps").size(), 1u);
  EXPECT_EQ(rj["skipped_steps"][0]["first_offender"].at("micro_step"), 1);
  EXPECT_EQ(rj["skipped_steps"][0]["first_offender"].at("rank"), 0);

  const CommandResult tail = cli({"tail", "run-micro", "-n", "1"});
  ASSERT_EQ(tail.code, 0) << tail.err;
  EXPECT_NE(tail.out.find("first offender enc.fc.grad (activation_grad, order 13, micro-step 1)"),
            std::string::npos)
      << tail.out;
  const CommandResult tail_json = cli({"tail", "run-micro", "-n", "1", "--json"});
  ASSERT_EQ(tail_json.code, 0) << tail_json.err;
  EXPECT_EQ(json::parse(tail_json.out)["first_offender"].at("micro_step"), 1) << tail_json.out;
  EXPECT_TRUE(micro.finish().ok());
}

// Names are UTF-8 and shown as written: a Unicode tensor name, first offender, notice and host
// in `show`, `show --step` and their --json.
TEST_F(CliQueryTest, ShowPrintsUnicodeNamesAsWritten) {
  const std::string name = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";
  AgentStream utf8(make_channel(server_->address()));
  v1::Hello hello = make_hello("run-utf8");
  hello.set_host("h\xc3\xb4te");
  ASSERT_TRUE(utf8.send_hello(hello));
  v1::StepReport r = make_report("run-utf8", 0, 1, 0, 0);
  *r.add_tensors() =
      crafted_tensor(name, v1::TENSOR_ROLE_ACTIVATION_GRAD, -10, {5, 6}, 65536.0, /*nan=*/2);
  r.set_found_inf(true);
  r.set_skipped(true);
  r.set_scale_after(32768);
  r.mutable_first_offender()->set_tensor(name);
  r.mutable_first_offender()->set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);
  r.add_notices("trainer: " + name);
  ASSERT_TRUE(utf8.send(r));
  ASSERT_TRUE(utf8.wait_ack(1).has_value());

  const CommandResult show = cli({"show", "run-utf8"});
  ASSERT_EQ(show.code, 0) << show.err;
  EXPECT_NE(show.out.find("first offender " + name + " (activation_grad"), std::string::npos)
      << show.out;
  // The tensor table pads by columns, not bytes: the name is 24 columns wide (28 bytes).
  EXPECT_NE(show.out.find("\n  " + name + std::string(12, ' ') + "activation_grad "),
            std::string::npos)
      << show.out;
  EXPECT_NE(show.out.find("trainer: " + name), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("h\xc3\xb4te"), std::string::npos) << show.out;

  const CommandResult step = cli({"show", "run-utf8", "--step", "0"});
  ASSERT_EQ(step.code, 0) << step.err;
  EXPECT_NE(step.out.find(name + "  (activation_grad"), std::string::npos) << step.out;

  const CommandResult show_json = cli({"show", "run-utf8", "--json"});
  ASSERT_EQ(show_json.code, 0) << show_json.err;
  const json j = json::parse(show_json.out);
  ASSERT_EQ(j.at("skipped_steps").size(), 1u);
  EXPECT_EQ(j["skipped_steps"][0]["first_offender"].at("tensor"), name);
  EXPECT_NE(show_json.out.find(name), std::string::npos);
  EXPECT_TRUE(utf8.finish().ok());
}

}  // namespace
}  // namespace ampscope::testing
