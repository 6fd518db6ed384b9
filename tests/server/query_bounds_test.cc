// The Query service at the edges of its inputs: every numeric field of every request around
// 0, 2^31, 2^32-1, 2^63-1, 2^63 and 2^64-1 and negative, page tokens that no server issued,
// order-specific fields with the other order, and string fields that are huge or not UTF-8.
// Each request either answers what its documentation (query.proto) promises or is refused with
// INVALID_ARGUMENT naming the field; nothing wraps around and nothing is silently ignored.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "server_harness.h"

namespace ampscope::testing {
namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::uint64_t kUint64Max = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t kUint32Max = std::numeric_limits<std::uint32_t>::max();
constexpr const char* kRun = "run-bounds";
constexpr std::uint64_t kReports = 6;  // steps 1..6, rank 0

// One server with one run of kReports reports for the whole suite: the requests only read.
class QueryBoundsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    server_ = new ServerProcess(dir_->path(), *dir_ / "store.db");
    send_reports(make_channel(server_->address()), kRun, 1, kReports);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }

  static std::unique_ptr<v1::Query::Stub> stub() {
    return v1::Query::NewStub(make_channel(server_->address()));
  }
  static v1::GetReportsRequest reports_request() {
    v1::GetReportsRequest q;
    q.set_run_id(kRun);
    return q;
  }
  static grpc::Status get_reports(const v1::GetReportsRequest& q, v1::GetReportsResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    return stub()->GetReports(&ctx, q, out);
  }
  // The request's answer must be INVALID_ARGUMENT naming `field`.
  static void expect_invalid(const v1::GetReportsRequest& q, const std::string& field) {
    v1::GetReportsResponse out;
    const grpc::Status s = get_reports(q, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << q.ShortDebugString() << ": " << s.error_message() << ", " << out.reports_size()
        << " reports";
    EXPECT_EQ(s.error_message().rfind(field + ":", 0), 0u)
        << q.ShortDebugString() << ": " << s.error_message();
  }
  // The request must succeed with exactly `n` reports.
  static void expect_reports(const v1::GetReportsRequest& q, int n) {
    v1::GetReportsResponse out;
    const grpc::Status s = get_reports(q, &out);
    ASSERT_TRUE(s.ok()) << q.ShortDebugString() << ": " << s.error_message();
    EXPECT_EQ(out.reports_size(), n) << q.ShortDebugString();
  }

  static TempDir* dir_;
  static ServerProcess* server_;
};

TempDir* QueryBoundsTest::dir_ = nullptr;
ServerProcess* QueryBoundsTest::server_ = nullptr;

TEST_F(QueryBoundsTest, MalformedPageTokenIsInvalidArgument) {
  for (const std::string& token :
       std::vector<std::string>{"garbage", "1", "1:", ":1", "1:2:3", "1:0x", " 1:0", "-1:0", "0:-1",
                                "+1:0", "0:4294967296", "99999999999999999999:0",
                                "1:99999999999999999999", std::string(1 << 20, '7')}) {
    v1::GetReportsRequest q = reports_request();
    q.set_page_token(token);
    expect_invalid(q, "page_token");
  }
}

TEST_F(QueryBoundsTest, IssuedPageTokensStillPage) {
  v1::GetReportsRequest q = reports_request();
  q.set_limit(4);
  v1::GetReportsResponse first;
  ASSERT_TRUE(get_reports(q, &first).ok());
  ASSERT_EQ(first.reports_size(), 4);
  ASSERT_FALSE(first.next_page_token().empty());
  q.set_page_token(first.next_page_token());
  expect_reports(q, static_cast<int>(kReports) - 4);
  // A position beyond every stored step is a well-formed token: nothing after it.
  q.set_page_token(std::to_string(kInt64Max) + ":" + std::to_string(kUint32Max));
  expect_reports(q, 0);
}

TEST_F(QueryBoundsTest, AfterReportIdBeyondEveryIdReturnsNothing) {
  v1::GetReportsRequest q = reports_request();
  q.set_order(v1::REPORT_ORDER_ARRIVAL);
  expect_reports(q, static_cast<int>(kReports));
  // As int64 these are negative (2^63, 2^64-1) or the largest id: nothing comes after them.
  for (const std::uint64_t after :
       {std::uint64_t{1} << 63, (std::uint64_t{1} << 63) + 1, kUint64Max - 1, kUint64Max,
        static_cast<std::uint64_t>(kInt64Max)}) {
    q.set_after_report_id(after);
    expect_reports(q, 0);
    q.set_latest(true);
    expect_reports(q, 0);
    q.set_latest(false);
  }
}

