// Back-pressure under overload: the real server with a deliberately slowed ingest (the hidden
// --test-ingest-item-delay-us hook) and a small --ingest-queue-bytes, offered about four times
// the reports it can settle by streams that pace themselves. The server stops reading while its
// queue of unsettled work is over the bound (the agents' writes then block in gRPC flow
// control, where a real agent spools), resumes when it drains, and acknowledges every report
// exactly once in the end.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server_harness.h"

namespace ampscope::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kStreams = 8;
constexpr std::uint64_t kReports = 120;     // per stream
constexpr int kTensors = 200;               // a report of about 20 KB on the wire
constexpr std::uint64_t kBound = 1u << 20;  // --ingest-queue-bytes 1M
constexpr auto kItemDelay = 2ms;            // the server settles at most 500 reports/s
constexpr auto kSendEvery = 4ms;            // each stream offers 250/s: 2,000/s in all

TEST(ServerBackpressureTest, StopsReadingOverTheBoundAndAcknowledgesEveryReportOnce) {
  TempDir dir;
  ServerProcess server(
      dir.path(), dir / "store.db",
      {"--ingest-queue-bytes", "1M", "--ingest-shards", "2", "--test-ingest-item-delay-us",
       std::to_string(std::chrono::microseconds(kItemDelay).count()), "--sync", "normal"});
  const std::size_t report_bytes =
      make_report("bp-0", 0, 1, 1, kTensors).ByteSizeLong() + 16;  // in its AgentMessage

  // The queue as /metrics shows it, sampled while the streams send.
  std::atomic<bool> sending{true};
  double max_queued = 0;
  double max_paused = 0;
  std::thread sampler([&] {
    while (sending) {
      const std::vector<Sample> s = parse_samples(scrape(server.metrics_address()));
      max_queued = std::max(max_queued, sample_value(s, "ampscope_ingest_queued_bytes"));
      max_paused = std::max(max_paused, sample_value(s, "ampscope_ingest_paused_streams"));
      std::this_thread::sleep_for(20ms);
    }
  });

  std::vector<std::unique_ptr<AgentStream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<AgentStream>(make_channel(server.address())));
    ASSERT_TRUE(streams.back()->send_hello(make_hello("bp-" + std::to_string(i))));
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> senders;
  std::atomic<int> failed_sends{0};
  for (int i = 0; i < kStreams; ++i) {
    senders.emplace_back([&, i] {
      const std::string run = "bp-" + std::to_string(i);
      auto next = std::chrono::steady_clock::now();
      for (std::uint64_t seq = 1; seq <= kReports; ++seq) {
        // Blocks while the server does not read: gRPC flow control, the agents' spool.
        if (!streams[i]->send(make_report(run, 0, seq, static_cast<std::int64_t>(seq), kTensors))) {
          ++failed_sends;
          return;
        }
        next += kSendEvery;
        std::this_thread::sleep_until(next);
      }
    });
  }
  for (std::thread& t : senders) t.join();
  const double send_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& s : streams) EXPECT_TRUE(s->wait_ack(kReports, 30s).has_value());
  const double settle_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  sending = false;
  sampler.join();
  ASSERT_EQ(failed_sends, 0);

  // The offered rate was more than twice what the server settles: the senders were held back.
  const double total = static_cast<double>(kStreams * kReports);
  const double capacity = 1.0 / std::chrono::duration<double>(kItemDelay).count();
  EXPECT_GE(settle_s, total / capacity * 0.9);
  EXPECT_GT(send_s, total / (kStreams / std::chrono::duration<double>(kSendEvery).count()) * 2);

  // Memory stayed bounded: the queue never held more than the bound plus one message per
  // stream being read, and streams were paused.
  EXPECT_GT(max_queued, 0);
  EXPECT_LE(max_queued, static_cast<double>(kBound + (kStreams + 1) * report_bytes));
  EXPECT_GT(max_paused, 0);
  const std::vector<Sample> after = parse_samples(scrape(server.metrics_address()));
  EXPECT_GT(sample_value(after, "ampscope_ingest_read_pauses_total"), 0);
  EXPECT_EQ(sample_value(after, "ampscope_ingest_queued_bytes"), 0);
  EXPECT_EQ(sample_value(after, "ampscope_ingest_paused_streams"), 0);

  // Every report acknowledged exactly once: each stream's Acks rise strictly to its last seq,
  // and the store holds every report once, none dropped as a duplicate.
  for (int i = 0; i < kStreams; ++i) {
    std::uint64_t last = 0;
    bool first = true;
    for (const v1::ServerMessage& m : streams[i]->messages()) {
      if (!m.has_ack()) continue;
      if (!first) EXPECT_GT(m.ack().persisted_seq(), last) << "stream " << i;
      first = false;
      last = m.ack().persisted_seq();
    }
    EXPECT_EQ(last, kReports) << "stream " << i;
    EXPECT_TRUE(streams[i]->finish().ok());
    const std::optional<v1::GetRunResponse> run =
        get_run(server.address(), "bp-" + std::to_string(i));
    ASSERT_TRUE(run.has_value());
    EXPECT_EQ(run->summary().reports(), kReports) << "stream " << i;
  }
  double duplicates = 0;
  for (const Sample& s : find_samples(after, "ampscope_reports_duplicate_total")) {
    duplicates += s.value;
  }
  EXPECT_EQ(duplicates, 0);
}

}  // namespace
}  // namespace ampscope::testing
