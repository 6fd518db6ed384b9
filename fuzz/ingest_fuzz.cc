// Target: ingest of validated reports (server/src/ingest.h), the way a stream's reactor feeds
// it, into a real store (SQLite in the scratch directory) with the headroom policy and its FP32
// fallback; then a restart on the same store.
// Input: one stream (support.h, parse_stream). Its first valid Hello opens the stream; every
// report after it is validated (validation.h) and submitted as a report or a rejection, as
// AttachReactor does. Ingest's thread takes them; stop() commits everything queued, so a run is
// deterministic.
// Properties:
//   - the store holds exactly the reports that passed validation, each as sent less the parts
//     validation refused alone;
//   - the stream is settled up to its highest seq, and the store never fails;
//   - every policy decision takes effect after the step it saw, with a loss scale that is a
//     power of two within its bounds;
//   - a server restarted on the store restores (policy snapshot, replay) without error, and the
//     same stream sent again stores nothing new (every report is a duplicate).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ingest.h"
#include "metrics.h"
#include "policy_host.h"
#include "run_registry.h"
#include "store.h"
#include "streams.h"
#include "support.h"
#include "validation.h"

namespace ampscope::fuzz {
namespace {

using namespace ampscope::server;

// What Ingest tells the stream.
class RecordingSink : public StreamSink {
 public:
  void on_settled(std::uint64_t persisted_seq, int items,
                  const std::vector<v1::PolicyUpdate>& policies) override {
    persisted_seq_ = std::max(persisted_seq_, persisted_seq);
    settled_items_ += items;
    policies_ += static_cast<int>(policies.size());
  }
  void on_policy(const v1::PolicyUpdate&) override { ++policies_; }
  void on_store_failure(const std::string& message) override { store_failure_ = message; }
  void on_run_deleted(const std::string&) override {}
  void drain() override {}

  std::uint64_t persisted_seq_ = 0;
  int settled_items_ = 0;
  int policies_ = 0;
  std::string store_failure_;
};

policy::EngineConfig engine_config() {
  policy::EngineConfig c;
  c.mode = policy::PolicyMode::kHeadroom;
  c.fp32_fallback.enabled = true;
  return c;
}

bool power_of_two(double x) {
  int e = 0;
  return std::isfinite(x) && x > 0.0 && std::frexp(x, &e) == 0.5;
}

// One server's ingest over the store at `db`, as server.cc wires it (no gRPC, no metrics
// endpoint).
struct Server {
  explicit Server(const std::string& db, Metrics& metrics)
      : store(StoreOptions{db, false}),
        runs(8),
        policy(engine_config(), std::chrono::hours(1), runs),
        ingest(store, runs, metrics, policy, streams, IngestOptions{}) {
    ingest.restore();
    ingest.start();
  }
  ~Server() { ingest.stop(); }

  // Submits the stream: returns the reports that passed, less their refused parts, or nothing
  // without a valid Hello.
  std::vector<v1::StepReport> send(const std::vector<v1::AgentMessage>& stream,
                                   const std::shared_ptr<RecordingSink>& sink) {
    std::vector<v1::StepReport> accepted;
    std::optional<StreamIdentity> identity;
    for (const v1::AgentMessage& m : stream) {
      if (!identity) {
        if (!m.has_hello() || validate_hello(m.hello())) continue;
        identity = stream_identity(m.hello());
        IngestItem item = item_for(*identity, sink);
        item.kind = IngestItem::Kind::kHello;
        item.hello = std::make_unique<v1::Hello>(m.hello());
        FUZZ_CHECK(ingest.submit(std::move(item)), "ingest refused a Hello");
        continue;
      }
      if (!m.has_report()) continue;
      v1::StepReport r = m.report();
      IngestItem item = item_for(*identity, sink);
      item.seq = r.seq();
      ReportVerdict verdict = validate_report(r, *identity);
      if (std::optional<Violation>& v = verdict.rejected) {
        item.kind = IngestItem::Kind::kReject;
        item.violation = std::move(*v);
        // A seq the store cannot hold (above INT64_MAX) settles nothing, as in the reactor.
        if (r.seq() > static_cast<std::uint64_t>(INT64_MAX)) item.seq = 0;
        if (item.seq > identity->previous_seq) identity->previous_seq = item.seq;
      } else {
        identity->previous_seq = r.seq();
        item.kind = IngestItem::Kind::kReport;
        item.payload = r.SerializeAsString();
        item.arena = std::make_unique<google::protobuf::Arena>();
        item.report = google::protobuf::Arena::CreateMessage<v1::StepReport>(item.arena.get());
        *item.report = r;
        for (Refusal& refusal : verdict.refused) item.notices.push_back(std::move(refusal.notice));
        accepted.push_back(std::move(r));
      }
      FUZZ_CHECK(ingest.submit(std::move(item)), "ingest refused an item");
    }
    return accepted;
  }