TEST_F(QueryBoundsTest, FieldsOfTheOtherOrderAreRefused) {
  v1::GetReportsRequest step_order = reports_request();
  step_order.set_after_report_id(3);
  expect_invalid(step_order, "after_report_id");

  v1::GetReportsRequest arrival = reports_request();
  arrival.set_order(v1::REPORT_ORDER_ARRIVAL);
  arrival.set_page_token("1:0");
  expect_invalid(arrival, "page_token");

  v1::GetReportsRequest unknown = reports_request();
  unknown.set_order(static_cast<v1::ReportOrder>(7));
  expect_invalid(unknown, "order");
}

TEST_F(QueryBoundsTest, StepsAtTheInt64Limits) {
  for (const std::int64_t bad : {std::int64_t{-1}, kInt64Min}) {
    v1::GetReportsRequest from = reports_request();
    from.set_from_step(bad);
    expect_invalid(from, "from_step");
    v1::GetReportsRequest to = reports_request();
    to.set_to_step(bad);
    expect_invalid(to, "to_step");
  }
  v1::GetReportsRequest backwards = reports_request();
  backwards.set_from_step(5);
  backwards.set_to_step(3);
  expect_invalid(backwards, "to_step");

  v1::GetReportsRequest q = reports_request();
  q.set_from_step(kInt64Max);
  expect_reports(q, 0);
  q.set_from_step(0);
  q.set_to_step(kInt64Max);
  expect_reports(q, static_cast<int>(kReports));
  q.set_from_step(2);
  q.set_to_step(3);
  expect_reports(q, 2);
}

TEST_F(QueryBoundsTest, LimitsAndRanksAtTheUint32Limit) {
  for (const std::uint32_t limit : {std::uint32_t{1} << 31, kUint32Max}) {
    v1::GetReportsRequest q = reports_request();
    q.set_limit(limit);
    expect_reports(q, static_cast<int>(kReports));
    q.set_latest(true);
    expect_reports(q, static_cast<int>(kReports));

    grpc::ClientContext runs_ctx;
    v1::ListRunsRequest runs;
    runs.set_limit(limit);
    v1::ListRunsResponse listed;
    ASSERT_TRUE(stub()->ListRuns(&runs_ctx, runs, &listed).ok());
    EXPECT_EQ(listed.runs_size(), 1);

    grpc::ClientContext run_ctx;
    v1::GetRunRequest run;
    run.set_run_id(kRun);
    run.set_limit(limit);
    v1::GetRunResponse got;
    ASSERT_TRUE(stub()->GetRun(&run_ctx, run, &got).ok());
    EXPECT_EQ(got.summary().reports(), kReports);
  }
  v1::GetReportsRequest q = reports_request();
  q.set_rank(kUint32Max);
  expect_reports(q, 0);
  q.set_rank(0);
  expect_reports(q, static_cast<int>(kReports));
}

// Every request's run_id: empty, 1 MiB, and bytes that are not UTF-8 (protobuf's parser refuses
// those in a proto3 string, so the server must see them as bytes to name the field).
TEST_F(QueryBoundsTest, RunIdStringsAreCheckedByEveryRpc) {
  const std::string huge(1 << 20, 'r');
  const std::string not_utf8 = std::string("run-\xff\xfe-") + "x";
  for (const std::string& id : {std::string(), huge, not_utf8}) {
    auto client = stub();
    auto check = [&](const grpc::Status& s, const char* rpc) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << rpc << "(" << id.size() << " bytes): " << s.error_message();
      EXPECT_EQ(s.error_message().rfind("run_id", 0), 0u) << rpc << ": " << s.error_message();
    };
    {
      grpc::ClientContext ctx;
      v1::GetRunRequest q;
      q.set_run_id(id);
      v1::GetRunResponse out;
      check(client->GetRun(&ctx, q, &out), "GetRun");
    }
    {
      v1::GetReportsRequest q;
      q.set_run_id(id);
      v1::GetReportsResponse out;
      check(get_reports(q, &out), "GetReports");
    }
    {
      grpc::ClientContext ctx;
      v1::GetPolicyRequest q;
      q.set_run_id(id);
      v1::GetPolicyResponse out;
      check(client->GetPolicy(&ctx, q, &out), "GetPolicy");
    }
    {
      grpc::ClientContext ctx;
      v1::DeleteRunRequest q;
      q.set_run_id(id);
      v1::DeleteRunResponse out;
      check(client->DeleteRun(&ctx, q, &out), "DeleteRun");
    }
  }
  // Nothing above deleted or changed the run.
  expect_reports(reports_request(), static_cast<int>(kReports));
}

TEST_F(QueryBoundsTest, PageTokenThatIsNotUtf8IsInvalidArgument) {
  v1::GetReportsRequest q = reports_request();
  q.set_page_token("1:\xff");
  expect_invalid(q, "page_token");
}

}  // namespace
}  // namespace ampscope::testing
