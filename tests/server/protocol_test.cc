// The stream protocol as an agent sees it, against the real server: a malformed report is
// answered with a Reject naming the field and the stream goes on (nothing of the report is
// stored); one bad tensor is refused alone (the step stored without it, a notice, a count),
// and names are UTF-8 stored as written; a bad or missing Hello ends the stream with
// INVALID_ARGUMENT; an oversized message ends it with RESOURCE_EXHAUSTED; the health service
// answers.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include "ampscope/testing/net.h"
#include "server_harness.h"

namespace ampscope::testing {
namespace {

class ServerProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(
        dir_.path(), dir_ / "store.db", std::vector<std::string>{"--max-message-bytes", "32K"});
  }
  std::shared_ptr<grpc::Channel> channel() { return make_channel(server_->address()); }
  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ServerProtocolTest, MalformedReportIsRejectedWholeAndTheStreamGoesOn) {
  AgentStream agent(channel());
  ASSERT_TRUE(agent.send_hello(make_hello("run-r")));
  ASSERT_TRUE(agent.send(make_report("run-r", 0, 1, 0, 2)));
  v1::StepReport bad = make_report("run-r", 0, 2, 1, 2);
  bad.set_scale_after(0);
  ASSERT_TRUE(agent.send(bad));
  ASSERT_TRUE(agent.send(make_report("run-r", 0, 3, 2, 2)));

  const std::optional<v1::Reject> reject = agent.wait_reject(2);
  ASSERT_TRUE(reject.has_value());
  EXPECT_EQ(reject->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(reject->field(), "report.scale_after");
  EXPECT_EQ(reject->reason(), "range");
  EXPECT_NE(reject->message().find("report.scale_after"), std::string::npos);
  // The rejected seq is settled: the next Ack covers it, and the stream carries on.
  ASSERT_TRUE(agent.wait_ack(3).has_value());
  EXPECT_TRUE(agent.finish().ok());

  v1::GetReportsRequest q;
  q.set_run_id("run-r");
  v1::GetReportsResponse stored;
  grpc::ClientContext ctx;
  ASSERT_TRUE(v1::Query::NewStub(channel())->GetReports(&ctx, q, &stored).ok());
  ASSERT_EQ(stored.reports_size(), 2);
  EXPECT_EQ(stored.reports(0).report().seq(), 1u);
  EXPECT_EQ(stored.reports(1).report().seq(), 3u);

  v1::GetRunRequest run_q;
  run_q.set_run_id("run-r");
  v1::GetRunResponse run;
  grpc::ClientContext run_ctx;
  ASSERT_TRUE(v1::Query::NewStub(channel())->GetRun(&run_ctx, run_q, &run).ok());
  EXPECT_EQ(run.summary().rejected_reports(), 1u);
}

TEST_F(ServerProtocolTest, UnicodeNamesAreStoredAsWrittenAndOneBadTensorIsRefusedAlone) {
  const std::string unicode = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";
  AgentStream agent(channel());
  v1::Hello hello = make_hello("run-u");
  hello.set_host("h\xc3\xb4te");
  ASSERT_TRUE(agent.send_hello(hello));
  v1::StepReport first = make_report("run-u", 0, 1, 0, 3);
  first.mutable_tensors(0)->set_name(unicode);
  first.mutable_first_offender()->set_tensor(unicode);
  first.add_notices("trainer: " + unicode);
  ASSERT_TRUE(agent.send(first));
  v1::StepReport second = make_report("run-u", 0, 2, 1, 3);
  second.mutable_tensors(0)->set_name(unicode);
  second.mutable_tensors(1)->set_name("h0.bad");
  second.mutable_tensors(1)->set_zeros(second.tensors(1).numel() + 1);
  second.mutable_first_offender()->set_tensor("h0\x1b[2J");
  ASSERT_TRUE(agent.send(second));
  ASSERT_TRUE(agent.wait_ack(2).has_value());
  EXPECT_TRUE(agent.finish().ok());
  for (const v1::ServerMessage& m : agent.messages()) EXPECT_FALSE(m.has_reject());

  const std::vector<v1::StepReport> stored = stored_reports(server_->address(), "run-u");
  ASSERT_EQ(stored.size(), 2u);
  // Read back exactly as sent.
  EXPECT_EQ(stored[0].SerializeAsString(), first.SerializeAsString());
  EXPECT_EQ(stored[0].tensors(0).name(), unicode);
  EXPECT_EQ(stored[0].first_offender().tensor(), unicode);
  // The second without its bad tensor, its first offender's name escaped.
  ASSERT_EQ(stored[1].tensors_size(), 2);
  EXPECT_EQ(stored[1].tensors(0).SerializeAsString(), second.tensors(0).SerializeAsString());
  EXPECT_EQ(stored[1].tensors(1).SerializeAsString(), second.tensors(2).SerializeAsString());
  EXPECT_EQ(stored[1].first_offender().tensor(), "h0\\x1b[2J");

  const std::optional<v1::GetRunResponse> run = get_run(server_->address(), "run-u");
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->summary().rejected_reports(), 0u);
  ASSERT_EQ(run->agents_size(), 1);
  EXPECT_EQ(run->agents(0).host(), "h\xc3\xb4te");
  const auto& notices = run->agents(0).notices();
  const auto has = [&](const std::string& n) {
    return std::find(notices.begin(), notices.end(), n) != notices.end();
  };
  EXPECT_TRUE(has("trainer: " + unicode));
  EXPECT_TRUE(
      has("server: refused tensor 'h0.bad' alone (counts_exceed_numel at numel); the "
          "rest of its step is stored"));
  EXPECT_TRUE(has("server: first offender 'h0?[2J' (string): stored as 'h0\\x1b[2J'"));

  // The web UI's API over HTTP: the tensor page asked by the name, percent-encoded as a browser
  // sends it, answers with the name as written.
  std::string body;
  EXPECT_EQ(http_get("http://" + server_->http_address() +
                         "/api/runs/run-u/tensor?name=" + url_encode(unicode) + "&role=weight_grad",
                     &body),
            200)
      << body;
  EXPECT_NE(body.find("\"name\":\"" + unicode + "\""), std::string::npos) << body;
  EXPECT_EQ(body.find("\"columns\":[]"), std::string::npos) << body;

  const auto samples = parse_samples(scrape(server_->metrics_address()));
  EXPECT_EQ(sample_value(samples, "ampscope_report_parts_refused_total",
                         {{"reason", "counts_exceed_numel"}}),
            1);
  EXPECT_EQ(sample_value(samples, "ampscope_report_parts_refused_total", {{"reason", "string"}}),
            1);
  EXPECT_EQ(
      sample_value(samples, "ampscope_reports_rejected_total", {{"reason", "counts_exceed_numel"}}),
      0);
}