  static IngestItem item_for(const StreamIdentity& identity,
                             const std::shared_ptr<RecordingSink>& sink) {
    IngestItem item;
    item.sink = sink;
    item.run_id = identity.run_id;
    item.rank = identity.rank;
    item.received_ns = 1'700'000'000'000'000'000;
    item.received = std::chrono::steady_clock::now();
    return item;
  }

  StoreWriter store;
  RunRegistry runs;
  PolicyHost policy;
  StreamTable streams;
  Ingest ingest;
};

void check_stored(const std::string& db, const std::string& run_id,
                  const std::vector<v1::StepReport>& accepted) {
  StoreReader reader(db);
  v1::GetReportsRequest q;
  q.set_run_id(run_id);
  q.set_include_tensors(true);
  q.set_order(v1::REPORT_ORDER_ARRIVAL);
  q.set_limit(10000);
  const std::optional<v1::GetReportsResponse> stored = reader.get_reports(q);
  FUZZ_CHECK(stored.has_value() || accepted.empty(), "a run with stored reports is unknown");
  const int n = stored ? stored->reports_size() : 0;
  FUZZ_CHECK(n == static_cast<int>(accepted.size()),
             std::to_string(n) + " stored, " + std::to_string(accepted.size()) + " accepted");
  for (int i = 0; i < n; ++i) {
    // Compared serialised: a NaN loss is valid, and equal to nothing field by field.
    FUZZ_CHECK(stored->reports(i).report().SerializeAsString() == accepted[i].SerializeAsString(),
               "stored report " + std::to_string(i) + " differs from the one sent");
  }
  const std::optional<v1::GetPolicyResponse> policy = reader.get_policy(run_id);
  if (!policy) return;
  for (const v1::PolicyDecision& d : policy->history()) {
    const v1::PolicyUpdate& u = d.update();
    FUZZ_CHECK(u.effective_from_step() > u.decided_at_step(), u.ShortDebugString());
    if (u.has_loss_scale()) {
      FUZZ_CHECK(power_of_two(u.loss_scale()), u.ShortDebugString());
      if (u.has_min_scale()) FUZZ_CHECK(u.loss_scale() >= u.min_scale(), u.ShortDebugString());
      if (u.has_max_scale()) FUZZ_CHECK(u.loss_scale() <= u.max_scale(), u.ShortDebugString());
    }
    FUZZ_CHECK(one_line(u.reason()), u.reason());
  }
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ampscope;
  using namespace ampscope::fuzz;
  const std::vector<v1::AgentMessage> stream = parse_stream(data, size);
  if (stream.empty()) return 0;
  static server::Metrics metrics("fuzz");
  const std::filesystem::path db = scratch_dir() / "ingest.db";
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::filesystem::remove(db.string() + suffix);
  }

  std::vector<v1::StepReport> accepted;
  std::string run_id;
  {
    Server server(db.string(), metrics);
    auto sink = std::make_shared<RecordingSink>();
    accepted = server.send(stream, sink);
    server.ingest.stop();
    FUZZ_CHECK(sink->store_failure_.empty(), sink->store_failure_);
    for (const v1::AgentMessage& m : stream) {
      if (m.has_hello() && !server::validate_hello(m.hello())) {
        run_id = m.hello().run_id();
        break;
      }
    }
    if (!accepted.empty()) {
      FUZZ_CHECK(sink->persisted_seq_ >= accepted.back().seq(), "the stream was not settled");
    }
  }
  if (run_id.empty()) return 0;
  check_stored(db.string(), run_id, accepted);

  // A restart: the store's state restored, the same stream replayed as duplicates.
  Server restarted(db.string(), metrics);
  auto sink = std::make_shared<RecordingSink>();
  restarted.send(stream, sink);
  restarted.ingest.stop();
  FUZZ_CHECK(sink->store_failure_.empty(), sink->store_failure_);
  check_stored(db.string(), run_id, accepted);
  return 0;
}
