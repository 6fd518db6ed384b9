// Failover time of ampscope-server (docs/benchmarks.md, docs/deploy.md): a real PostgreSQL
// (ampscope::test_postgres, with its durable defaults), two ampscope-server processes sharing a
// database with --run-leases --lease-ttl TTL, and one agent (the real agent library, its default
// reconnect settings unless --agent says otherwise) given both servers and reporting --rate
// steps a second. Once the run is under way its owner is killed with SIGKILL, and the store is
// polled (LeasedServers::kill_owner) for:
//
//   - the lease: the run's lease row names the other server (it claims the run at the first
//     Hello after the lease expired, so this includes the agent's reconnects);
//   - the first report: the new owner stored a report of the run (it acknowledges as its commit
//     returns): what the agent and the person watching the run see.
//
// --repeats times, each on a fresh database and fresh servers; every step must be stored once
// at the end (the run fails otherwise). Writes a JSON fragment (--out) with server_failover_s
// (median kill -> first report), server_failover_s_max, server_failover_lease_s (median) and
// the conditions: the ttl, the agent's backoff and connect timeout, the repeats.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/agent/config.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/leased_servers.h"
#include "ampscope/testing/postgres.h"
#include "ampscope/testing/wait_until.h"

namespace {

using namespace std::chrono_literals;
using ampscope::testing::LeasedServers;
using ampscope::testing::PostgresInstance;
using ampscope::testing::Takeover;
using ampscope::testing::TempDir;

struct Options {
  std::string ttl = "10s";
  int repeats = 3;
  double rate = 10.0;              // steps per second
  double after_s = 2.0;            // seconds of steps after the takeover
  std::vector<std::string> agent;  // KEY=VALUE agent options
  std::string out;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

// An agent stepping at a fixed rate on a thread of its own until told to stop.
class SteppingAgent {
 public:
  SteppingAgent(const ampscope::agent::AgentConfig& config, double rate) {
    ampscope::agent::RunInfo info;
    info.trainer = "ampscope_server_failover";
    const ampscope::agent::Status s = ampscope::agent::Agent::create(config, info, &agent_);
    if (!s.ok()) throw std::runtime_error("agent: " + s.message);
    const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(1.0 / rate));
    thread_ = std::thread([this, period] {
      auto next = std::chrono::steady_clock::now();
      while (!stop_.load()) {
        agent_->begin_step(steps_);
        ampscope::agent::StepInfo step;
        step.step = steps_;
        step.loss_scale = step.scale_after = 65536.0;
        agent_->end_step(step);
        steps_.fetch_add(1);
        next += period;
        std::this_thread::sleep_until(next);
      }
    });
  }
  ~SteppingAgent() { stop(); }
  // Stops stepping and waits for every report's acknowledgement; the steps taken.
  std::int64_t stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (agent_) {
      const ampscope::agent::Status s = agent_->shutdown(60s);
      if (!s.ok()) std::cerr << "agent shutdown: " << s.message << "\n";
      agent_.reset();
    }
    return steps_.load();
  }
  std::int64_t steps() const { return steps_.load(); }

 private:
  std::unique_ptr<ampscope::agent::Agent> agent_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> steps_{0};
  std::thread thread_;
};