TEST_F(ServerProtocolTest, OutOfOrderSeqOnAStreamIsRejected) {
  AgentStream agent(channel());
  ASSERT_TRUE(agent.send_hello(make_hello("run-o")));
  ASSERT_TRUE(agent.send(make_report("run-o", 0, 5, 0, 1)));
  ASSERT_TRUE(agent.send(make_report("run-o", 0, 4, 1, 1)));
  const std::optional<v1::Reject> reject = agent.wait_reject(4);
  ASSERT_TRUE(reject.has_value());
  EXPECT_EQ(reject->field(), "report.seq");
  EXPECT_EQ(reject->reason(), "seq_order");
  EXPECT_TRUE(agent.finish().ok());
}

TEST_F(ServerProtocolTest, InvalidHelloEndsTheStreamNamingTheField) {
  AgentStream agent(channel());
  ASSERT_TRUE(agent.send_hello(make_hello("bad/run id")));
  const grpc::Status st = agent.wait_end();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().rfind("hello.run_id: ", 0), 0u) << st.error_message();

  AgentStream rank(channel());
  ASSERT_TRUE(rank.send_hello(make_hello("run-h", 3, 2)));
  const grpc::Status rank_st = rank.wait_end();
  EXPECT_EQ(rank_st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(rank_st.error_message().rfind("hello.rank: ", 0), 0u) << rank_st.error_message();
}

TEST_F(ServerProtocolTest, ReportBeforeHelloEndsTheStream) {
  AgentStream agent(channel());
  ASSERT_TRUE(agent.send(make_report("run-x", 0, 1, 0, 1)));
  const grpc::Status st = agent.wait_end();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("Hello"), std::string::npos) << st.error_message();
}

TEST_F(ServerProtocolTest, OversizedMessageEndsTheStreamWithResourceExhausted) {
  AgentStream agent(channel());
  ASSERT_TRUE(agent.send_hello(make_hello("run-big")));
  ASSERT_TRUE(agent.wait_ack(0).has_value());
  agent.send(make_report("run-big", 0, 1, 0, 600));  // about 90 KB > 32K
  const grpc::Status st = agent.wait_end();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
}

// grpc.health.v1.Health/Check by hand (the C++ library has no client stub for it): the
// request is HealthCheckRequest{service}, the answer HealthCheckResponse{status}, 1 = SERVING.
grpc::Status health_check(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                          int* status) {
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);  // field 1, length-delimited
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status result;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                 [&](grpc::Status s) {
                   std::lock_guard lock(mu);
                   result = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  if (result.ok()) {
    std::vector<grpc::Slice> slices;
    out.Dump(&slices);
    std::string bytes;
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    *status = bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  }
  return result;
}

TEST_F(ServerProtocolTest, HealthServiceAnswers) {
  int status = -1;
  ASSERT_TRUE(health_check(channel(), "", &status).ok());
  EXPECT_EQ(status, 1);
  ASSERT_TRUE(health_check(channel(), "ampscope.v1.Telemetry", &status).ok());
  EXPECT_EQ(status, 1);
  EXPECT_EQ(health_check(channel(), "no.such.Service", &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace ampscope::testing