// One failover; throws when the run's steps are not each stored once. `base`: the agent's
// configuration before its run and servers.
Takeover measure_once(PostgresInstance& postgres, const Options& o,
                      const ampscope::agent::AgentConfig& base, int index) {
  TempDir dir;
  LeasedServers servers(dir.path(), postgres.create_database(), 2, o.ttl);
  const std::string run_id = "failover-" + std::to_string(index);
  ampscope::agent::AgentConfig config = base;
  config.run_id = run_id;
  config.server = servers.addresses();
  config.spool_dir = (dir / "spool").string();
  SteppingAgent agent(config, o.rate);
  // Under way: a couple of seconds of steps stored by the first owner.
  const auto under_way = static_cast<std::int64_t>(std::max(5.0, 2.0 * o.rate));
  if (!ampscope::testing::wait_until(
          [&] { return servers.last_report_id(run_id) > 0 && agent.steps() >= under_way; }, 60s)) {
    throw std::runtime_error("the run did not start; a server's log:\n" + servers.at(0).log());
  }
  const std::optional<Takeover> t = servers.kill_owner(run_id, 120s);
  if (!t) throw std::runtime_error("no takeover within 120 s");
  std::this_thread::sleep_for(std::chrono::duration<double>(o.after_s));
  const std::int64_t steps = agent.stop();
  const auto counts = servers.db().query(
      "SELECT count(*), count(DISTINCT r.seq), coalesce(min(r.seq), 0), coalesce(max(r.seq), 0) "
      "FROM reports r JOIN runs u ON r.run = u.id WHERE u.run_id = $1",
      {run_id});
  const std::string expect = std::to_string(steps);
  if (counts.at(0) != std::vector<std::string>{expect, expect, "1", expect}) {
    throw std::runtime_error("run " + run_id + ": " + expect +
                             " steps, stored: " + counts.at(0)[0] + " reports, " + counts.at(0)[1] +
                             " distinct seqs from " + counts.at(0)[2] + " to " + counts.at(0)[3]);
  }
  std::printf(
      "failover %d: lease after %.2f s, first report after %.2f s (%lld steps, each "
      "stored once)\n",
      index + 1, t->lease.count(), t->first_report.count(), static_cast<long long>(steps));
  std::fflush(stdout);  // progress, also when stdout is a file
  return *t;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ampscope-server failover time: two servers on one PostgreSQL, the owner killed"};
  app.add_option("--ttl", o.ttl, "The servers' --lease-ttl")->capture_default_str();
  app.add_option("--repeats", o.repeats, "Failovers measured (median)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--rate", o.rate, "The agent's steps per second")
      ->check(CLI::Range(0.5, 1000.0))
      ->capture_default_str();
  app.add_option("--after", o.after_s, "Seconds of steps after the takeover")
      ->capture_default_str();
  app.add_option("--agent", o.agent,
                 "Agent option KEY=VALUE (repeatable; default: the agent's own defaults)");
  app.add_option("--out", o.out, "Write the JSON fragment here");
  CLI11_PARSE(app, argc, argv);

  try {
    ampscope::agent::AgentConfig agent;
    for (const std::string& kv : o.agent) {
      const std::size_t eq = kv.find('=');
      const std::string error = ampscope::agent::set_option(
          agent, kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
      if (!error.empty()) throw std::runtime_error("--agent " + kv + ": " + error);
    }
    PostgresInstance postgres(ampscope::testing::PostgresOptions{.durable = true});
    std::vector<double> first, lease;
    for (int i = 0; i < o.repeats; ++i) {
      const Takeover t = measure_once(postgres, o, agent, i);
      first.push_back(t.first_report.count());
      lease.push_back(t.lease.count());
    }
    nlohmann::json j;
    j["server_failover_s"] = median(first);
    j["server_failover_s_max"] = *std::max_element(first.begin(), first.end());
    j["server_failover_lease_s"] = median(lease);
    j["server_failover_ttl"] = o.ttl;
    j["server_failover_repeats"] = o.repeats;
    j["server_failover_agent_backoff_ms"] = {agent.backoff_initial.count(),
                                             agent.backoff_max.count()};
    j["server_failover_agent_connect_timeout_ms"] = agent.connect_timeout.count();
    j["server_failover_postgres"] = postgres.version();
    std::printf("server_failover_s %.2f (median of %d, max %.2f), lease %.2f s, ttl %s\n",
                j["server_failover_s"].get<double>(), o.repeats,
                j["server_failover_s_max"].get<double>(),
                j["server_failover_lease_s"].get<double>(), o.ttl.c_str());
    if (!o.out.empty()) {
      std::ofstream f(o.out);
      f << j.dump(2) << "\n";
      if (!f) throw std::runtime_error("cannot write " + o.out);
    }
  } catch (const std::exception& e) {
    std::cerr << "ampscope_server_failover: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
