// Load generator for ampscope-server (docs/benchmarks.md): starts the real server as a child
// process on loopback, opens N agent streams (callback-API clients) that send realistic step
// reports (about 200 tensors each, binade histograms from compute_stats on synthetic
// gradients), and measures:
//
//   1. latency: open loop at `--offered` TensorStats per second spread over the streams (the
//      way training steps arrive), on the fresh server; p50/p99 of the time from sending a
//      report to receiving the Ack that covers it, over `--latency-duration` seconds after a
//      warm-up;
//   2. throughput: closed loop, each stream keeps `--window` reports unacknowledged; the rate
//      of TensorStats acknowledged over `--duration` seconds (after a warm-up), and the
//      server's RSS at the start and end of the phase (memory must stay bounded);
//   3. the server's peak resident memory (VmHWM) over both phases.
//
// Writes a JSON fragment (--out) with server_ingest_tensor_stats_per_s, server_ack_p99_ms,
// server_peak_rss_mb and the conditions they were measured under.
//
// With --runs N it measures how the server grows with the number of runs instead: N runs, each
// one agent stream that sends its Hello and --runs-reports reports (waiting for their Ack) and
// goes away, --streams of them at a time; then the size of a /metrics scrape (bytes, ampscope_
// sample lines), the time it takes (median and slowest of --scrapes), and the server's resident
// memory now (VmRSS) and at its peak (VmHWM). --server-binary picks the server to measure, so
// two builds can be compared on the same machine.
//
// With --ranks N it measures one synchronous data-parallel run instead: N ranks (world_size N,
// data_parallel_size N, POLICY_AGREEMENT_PER_STEP), one stream and connection each, each sending
// one report per step at --rank-rate steps/s (weight gradients after unscaling, the same on
// every rank; activation gradients the rank's own), the same step on every rank, each rank's send
// delayed by a uniform [0, --rank-spread-ms) drawn anew every step; the server runs the headroom
// policy, so its per-step merge and engine are on the path. Writes server_<N>_ranks_* keys:
// report-to-Ack p50/p99 over all ranks, the acknowledged rate, the server's RSS every
// --rank-rss-every seconds of the window and its growth, its peak, and whether every report was
// acknowledged (and any Reject). --sample-full-ranks makes the ranks send what agents with that
// option send (the agent's own rule decides, rank r's local rank being r % --ranks-per-node):
// the chosen ranks full reports, the others the same tensors at the counts level.
//
// With --long-run N it fills a running server (--server) with one long run instead: run
// --long-run-id, one rank, N steps of --tensors tensors each, with the shape of a real run (a
// decaying loss, a validation loss every 1000 steps, an overflow every 997 steps that skips the
// step, halves the scale and names a first offender, growth after 2000 clean steps, a step time
// and a tensor-core ratio), as fast as the server acknowledges. The web UI's page-load benchmark
// (bench/webui_page_load.mjs) measures pages of that run. Prints the seconds it took.
//
// The store: --db-backend sqlite (default) gives the server a SQLite file in the work
// directory; --db-backend postgres starts a real PostgreSQL first (ampscope::test_postgres,
// Debian's package, in a temporary directory on a Unix socket, with its durable defaults:
// fsync and synchronous_commit on, as SQLite's --sync full) and gives the server a database
// there. --servers N starts N servers sharing that database with --run-leases (each run owned
// by one of them): the load phases' runs go to server k % N, run k's eight ranks together;
// with --ranks, rank r is given the servers' addresses from entry r % N on (as an agent given
// `server=a,b` and a DNS name spreading its first choice) and follows the Redirect of a server
// that does not own the run. The keys say the store: server_postgres_* (one server on
// PostgreSQL), server_2pg_* (two on one PostgreSQL), server_<N>_ranks_2pg_* and so on.
#include <curl/curl.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "ampscope/agent/config.h"
#include "ampscope/proto/stats_codec.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/v1/telemetry.grpc.pb.h"

#ifdef AMPSCOPE_BENCH_POSTGRES
#include "ampscope/testing/postgres.h"
#endif

#ifndef AMPSCOPE_SERVER_BINARY
#define AMPSCOPE_SERVER_BINARY "ampscope-server"
#endif

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace v1 = ampscope::v1;

struct Options {
  std::string server_binary = AMPSCOPE_SERVER_BINARY;
  std::string server_address;  // use a running server instead of starting one
  int streams = 64;
  int tensors = 200;
  std::size_t elements = 4096;  // per synthetic tensor (the histogram is what matters)
  double duration_s = 20;
  double warmup_s = 3;
  int window = 4;
  double offered = 100000;  // TensorStats per second in the latency phase
  double latency_s = 15;
  std::string sync = "full";
  std::string out;
  std::string work_dir;
  std::vector<std::string> server_args;  // extra ampscope-server flags
  int runs = 0;                          // > 0: the runs measurement instead of the load phases
  int runs_reports = 1;
  int scrapes = 5;
  int ranks = 0;  // > 0: one data-parallel run of this many ranks instead of the load phases
  int rank_tensors = 200;
  double rank_rate = 1;  // steps per second
  double rank_duration_s = 60;
  double rank_warmup_s = 5;
  double rank_spread_ms = 20;
  double rank_rss_every_s = 2;
  double rank_growth_from_s = 10;
  double rank_drain_s = 30;               // after the window, the longest wait for outstanding Acks
  std::string sample_full_ranks = "all";  // the agent option the ranks follow
  int ranks_per_node = 8;
  bool require_acked = false;
  std::int64_t long_run = 0;  // > 0: fill --server with one run of this many steps
  std::string long_run_id = "bench-long";
  std::string db_backend = "sqlite";
  int servers = 1;
  std::string lease_ttl = "10s";
  bool postgres_durable = true;
};

// What the keys say about the store: "" (one server on SQLite, the keys as they always were),
// "postgres" (one on PostgreSQL), "2pg" (two sharing one PostgreSQL).
std::string store_tag(const Options& o) {
  if (o.servers > 1) return std::to_string(o.servers) + "pg";
  return o.db_backend == "postgres" ? "postgres" : "";
}

// --- The server under test --------------------------------------------------------------------

class ServerChild {
 public:
  // Server `index` (its files are named after it) on the store `db`.
  ServerChild(const Options& o, const std::filesystem::path& dir, const std::string& db,
              int index) {
    const std::string name = "server-" + std::to_string(index);
    const std::filesystem::path ready = dir / (name + "-ready.json");
    log_ = dir / (name + ".log");
    std::vector<std::string> argv = {o.server_binary,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "",
                                     "--http-listen",
                                     "127.0.0.1:0",
                                     "--db",
                                     db,
                                     "--ready-file",
                                     ready.string(),
                                     "--sync",
                                     o.sync,
                                     "--max-in-flight",
                                     "1024"};
    // --metrics-listen: the runs and ranks measurements scrape
    if (o.runs > 0 || o.ranks > 0) argv[4] = "127.0.0.1:0";
    // Servers sharing a store: one owner per run (a lease row in the store), and agents sent
    // to it; the advertised address is --listen's, with the port the server bound.
    if (o.servers > 1) argv.insert(argv.end(), {"--run-leases", "--lease-ttl", o.lease_ttl});
    argv.insert(argv.end(), o.server_args.begin(), o.server_args.end());
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) {
      throw std::runtime_error("cannot start " + o.server_binary);
    }
    posix_spawn_file_actions_destroy(&fa);
    const auto deadline = Clock::now() + 30s;
    while (!std::filesystem::exists(ready)) {
      if (Clock::now() > deadline || waitpid(pid_, nullptr, WNOHANG) == pid_) {
        throw std::runtime_error("ampscope-server did not start; see " + log_.string());
      }
      std::this_thread::sleep_for(20ms);
    }
    std::ifstream in(ready);
    const nlohmann::json addresses = nlohmann::json::parse(in);
    address_ = addresses.at("grpc").get<std::string>();
    metrics_address_ = addresses.value("metrics", "");
  }
  ~ServerChild() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  const std::filesystem::path& log() const { return log_; }
  // kB from /proc/PID/status ("VmHWM", "VmRSS").
  long status_kb(const std::string& key) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(key + ":", 0) == 0) return std::stol(line.substr(key.size() + 1));
    }
    return -1;
  }
  // CPU seconds (user + system) the server has used so far.
  double cpu_s() const;

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_;
  std::string address_;
  std::string metrics_address_;
};

// The fields of /proc/PID/stat after "pid (comm) ", the first being field 3 (state); empty when
// the process is gone.
std::vector<std::string> proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> fields;
  if (const std::size_t paren = stat.rfind(')'); paren != std::string::npos) {
    std::istringstream in_fields(stat.substr(paren + 2));
    for (std::string f; in_fields >> f;) fields.push_back(f);
  }
  return fields;
}

// CPU seconds (user + system) process `pid` has used so far; 0 when it is gone.
double process_cpu_s(pid_t pid) {
  const std::vector<std::string> f = proc_stat(pid);
  if (f.size() < 13) return 0;
  return (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double ServerChild::cpu_s() const { return process_cpu_s(pid_); }

// CPU seconds of `root` and its children now running (PostgreSQL: the postmaster and its
// backends and workers).
double process_tree_cpu_s(pid_t root) {
  double total = process_cpu_s(root);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    const std::vector<std::string> f = proc_stat(pid);
    if (f.size() > 1 && std::stol(f[1]) == root) total += process_cpu_s(pid);
  }
  return total;
}

// The servers under test (--servers of them on one store) and what the measurements read of
// them together.
class Servers {
 public:
  Servers(const Options& o, const std::filesystem::path& dir, const std::string& db) {
    for (int i = 0; i < o.servers; ++i) {
      servers_.push_back(std::make_unique<ServerChild>(o, dir, db, i));
    }
  }
  std::size_t size() const { return servers_.size(); }
  ServerChild& operator[](std::size_t i) const { return *servers_[i]; }
  std::vector<std::string> addresses() const {
    std::vector<std::string> out;
    for (const auto& s : servers_) out.push_back(s->address());
    return out;
  }
  // kB: the sum of their VmRSS (the service's memory); -1 when one cannot be read.
  long rss_kb() const {
    long total = 0;
    for (const auto& s : servers_) {
      const long kb = s->status_kb("VmRSS");
      if (kb < 0) return -1;
      total += kb;
    }
    return total;
  }
  // kB: the largest VmHWM of one server.
  long peak_kb() const {
    long peak = -1;
    for (const auto& s : servers_) peak = std::max(peak, s->status_kb("VmHWM"));
    return peak;
  }
  double cpu_s() const {
    double total = 0;
    for (const auto& s : servers_) total += s->cpu_s();
    return total;
  }

 private:
  std::vector<std::unique_ptr<ServerChild>> servers_;
};

// --- Realistic reports --------------------------------------------------------------------------

v1::TensorStats to_proto(const ampscope::TensorStats& s, const std::string& name,
                         v1::TensorRole role, double scale, std::size_t n) {
  v1::TensorStats t;
  t.set_name(name);
  t.set_role(role);
  t.set_phase(v1::TENSOR_PHASE_BACKWARD);
  t.set_dtype(v1::FORMAT_FP16);
  t.add_shape(static_cast<std::int64_t>(n));
  t.set_scale(scale);
  ampscope::proto::encode_stats(s, /*full=*/true, &t);
  return t;
}

// One step of a GPT-like model: weight and activation gradients, log-normal magnitudes around
// 1e-4..1e-2 (unscaled), measured at loss scale 2^16 with the FP16 target at the current scale.
// `weights_unscaled`: the weight gradients as measured after unscaling (scale 1), the phase in
// which every data-parallel rank holds the same values.
v1::StepReport realistic_report(int tensors, std::size_t n, std::uint32_t seed,
                                bool weights_unscaled = false) {
  std::mt19937 rng(seed);
  v1::StepReport r;
  r.set_loss(3.1);
  r.set_loss_scale(65536);
  r.set_scale_after(65536);
  r.set_grad_norm(0.8);
  r.set_lr(3e-4);
  r.set_step_time_s(0.25);
  r.set_tokens(16384);
  const ampscope::TargetSpec targets[] = {{ampscope::Format::kFP16, 0}};
  std::vector<float> values(n);
  for (int i = 0; i < tensors; ++i) {
    const bool weight = i % 2 == 0;
    const double scale = weight && weights_unscaled ? 1 : 65536;
    std::normal_distribution<double> log_scale(std::log(1e-3), 1.2);
    const double sigma = std::exp(log_scale(rng));
    std::normal_distribution<float> g(0.0f, static_cast<float>(sigma * scale));
    for (float& v : values) v = g(rng);
    const auto s = ampscope::compute_stats(values.data(), n, ampscope::Format::kFP32, targets);
    v1::TensorStats* t = r.add_tensors();
    *t = to_proto(
        s, "h" + std::to_string(i / 8) + "." + std::to_string(i % 8) + (weight ? ".w" : ".a"),
        weight ? v1::TENSOR_ROLE_WEIGHT_GRAD : v1::TENSOR_ROLE_ACTIVATION_GRAD, scale, n);
    if (weight && weights_unscaled) t->set_phase(v1::TENSOR_PHASE_AFTER_UNSCALE);
  }
  return r;
}

// --- One agent stream (callback API) ----------------------------------------------------------

// The Hello of one rank of a run whose ranks all start from the same dynamic scaler.
v1::Hello agent_hello(const std::string& run_id, std::uint32_t rank, std::uint32_t world) {
  v1::Hello h;
  h.set_run_id(run_id);
  h.set_rank(rank);
  h.set_world_size(world);
  h.set_precision("amp-fp16");
  h.set_compute_format(v1::FORMAT_FP16);
  h.mutable_scaler()->set_kind(v1::SCALER_KIND_DYNAMIC);
  h.mutable_scaler()->set_init_scale(65536);
  h.mutable_scaler()->set_growth_factor(2);
  h.mutable_scaler()->set_backoff_factor(0.5);
  h.mutable_scaler()->set_growth_interval(2000);
  return h;
}

// The send_* calls come from one thread (the driver); gRPC's callbacks from its own.
class LoadStream : public grpc::ClientBidiReactor<v1::AgentMessage, v1::ServerMessage> {
 public:
  LoadStream(v1::Telemetry::Stub* stub, v1::Hello hello,
             const std::vector<v1::StepReport>* templates)
      : run_id_(hello.run_id()), rank_(hello.rank()), templates_(templates) {
    stub->async()->Attach(&context_, this);
    v1::AgentMessage first;
    *first.mutable_hello() = std::move(hello);
    queue_.push_back(std::move(first));
    writing_ = true;
    StartWrite(&queue_.front());
    StartRead(&in_);
    StartCall();
  }

  // Queues the next report, step = seq; `measured`: its latency counts.
  void send_next(bool measured = true) {
    std::uint64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      if (done_) return;
      seq = ++seq_;
    }
    v1::AgentMessage m;
    *m.mutable_report() = (*templates_)[seq % templates_->size()];
    enqueue(std::move(m), seq, static_cast<std::int64_t>(seq), measured);
  }

  // Queues the report of `step` of a data-parallel rank: the weight gradients are those every
  // rank holds after the all-reduce and unscaling (one template per step), the activation
  // gradients its own (another template per rank). `measured`: its latency counts.
  void send_step(std::int64_t step, std::uint64_t policy_seq, bool measured) {
    std::uint64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      if (done_) return;
      seq = ++seq_;
    }
    const std::size_t n = templates_->size();
    const v1::StepReport& shared = (*templates_)[static_cast<std::size_t>(step) % n];
    const v1::StepReport& own = (*templates_)[(static_cast<std::size_t>(step) + rank_ + 1) % n];
    v1::AgentMessage m;
    v1::StepReport* r = m.mutable_report();
    *r = shared;
    for (int i = 0; i < r->tensors_size(); ++i) {
      if (r->tensors(i).role() == v1::TENSOR_ROLE_ACTIVATION_GRAD) {
        *r->mutable_tensors(i) = own.tensors(i);
      }
    }
    r->set_policy_seq(policy_seq);
    enqueue(std::move(m), seq, step, measured);
  }

  // Queues `report` as the next one (its step as set; run, rank and seq filled in).
  void send_report(v1::StepReport report) {
    std::uint64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      if (done_) return;
      seq = ++seq_;
    }
    const std::int64_t step = report.step();
    v1::AgentMessage m;
    *m.mutable_report() = std::move(report);
    enqueue(std::move(m), seq, step, /*measured=*/false);
  }

  std::size_t in_flight() {
    std::lock_guard lock(mu_);
    return sent_at_.size();
  }
  bool failed() {
    std::lock_guard lock(mu_);
    return done_;
  }
  // Latencies (ms) of acknowledged reports since the last call, and how many were acked.
  std::vector<double> take_latencies() {
    std::lock_guard lock(mu_);
    return std::exchange(latencies_, {});
  }
  std::uint64_t acked() {
    std::lock_guard lock(mu_);
    return acked_;
  }
  std::uint64_t sent() {
    std::lock_guard lock(mu_);
    return seq_;
  }
  std::uint64_t rejects() {
    std::lock_guard lock(mu_);
    return rejects_;
  }
  std::string first_reject() {
    std::lock_guard lock(mu_);
    return first_reject_;
  }
  // The highest PolicyUpdate.seq received (0: none).
  std::uint64_t policy_seq() {
    std::lock_guard lock(mu_);
    return policy_seq_;
  }
  std::uint64_t policy_updates() {
    std::lock_guard lock(mu_);
    return policy_updates_;
  }
  // An Ack arrived (the first answers the Hello).
  bool answered() {
    std::lock_guard lock(mu_);
    return answered_;
  }
  // The owner a server that does not own the run sent this stream to (its Redirect; the
  // stream ends after it); empty when none came.
  std::string redirected_to() {
    std::lock_guard lock(mu_);
    return redirect_;
  }
  // How the stream ended ("" while it runs): the status code and message.
  std::string end_status() {
    std::lock_guard lock(mu_);
    if (!done_) return "";
    return std::to_string(static_cast<int>(status_.error_code())) + " " + status_.error_message();
  }
  void close() {
    {
      std::lock_guard lock(mu_);
      if (done_) return;
    }
    context_.TryCancel();
  }
  void wait_done() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    queue_.pop_front();
    writing_ = false;
    if (!ok) return;
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      std::lock_guard lock(mu_);
      if (in_.has_ack()) {
        answered_ = true;
        const auto now = Clock::now();
        const std::uint64_t upto = in_.ack().persisted_seq();
        for (auto it = sent_at_.begin(); it != sent_at_.end() && it->first <= upto;) {
          if (it->second.measured) {
            latencies_.push_back(
                std::chrono::duration<double, std::milli>(now - it->second.at).count());
          }
          ++acked_;
          it = sent_at_.erase(it);
        }
      } else if (in_.has_reject()) {
        if (rejects_++ == 0) {
          first_reject_ =
              in_.reject().field() + ": " + in_.reject().reason() + ": " + in_.reject().message();
        }
      } else if (in_.has_policy()) {
        ++policy_updates_;
        policy_seq_ = std::max(policy_seq_, in_.policy().seq());
      } else if (in_.has_redirect()) {
        redirect_ = in_.redirect().owner();
      }
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard lock(mu_);
    done_ = true;
    status_ = status;
    cv_.notify_all();
  }

 private:
  void enqueue(v1::AgentMessage m, std::uint64_t seq, std::int64_t step, bool measured) {
    v1::StepReport* r = m.mutable_report();
    r->set_run_id(run_id_);
    r->set_rank(rank_);
    r->set_seq(seq);
    r->set_step(step);
    std::lock_guard lock(mu_);
    if (done_) return;
    sent_at_[seq] = Sent{Clock::now(), measured};
    queue_.push_back(std::move(m));
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }

  struct Sent {
    Clock::time_point at;
    bool measured;
  };

  grpc::ClientContext context_;
  std::string run_id_;
  std::uint32_t rank_;
  const std::vector<v1::StepReport>* templates_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::AgentMessage> queue_;
  bool writing_ = false;
  v1::ServerMessage in_;
  std::uint64_t seq_ = 0;
  std::map<std::uint64_t, Sent> sent_at_;
  std::vector<double> latencies_;
  std::uint64_t acked_ = 0;
  std::uint64_t rejects_ = 0;
  std::string first_reject_;
  std::uint64_t policy_updates_ = 0;
  std::uint64_t policy_seq_ = 0;
  bool answered_ = false;
  std::string redirect_;
  bool done_ = false;
  grpc::Status status_;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(p * (v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

std::size_t append_body(char* data, std::size_t size, std::size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// GET http://address/metrics; the body, empty on an error.
std::string scrape(const std::string& address) {
  std::string body;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return body;
  const std::string url = "http://" + address + "/metrics";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  if (curl_easy_perform(curl) != CURLE_OK) body.clear();
  curl_easy_cleanup(curl);
  return body;
}

double mb(long kb) { return kb > 0 ? std::round(kb / 102.4) / 10 : -1; }

// A connection to the server at `address`, the `index`th of this process (distinct channel
// arguments give each its own subchannel), with its Telemetry client stub (which keeps its
// channel alive).
std::unique_ptr<v1::Telemetry::Stub> open_connection(const std::string& address, int index) {
  grpc::ChannelArguments a;
  a.SetMaxSendMessageSize(64 << 20);
  a.SetInt("ampscope.channel", index);
  return v1::Telemetry::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), a));
}

// `n` connections to the server at `address`.
std::vector<std::unique_ptr<v1::Telemetry::Stub>> open_connections(const std::string& address,
                                                                   int n) {
  std::vector<std::unique_ptr<v1::Telemetry::Stub>> stubs;
  for (int i = 0; i < n; ++i) stubs.push_back(open_connection(address, i));
  return stubs;
}

// The runs measurement (--runs): see the file comment.
nlohmann::ordered_json measure_runs(const Options& o, ServerChild& server,
                                    const std::vector<std::unique_ptr<v1::Telemetry::Stub>>& stubs,
                                    const std::vector<v1::StepReport>& templates) {
  std::cerr << "runs phase: " << o.runs << " runs, " << o.runs_reports << " reports each, "
            << o.streams << " at a time\n";
  const auto t0 = Clock::now();
  int failed = 0;
  for (int first = 0; first < o.runs; first += o.streams) {
    std::vector<std::unique_ptr<LoadStream>> wave;
    for (int i = first; i < std::min(o.runs, first + o.streams); ++i) {
      wave.push_back(
          std::make_unique<LoadStream>(stubs[static_cast<std::size_t>(i) % stubs.size()].get(),
                                       agent_hello("runs-" + std::to_string(i), 0, 1), &templates));
      for (int r = 0; r < o.runs_reports; ++r) wave.back()->send_next();
    }
    const auto deadline = Clock::now() + 60s;
    for (auto& s : wave) {
      while (!s->failed() && Clock::now() < deadline &&
             (!s->answered() || s->acked() < static_cast<std::uint64_t>(o.runs_reports))) {
        std::this_thread::sleep_for(1ms);
      }
      if (s->acked() < static_cast<std::uint64_t>(o.runs_reports) || !s->answered()) ++failed;
      s->close();
    }
    for (auto& s : wave) s->wait_done();
  }
  const double send_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::cerr << "  sent in " << send_s << " s (" << failed << " runs not acknowledged)\n";
  // Let a maintenance pass (top-K, agents connected: about once a second) run first.
  std::this_thread::sleep_for(2s);

  std::vector<double> ms;
  std::size_t bytes = 0;
  std::size_t lines = 0;
  std::size_t run_lines = 0;
  for (int i = 0; i < o.scrapes; ++i) {
    const auto s0 = Clock::now();
    const std::string body = scrape(server.metrics_address());
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
    bytes = body.size();
    lines = 0;
    run_lines = 0;
    std::istringstream in(body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("ampscope_", 0) != 0) continue;
      ++lines;
      if (line.find("run=\"") != std::string::npos) ++run_lines;
    }
  }
  const double median = percentile(ms, 0.5);
  const double slowest = *std::max_element(ms.begin(), ms.end());
  const long rss_kb = server.status_kb("VmRSS");
  const long peak_kb = server.status_kb("VmHWM");
  std::cerr << "  /metrics: " << bytes << " bytes, " << lines << " samples (" << run_lines
            << " with a run label), " << median << " ms median, " << slowest << " ms slowest; RSS "
            << mb(rss_kb) << " MB, peak " << mb(peak_kb) << " MB\n";

  nlohmann::ordered_json j;
  j["server_runs"] = o.runs;
  j["server_runs_reports_each"] = o.runs_reports;
  j["server_runs_tensors_per_report"] = o.tensors;
  j["server_runs_not_acknowledged"] = failed;
  j["server_runs_send_s"] = std::round(send_s * 10) / 10;
  j["server_metrics_scrape_bytes"] = bytes;
  j["server_metrics_samples"] = lines;
  j["server_metrics_run_samples"] = run_lines;
  j["server_metrics_scrape_ms_median"] = std::round(median * 10) / 10;
  j["server_metrics_scrape_ms_max"] = std::round(slowest * 10) / 10;
  j["server_runs_rss_mb"] = mb(rss_kb);
  j["server_runs_peak_rss_mb"] = mb(peak_kb);
  j["server_runs_server_binary"] = o.server_binary;
  std::string extra;
  for (const auto& a : o.server_args) extra += (extra.empty() ? "" : " ") + a;
  j["server_runs_server_args"] = extra;
  return j;
}

// Samples the servers' VmRSS (their sum) every `every` from `from` until stopped: (seconds
// since `from`, kB).
class RssSampler {
 public:
  RssSampler(const Servers& servers, Clock::time_point from, Clock::duration every)
      : thread_([this, &servers, from, every] {
          std::unique_lock lock(mu_);
          for (auto at = from; !stop_; at += every) {
            if (cv_.wait_until(lock, at, [&] { return stop_; })) break;
            samples_.emplace_back(std::chrono::duration<double>(Clock::now() - from).count(),
                                  servers.rss_kb());
          }
        }) {}
  ~RssSampler() { stop(); }
  std::vector<std::pair<double, long>> stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return samples_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::pair<double, long>> samples_;
  std::thread thread_;  // last: starts once the members it uses exist
};

// Least-squares slope of y over x; 0 with fewer than two points.
double slope(const std::vector<std::pair<double, double>>& xy) {
  if (xy.size() < 2) return 0;
  double mx = 0, my = 0;
  for (const auto& [x, y] : xy) mx += x, my += y;
  mx /= xy.size();
  my /= xy.size();
  double num = 0, den = 0;
  for (const auto& [x, y] : xy) num += (x - mx) * (y - my), den += (x - mx) * (x - mx);
  return den > 0 ? num / den : 0;
}

double load_average_1m() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  in >> l;
  return l;
}

double round_to(double v, double unit) { return std::round(v / unit) * unit; }

// The sum of a family's samples in a /metrics body (0 when absent: a counter not yet touched).
double metric_sum(const std::string& body, const std::string& family) {
  double sum = 0;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(family, 0) != 0) continue;
    const char next = line.size() > family.size() ? line[family.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// CPU seconds (user + system) this process has used so far.
double own_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// One connection per rank on both ends: thousands of ranks need more descriptors than the usual
// soft limit of 1,024. Raised to the hard limit, which the server child inherits.
void raise_open_files_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// The multi-rank measurement (--ranks): one synchronous data-parallel run of N ranks, each its
// own agent stream and connection (as each rank is its own process), each sending the report
// of step k at k / rate seconds plus a delay drawn uniformly from [0, spread) anew for every
// rank and step (ranks leave the all-reduce together, within a few ms). Measures the time from
// each report to its Ack over all ranks, the acknowledged rate, and the server's RSS every few
// seconds of the measured window. With several servers, rank r connects to server r % N first
// and follows its Redirect to the run's owner; RSS and CPU are the servers' sums (and
// PostgreSQL's CPU, `database_pid` and its children, apart), the peak the largest server's.
nlohmann::ordered_json measure_ranks(const Options& o, Servers& servers, pid_t database_pid) {
  const std::string tag = store_tag(o);
  const std::string key =
      "server_" + std::to_string(o.ranks) + "_ranks_" + (tag.empty() ? "" : tag + "_");
  std::cerr << "building report templates (" << o.rank_tensors << " tensors)...\n";
  std::vector<v1::StepReport> templates;
  for (std::uint32_t i = 0; i < 8; ++i) {
    templates.push_back(realistic_report(o.rank_tensors, o.elements, 1234 + i,
                                         /*weights_unscaled=*/true));
  }
  const std::size_t report_bytes = templates[0].ByteSizeLong();
  // What a rank that does not send full statistics sends: the same tensors, counted.
  std::vector<v1::StepReport> counts_templates = templates;
  for (v1::StepReport& r : counts_templates) {
    for (v1::TensorStats& t : *r.mutable_tensors()) {
      t.set_level(v1::STATS_LEVEL_COUNTS);
      t.clear_min_abs_nonzero();
      t.clear_sum();
      t.clear_sum_sq();
      t.clear_histogram();
      t.clear_targets();
    }
  }
  const std::size_t counts_report_bytes = counts_templates[0].ByteSizeLong();

  // One connection per rank: each rank is its own process.
  const auto world = static_cast<std::uint32_t>(o.ranks);
  const std::vector<std::string> addresses = servers.addresses();
  std::vector<std::unique_ptr<v1::Telemetry::Stub>> stubs;
  std::vector<v1::Hello> hellos;
  std::vector<const std::vector<v1::StepReport>*> sends;
  std::vector<std::unique_ptr<LoadStream>> streams;
  ampscope::agent::AgentConfig sampling;  // the ranks' agent configuration, as far as it matters
  ampscope::agent::set_option(sampling, "sample_full_ranks", o.sample_full_ranks);  // checked
  sampling.world_size = world;
  std::uint32_t full_ranks = 0;
  for (std::uint32_t rank = 0; rank < world; ++rank) {
    v1::Hello hello = agent_hello("ranks-" + std::to_string(o.ranks), rank, world);
    hello.set_data_parallel_size(world);
    hello.set_gradients_sharded(false);
    hello.set_policy_agreement(v1::POLICY_AGREEMENT_PER_STEP);
    sampling.rank = rank;
    const bool full = ampscope::agent::sends_full_stats(
        sampling, rank % static_cast<std::uint32_t>(o.ranks_per_node));
    full_ranks += full ? 1 : 0;
    hellos.push_back(hello);
    sends.push_back(full ? &templates : &counts_templates);
    stubs.push_back(open_connection(addresses[rank % addresses.size()], static_cast<int>(rank)));
    streams.push_back(std::make_unique<LoadStream>(stubs.back().get(), hello, sends.back()));
  }
  const auto connect_deadline = Clock::now() + 60s;
  const auto wait_answered = [&] {
    for (auto& s : streams) {
      while (!s->answered() && !s->failed() && Clock::now() < connect_deadline) {
        std::this_thread::sleep_for(5ms);
      }
    }
  };
  wait_answered();
  // A server that does not own the run sent its ranks to the owner: they go there, on a
  // connection of their own, as the agent does.
  int redirected = 0;
  for (std::uint32_t rank = 0; rank < world; ++rank) {
    const std::string owner = streams[rank]->redirected_to();
    if (streams[rank]->answered() || owner.empty()) continue;
    streams[rank]->wait_done();
    stubs.push_back(open_connection(owner, static_cast<int>(world + rank)));
    streams[rank] = std::make_unique<LoadStream>(stubs.back().get(), hellos[rank], sends[rank]);
    stubs[rank].reset();  // the connection to the server that redirected: closed
    ++redirected;
  }
  wait_answered();
  std::cerr << "  " << servers.size() << " server(s); " << redirected
            << " ranks redirected to the run's owner\n";

  const auto period =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / o.rank_rate));
  const auto warmup_steps = static_cast<std::int64_t>(std::ceil(o.rank_warmup_s * o.rank_rate));
  const auto measured_steps = static_cast<std::int64_t>(std::ceil(o.rank_duration_s * o.rank_rate));
  const auto spread = std::chrono::duration<double, std::milli>(o.rank_spread_ms);
  std::cerr << "ranks phase: " << o.ranks << " ranks (" << full_ranks
            << " sending full statistics: sample_full_ranks=" << o.sample_full_ranks << ", "
            << o.ranks_per_node << " ranks per node), " << o.rank_tensors << " tensors, "
            << o.rank_rate << " steps/s, sends spread over " << o.rank_spread_ms << " ms, "
            << warmup_steps << " warm-up + " << measured_steps << " measured steps\n";
  const double load_start = load_average_1m();
  const auto t0 = Clock::now() + 100ms;
  const auto measure_from = t0 + warmup_steps * period;
  const auto measure_to = measure_from + measured_steps * period;
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> delay_ms(0, o.rank_spread_ms);
  std::unique_ptr<RssSampler> sampler;
  std::uint64_t acked_at_start = 0;
  long rss_start_kb = -1;
  double server_cpu_start = 0;
  double database_cpu_start = 0;
  double client_cpu_start = 0;
  std::vector<std::pair<Clock::duration, std::size_t>> order(streams.size());
  for (std::int64_t step = 0; step < warmup_steps + measured_steps; ++step) {
    const auto step_at = t0 + step * period;
    if (step == warmup_steps) {
      std::this_thread::sleep_until(step_at);
      for (auto& s : streams) acked_at_start += s->acked();
      rss_start_kb = servers.rss_kb();
      server_cpu_start = servers.cpu_s();
      database_cpu_start = database_pid > 0 ? process_tree_cpu_s(database_pid) : 0;
      client_cpu_start = own_cpu_s();
      sampler =
          std::make_unique<RssSampler>(servers, step_at,
                                       std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(o.rank_rss_every_s)));
    }
    // Every rank applies the policy updates that all of them hold (PER_STEP agreement: the
    // ranks reduce what they received), and says so in its report.
    std::uint64_t agreed = std::numeric_limits<std::uint64_t>::max();
    for (auto& s : streams) agreed = std::min(agreed, s->policy_seq());
    for (std::size_t i = 0; i < streams.size(); ++i) {
      order[i] = {std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double, std::milli>(delay_ms(rng))),
                  i};
    }
    std::sort(order.begin(), order.end());
    for (const auto& [delay, i] : order) {
      std::this_thread::sleep_until(step_at + delay);
      streams[i]->send_step(step, agreed, step >= warmup_steps);
    }
  }
  std::this_thread::sleep_until(measure_to);
  std::uint64_t acked_at_end = 0;
  for (auto& s : streams) acked_at_end += s->acked();
  const long rss_end_kb = servers.rss_kb();
  const double window_s = std::chrono::duration<double>(measure_to - measure_from).count();
  const double server_cpu = (servers.cpu_s() - server_cpu_start) / window_s;
  const double database_cpu =
      database_pid > 0 ? (process_tree_cpu_s(database_pid) - database_cpu_start) / window_s : NAN;
  const double client_cpu = (own_cpu_s() - client_cpu_start) / window_s;
  const std::vector<std::pair<double, long>> rss =
      sampler ? sampler->stop() : std::vector<std::pair<double, long>>{};
  const double load_end = load_average_1m();

  // Every report sent gets its Ack (or counts as missing).
  const auto ack_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(o.rank_drain_s));
  for (auto& s : streams) {
    while (s->in_flight() > 0 && !s->failed() && Clock::now() < ack_deadline) {
      std::this_thread::sleep_for(5ms);
    }
  }
  std::vector<double> latencies;
  std::uint64_t sent = 0, acked = 0, rejects = 0, policy_updates = 0, policy_seq = 0;
  int failed = 0;
  std::string first_reject;
  std::string first_failure;
  for (auto& s : streams) {
    auto l = s->take_latencies();
    latencies.insert(latencies.end(), l.begin(), l.end());
    sent += s->sent();
    acked += s->acked();
    rejects += s->rejects();
    if (first_reject.empty()) first_reject = s->first_reject();
    policy_updates += s->policy_updates();
    policy_seq = std::max(policy_seq, s->policy_seq());
    if (s->failed() && failed++ == 0) first_failure = s->end_status();
  }
  const long peak_kb = servers.peak_kb();
  // The per-step merge's verdicts (complete steps, no divergence expected: the ranks report the
  // same replicated weight gradients and scales), summed over the servers (only the owner
  // merges the run).
  bool scraped = true;
  double partial_steps = 0;
  double divergences = 0;
  for (std::size_t i = 0; i < servers.size(); ++i) {
    const std::string metrics = scrape(servers[i].metrics_address());
    scraped = scraped && !metrics.empty();
    partial_steps += metric_sum(metrics, "ampscope_partial_steps_total");
    divergences += metric_sum(metrics, "ampscope_rank_divergence_total");
  }
  for (auto& s : streams) s->close();
  for (auto& s : streams) s->wait_done();

  const std::uint64_t measured_sent = static_cast<std::uint64_t>(measured_steps) * world;
  const double reports_per_s = static_cast<double>(acked_at_end - acked_at_start) / window_s;
  const double p50 = percentile(latencies, 0.50);
  const double p99 = percentile(latencies, 0.99);
  const double max =
      latencies.empty() ? NAN : *std::max_element(latencies.begin(), latencies.end());
  // Growth after the server settled: from the first sample at or after --rank-growth-from.
  const double growth_from = std::min(o.rank_growth_from_s, o.rank_duration_s / 2);
  long rss_from_kb = -1;
  long rss_half_kb = -1;  // the first sample in the second half of the window
  std::vector<std::pair<double, double>> settled;
  nlohmann::json series = nlohmann::json::array();
  for (const auto& [t, kb] : rss) {
    series.push_back(mb(kb));
    if (rss_half_kb < 0 && kb > 0 && t + 1e-3 >= o.rank_duration_s / 2) rss_half_kb = kb;
    if (t + 1e-3 < growth_from || kb <= 0) continue;
    if (rss_from_kb < 0) rss_from_kb = kb;
    settled.emplace_back(t, kb / 1024.0);
  }
  const double growth_mb =
      rss_from_kb > 0 && rss_end_kb > 0 ? (rss_end_kb - rss_from_kb) / 1024.0 : NAN;
  std::cerr << "  ack latency p50 " << p50 << " ms, p99 " << p99 << " ms, max " << max
            << " ms over " << latencies.size() << " of " << measured_sent << " measured reports\n"
            << "  " << reports_per_s << " reports/s acknowledged; " << acked << " of " << sent
            << " reports acknowledged, " << rejects << " rejected, " << failed
            << " streams failed; " << policy_updates << " policy updates received (seq up to "
            << policy_seq << "); " << partial_steps << " partial steps, " << divergences
            << " rank divergences\n"
            << "  RSS " << mb(rss_start_kb) << " MB at start, " << mb(rss_from_kb) << " MB at "
            << growth_from << " s, " << mb(rss_end_kb) << " MB at the end, peak " << mb(peak_kb)
            << " MB; load average " << load_start << " -> " << load_end
            << "; CPU cores used: server(s) " << server_cpu << ", PostgreSQL " << database_cpu
            << ", load generator " << client_cpu << "\n";

  nlohmann::ordered_json j;
  j[key + "ack_p50_ms"] = round_to(p50, 0.01);
  j[key + "ack_p99_ms"] = round_to(p99, 0.01);
  j[key + "ack_max_ms"] = round_to(max, 0.01);
  j[key + "ingest_reports_per_s"] = round_to(reports_per_s, 0.1);
  j[key + "ingest_tensor_stats_per_s"] = std::round(reports_per_s * o.rank_tensors);
  j[key + "reports_sent"] = sent;
  j[key + "reports_acked"] = acked;
  j[key + "measured_reports"] = measured_sent;
  j[key + "measured_latencies"] = latencies.size();
  j[key + "all_acked"] = acked == sent && failed == 0 && latencies.size() == measured_sent;
  j[key + "rejects"] = rejects;
  if (rejects > 0) j[key + "first_reject"] = first_reject;
  j[key + "streams_failed"] = failed;
  if (failed > 0) j[key + "first_stream_failure"] = first_failure;
  j[key + "partial_steps"] = scraped ? partial_steps : NAN;
  j[key + "rank_divergences"] = scraped ? divergences : NAN;
  j[key + "policy_updates_received"] = policy_updates;
  j[key + "policy_seq"] = policy_seq;
  j[key + "rss_start_mb"] = mb(rss_start_kb);
  j[key + "rss_end_mb"] = mb(rss_end_kb);
  j[key + "rss_growth_from_s"] = growth_from;
  j[key + "rss_growth_mb"] = round_to(growth_mb, 0.1);
  j[key + "rss_second_half_growth_mb"] =
      round_to(rss_half_kb > 0 && rss_end_kb > 0 ? (rss_end_kb - rss_half_kb) / 1024.0 : NAN, 0.1);
  j[key + "rss_slope_mb_per_min"] = round_to(slope(settled) * 60, 0.01);
  j[key + "rss_every_s"] = o.rank_rss_every_s;
  j[key + "rss_series_mb"] = series;
  j[key + "peak_rss_mb"] = mb(peak_kb);
  j[key + "tensors_per_report"] = o.rank_tensors;
  j[key + "report_bytes"] = report_bytes;
  j[key + "sample_full_ranks"] = o.sample_full_ranks;
  j[key + "ranks_per_node"] = o.ranks_per_node;
  j[key + "full_stats_ranks"] = full_ranks;
  j[key + "counts_report_bytes"] = counts_report_bytes;
  j[key + "steps_per_s"] = o.rank_rate;
  j[key + "spread_ms"] = o.rank_spread_ms;
  j[key + "warmup_s"] = o.rank_warmup_s;
  j[key + "duration_s"] = o.rank_duration_s;
  j[key + "sync"] = o.sync;
  std::string extra;
  for (const auto& a : o.server_args) extra += (extra.empty() ? "" : " ") + a;
  j[key + "server_args"] = extra;
  j[key + "db_backend"] = o.db_backend;
  j[key + "servers"] = o.servers;
  j[key + "redirected_ranks"] = redirected;
  j[key + "server_cpu_cores"] = round_to(server_cpu, 0.01);
  if (database_pid > 0) j[key + "postgres_cpu_cores"] = round_to(database_cpu, 0.01);
  j[key + "load_generator_cpu_cores"] = round_to(client_cpu, 0.01);
  j[key + "load_average_start"] = load_start;
  j[key + "load_average_end"] = load_end;
  j[key + "hardware_threads"] = std::thread::hardware_concurrency();
  return j;
}

}  // namespace

// The long-run fill (--long-run): see the file comment. Returns 0 when every report was
// acknowledged without a Reject.
int fill_long_run(const Options& o, const std::string& address) {
  std::cerr << "long run '" << o.long_run_id << "': " << o.long_run << " steps of " << o.tensors
            << " tensors\n";
  std::vector<v1::StepReport> templates;
  for (std::uint32_t i = 0; i < 16; ++i) {
    templates.push_back(realistic_report(o.tensors, o.elements, 4321 + i));
  }
  const auto connection = open_connections(address, 1);
  LoadStream stream(connection[0].get(), agent_hello(o.long_run_id, 0, 1), &templates);
  std::mt19937 rng(2026);
  std::normal_distribution<double> noise(0.0, 0.03);
  const double max_scale = 65536;
  double scale = max_scale;
  std::int64_t clean = 0;
  const std::uint64_t window = 128;  // below the server's default --max-in-flight (256)
  const auto t0 = Clock::now();
  for (std::int64_t step = 0; step < o.long_run && !stream.failed(); ++step) {
    v1::StepReport r = templates[static_cast<std::size_t>(step) % templates.size()];
    r.set_step(step);
    r.set_loss(0.6 + 3.4 * std::exp(-static_cast<double>(step) / 20000) + noise(rng));
    if (step % 1000 == 999) {
      r.set_val_loss(0.65 + 3.4 * std::exp(-static_cast<double>(step) / 20000));
    }
    r.set_step_time_s(0.25 + 0.02 * noise(rng));
    r.set_tensor_core_active_ratio(0.6 + noise(rng));
    r.set_time_unix_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
    r.set_loss_scale(scale);
    const bool overflow = step % 997 == 996;
    if (overflow) {
      r.set_found_inf(true);
      r.set_skipped(true);
      r.set_grad_norm(std::numeric_limits<double>::infinity());
      v1::FirstOffender* f = r.mutable_first_offender();
      f->set_tensor(r.tensors(1).name());
      f->set_role(r.tensors(1).role());
      f->set_phase(r.tensors(1).phase());
      f->set_order(1);
      scale /= 2;
      clean = 0;
    } else if (++clean == 2000) {
      scale = std::min(max_scale, scale * 2);
      clean = 0;
    }
    r.set_scale_after(scale);
    r.set_optimizer_steps(static_cast<std::uint64_t>(step + 1));
    while (stream.sent() - stream.acked() >= window && !stream.failed()) {
      std::this_thread::sleep_for(200us);
    }
    stream.send_report(std::move(r));
  }
  const auto deadline = Clock::now() + 120s;
  while (!stream.failed() && stream.acked() < stream.sent() && Clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const bool ok = stream.acked() == stream.sent() && stream.rejects() == 0;
  std::cerr << "  " << stream.acked() << " of " << stream.sent() << " reports acknowledged in "
            << seconds << " s, " << stream.rejects() << " rejected"
            << (stream.rejects() ? " (first: " + stream.first_reject() + ")" : "") << "\n";
  stream.close();
  stream.wait_done();
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ampscope-server load generator"};
  app.add_option("--server-binary", o.server_binary, "ampscope-server to start")
      ->capture_default_str();
  app.add_option("--server", o.server_address, "Use this running server instead");
  app.add_option("--streams", o.streams, "Concurrent agent streams")->capture_default_str();
  app.add_option("--tensors", o.tensors, "TensorStats per report")->capture_default_str();
  app.add_option("--duration", o.duration_s, "Seconds of the throughput phase")
      ->capture_default_str();
  app.add_option("--warmup", o.warmup_s, "Seconds before measuring")->capture_default_str();
  app.add_option("--window", o.window, "Unacknowledged reports per stream (throughput phase)")
      ->capture_default_str();
  app.add_option("--offered", o.offered, "TensorStats/s offered in the latency phase")
      ->capture_default_str();
  app.add_option("--latency-duration", o.latency_s, "Seconds of the latency phase")
      ->capture_default_str();
  app.add_option("--sync", o.sync, "Server --sync (full|normal)")->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "Directory for the server's store (default: tmp)");
  app.add_option("--out", o.out, "Write the JSON fragment here");
  app.add_option("--server-arg", o.server_args,
                 "Extra ampscope-server flag (repeat; e.g. --server-arg=--policy "
                 "--server-arg=headroom)");
  app.add_option("--runs", o.runs,
                 "Measure /metrics and memory after this many runs (one Hello and "
                 "--runs-reports reports each) instead of the load phases");
  app.add_option("--runs-reports", o.runs_reports, "Reports each run sends (--runs)")
      ->capture_default_str();
  app.add_option("--scrapes", o.scrapes, "Scrapes of /metrics timed (--runs)")
      ->capture_default_str();
  app.add_option("--ranks", o.ranks,
                 "One data-parallel run of this many ranks (one stream each, one report per "
                 "step) instead of the load phases; the server runs --policy headroom unless "
                 "--server-arg sets a policy")
      ->check(CLI::Range(1, 65536));
  app.add_option("--rank-tensors", o.rank_tensors, "TensorStats per report (--ranks)")
      ->capture_default_str();
  app.add_option("--rank-rate", o.rank_rate, "Steps per second (--ranks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rank-duration", o.rank_duration_s, "Measured seconds (--ranks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rank-warmup", o.rank_warmup_s, "Seconds of steps before measuring (--ranks)")
      ->capture_default_str();
  app.add_option("--rank-spread-ms", o.rank_spread_ms,
                 "Each rank sends a step's report this much after the step at most (uniform)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rank-rss-every", o.rank_rss_every_s, "Seconds between RSS samples (--ranks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rank-growth-from", o.rank_growth_from_s,
                 "RSS growth is measured from this second of the window to its end (--ranks)")
      ->capture_default_str();
  app.add_option("--rank-drain", o.rank_drain_s,
                 "Seconds to wait after the window for the Acks still outstanding; reports "
                 "unacknowledged then count as not acknowledged (--ranks)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--sample-full-ranks", o.sample_full_ranks,
                 "The ranks that send full reports, as the agent option sample_full_ranks: auto "
                 "(the agent's default), all, node, every:K or a list; the others send counts "
                 "(--ranks)")
      ->check([](const std::string& v) {
        ampscope::agent::AgentConfig c;
        return ampscope::agent::set_option(c, "sample_full_ranks", v);
      })
      ->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "Ranks on one node: rank r's local rank is r % this (--sample-full-ranks)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--db-backend", o.db_backend,
                 "The servers' store: sqlite (a file in the work directory) or postgres (a "
                 "PostgreSQL this tool starts, with durable settings)")
      ->check(CLI::IsMember({"sqlite", "postgres"}))
      ->capture_default_str();
  app.add_option("--servers", o.servers,
                 "Servers sharing the one store (more than one: --db-backend postgres, each "
                 "with --run-leases)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--lease-ttl", o.lease_ttl, "The servers' --lease-ttl (--servers > 1)")
      ->capture_default_str();
  app.add_option("--postgres-durable", o.postgres_durable,
                 "PostgreSQL's fsync, synchronous_commit and full_page_writes (false: what "
                 "durability costs)")
      ->capture_default_str();
  app.add_flag("--require-acked", o.require_acked,
               "--ranks: exit 1 unless every report was acknowledged without a Reject");
  app.add_option("--long-run", o.long_run,
                 "Fill the running --server with one run of this many steps instead of the load "
                 "phases")
      ->check(CLI::PositiveNumber);
  app.add_option("--long-run-id", o.long_run_id, "The run id of --long-run")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.long_run > 0) {
    if (o.server_address.empty()) {
      std::cerr << "--long-run fills a running server: give --server\n";
      return 2;
    }
    return fill_long_run(o, o.server_address);
  }
  if ((o.runs > 0 || o.ranks > 0) && !o.server_address.empty()) {
    std::cerr << "--runs and --ranks start their own server: drop --server\n";
    return 2;
  }
  if (o.runs > 0 && o.ranks > 0) {
    std::cerr << "--runs and --ranks are separate measurements: choose one\n";
    return 2;
  }
  if (!o.server_address.empty() && (o.db_backend != "sqlite" || o.servers > 1)) {
    std::cerr << "--db-backend and --servers are for the servers this tool starts: drop "
                 "--server\n";
    return 2;
  }
  if (o.servers > 1 && o.db_backend != "postgres") {
    std::cerr << "--servers " << o.servers << " share one store: give --db-backend postgres\n";
    return 2;
  }
  if (o.servers > 1 && o.runs > 0) {
    std::cerr << "--runs measures one server's /metrics: drop --servers\n";
    return 2;
  }
#ifndef AMPSCOPE_BENCH_POSTGRES
  if (o.db_backend == "postgres") {
    std::cerr << "--db-backend postgres: this build has no PostgreSQL launcher (it comes with "
                 "the tests' support library: configure with AMPSCOPE_BUILD_TESTS=ON)\n";
    return 2;
  }
#endif
  const bool policy_set = std::any_of(o.server_args.begin(), o.server_args.end(), [](auto& a) {
    return a == "--policy" || a.rfind("--policy=", 0) == 0;
  });
  if (o.ranks > 0 && !policy_set)
    o.server_args.insert(o.server_args.end(), {"--policy", "headroom"});
  if (o.ranks > 0) raise_open_files_limit();

  std::filesystem::path dir = o.work_dir.empty() ? std::filesystem::temp_directory_path() /
                                                       ("ampscope-load-" + std::to_string(getpid()))
                                                 : std::filesystem::path(o.work_dir);
  std::filesystem::create_directories(dir);
  // The store: a SQLite file in the work directory, or a database on a PostgreSQL of our own
  // (stopped after the servers: declared before them).
  std::string db = (dir / "load.db").string();
  pid_t database_pid = 0;
  std::string database_version;
#ifdef AMPSCOPE_BENCH_POSTGRES
  std::unique_ptr<ampscope::testing::PostgresInstance> postgres;
  if (o.db_backend == "postgres") {
    std::cerr << "starting PostgreSQL...\n";
    postgres = std::make_unique<ampscope::testing::PostgresInstance>(
        ampscope::testing::PostgresOptions{.durable = o.postgres_durable, .max_connections = 100});
    db = postgres->create_database();
    database_pid = postgres->pid();
    database_version = postgres->version();
    std::cerr << "  " << database_version << "; --db '" << db << "'\n";
  }
#endif
  std::unique_ptr<Servers> servers;
  std::vector<std::string> addresses = {o.server_address};
  if (o.server_address.empty()) {
    servers = std::make_unique<Servers>(o, dir, db);
    addresses = servers->addresses();
  }
  const std::string tag = store_tag(o);
  if (o.ranks > 0) {
    nlohmann::ordered_json j = measure_ranks(o, *servers, database_pid);
    servers.reset();
    const std::string key =
        "server_" + std::to_string(o.ranks) + "_ranks_" + (tag.empty() ? "" : tag + "_");
    if (!database_version.empty()) j[key + "postgres_version"] = database_version;
    std::cout << j.dump(2) << "\n";
    if (!o.out.empty()) std::ofstream(o.out) << j.dump(2) << "\n";
    if (o.work_dir.empty()) std::filesystem::remove_all(dir);
    if (o.require_acked && (!j.at(key + "all_acked").get<bool>() || j.at(key + "rejects") != 0)) {
      std::cerr << "not every report was acknowledged without a Reject\n";
      return 1;
    }
    return 0;
  }

  std::cerr << "building report templates (" << o.tensors << " tensors)...\n";
  std::vector<v1::StepReport> templates;
  for (std::uint32_t i = 0; i < 8; ++i) {
    templates.push_back(realistic_report(o.tensors, o.elements, 1234 + i));
  }
  const std::size_t report_bytes = templates[0].ByteSizeLong();
  std::size_t bins = 0;
  for (const auto& t : templates[0].tensors()) bins += t.histogram().counts_size();

  // One connection per 8 streams (one run's ranks), as agents on different hosts would have
  // their own; connection k to server k % N, so that the servers own the runs in turn.
  std::vector<std::unique_ptr<v1::Telemetry::Stub>> stubs;
  for (int c = 0; c < (o.streams + 7) / 8; ++c) {
    stubs.push_back(open_connection(addresses[static_cast<std::size_t>(c) % addresses.size()], c));
  }
  if (o.runs > 0) {
    const nlohmann::ordered_json j = measure_runs(o, (*servers)[0], stubs, templates);
    servers.reset();
    std::cout << j.dump(2) << "\n";
    if (!o.out.empty()) std::ofstream(o.out) << j.dump(2) << "\n";
    if (o.work_dir.empty()) std::filesystem::remove_all(dir);
    return 0;
  }

  std::vector<std::unique_ptr<LoadStream>> streams;
  const int ranks_per_run = 8;
  for (int i = 0; i < o.streams; ++i) {
    streams.push_back(std::make_unique<LoadStream>(
        stubs[static_cast<std::size_t>(i / 8)].get(),
        agent_hello("load-run-" + std::to_string(i / ranks_per_run),
                    static_cast<std::uint32_t>(i % ranks_per_run), ranks_per_run),
        &templates));
  }

  // Phase 1: open loop at the offered rate, each stream at its own steady step rate, on a
  // fresh server: warm-up, then the measured window.
  const double per_stream_hz = o.offered / o.tensors / o.streams;
  std::cerr << "latency phase: " << o.offered << " TensorStats/s offered (" << per_stream_hz
            << " reports/s per stream), " << o.warmup_s << " s warm-up + " << o.latency_s << " s\n";
  std::vector<Clock::time_point> next(streams.size());
  const auto l0 = Clock::now();
  for (std::size_t i = 0; i < streams.size(); ++i) {
    // Spread the streams' phases over one period.
    next[i] = l0 + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(i / (per_stream_hz * streams.size())));
  }
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(1.0 / per_stream_hz));
  const auto l_measure = l0 + std::chrono::duration<double>(o.warmup_s);
  const auto l_end = l_measure + std::chrono::duration<double>(o.latency_s);
  bool measuring = false;
  std::vector<double> latencies;
  std::uint64_t sent = 0;
  while (Clock::now() < l_end) {
    const auto now = Clock::now();
    if (!measuring && now >= l_measure) {
      measuring = true;
      for (auto& s : streams) s->take_latencies();
    }
    for (std::size_t i = 0; i < streams.size(); ++i) {
      while (next[i] <= now) {
        // Reports sent in the warm-up are not measured, even when their Ack comes later.
        streams[i]->send_next(measuring);
        sent += measuring ? 1 : 0;
        next[i] += period;
      }
    }
    std::this_thread::sleep_for(500us);
  }
  // Every report sent in the window gets its ack (or counts as missing below).
  const auto ack_deadline = Clock::now() + 10s;
  for (auto& s : streams) {
    while (s->in_flight() > 0 && !s->failed() && Clock::now() < ack_deadline) {
      std::this_thread::sleep_for(5ms);
    }
    auto l = s->take_latencies();
    latencies.insert(latencies.end(), l.begin(), l.end());
  }
  const double p50 = percentile(latencies, 0.50);
  const double p99 = percentile(latencies, 0.99);
  std::cerr << "  ack latency p50 " << p50 << " ms, p99 " << p99 << " ms over " << latencies.size()
            << " of " << sent << " reports\n";

  // Drain what is in flight before the throughput phase.
  const auto drain_deadline = Clock::now() + 30s;
  for (auto& s : streams) {
    while (s->in_flight() > 0 && !s->failed() && Clock::now() < drain_deadline) {
      std::this_thread::sleep_for(5ms);
    }
    s->take_latencies();
  }

  // Phase 2: closed loop, as fast as the server acknowledges.
  std::cerr << "throughput phase: " << o.streams << " streams, window " << o.window << ", "
            << o.warmup_s << " s warm-up + " << o.duration_s << " s\n";
  const auto t0 = Clock::now();
  const auto measure_from = t0 + std::chrono::duration<double>(o.warmup_s);
  const auto measure_to = measure_from + std::chrono::duration<double>(o.duration_s);
  std::uint64_t acked_at_start = 0;
  long rss_start_kb = -1;
  long rss_end_kb = -1;
  double server_cpu_start = 0;
  double database_cpu_start = 0;
  bool started = false;
  std::vector<long> rss_samples;
  while (Clock::now() < measure_to) {
    for (auto& s : streams) {
      while (!s->failed() && s->in_flight() < static_cast<std::size_t>(o.window)) s->send_next();
    }
    if (!started && Clock::now() >= measure_from) {
      started = true;
      for (auto& s : streams) acked_at_start += s->acked();
      if (servers) rss_start_kb = servers->rss_kb();
      if (servers) server_cpu_start = servers->cpu_s();
      if (database_pid > 0) database_cpu_start = process_tree_cpu_s(database_pid);
    }
    if (started && servers) rss_samples.push_back(servers->rss_kb());
    for (auto& s : streams) s->take_latencies();
    std::this_thread::sleep_for(1ms);
  }
  std::uint64_t acked_at_end = 0;
  for (auto& s : streams) acked_at_end += s->acked();
  if (servers) rss_end_kb = servers->rss_kb();
  const double server_cpu = servers ? (servers->cpu_s() - server_cpu_start) / o.duration_s : NAN;
  const double database_cpu =
      database_pid > 0 ? (process_tree_cpu_s(database_pid) - database_cpu_start) / o.duration_s
                       : NAN;
  const double tensor_stats_per_s =
      static_cast<double>(acked_at_end - acked_at_start) * o.tensors / o.duration_s;
  int failed = 0;
  for (auto& s : streams) failed += s->failed() ? 1 : 0;
  std::cerr << "  " << static_cast<long>(tensor_stats_per_s) << " TensorStats/s ("
            << static_cast<long>(tensor_stats_per_s / o.tensors) << " reports/s); CPU cores "
            << "used: server(s) " << server_cpu << ", PostgreSQL " << database_cpu << "; " << failed
            << " streams failed\n";

  const long peak_kb = servers ? servers->peak_kb() : -1;
  long rss_max_kb = 0;
  for (long v : rss_samples) rss_max_kb = std::max(rss_max_kb, v);
  for (auto& s : streams) s->close();
  for (auto& s : streams) s->wait_done();
  servers.reset();

  // server_* on one SQLite server (the keys as they always were), server_postgres_* on one
  // PostgreSQL server, server_2pg_* on two sharing one PostgreSQL.
  const std::string k = tag.empty() ? "server_" : "server_" + tag + "_";
  nlohmann::ordered_json j;
  j[k + "ingest_tensor_stats_per_s"] = std::round(tensor_stats_per_s);
  j[k + "ack_p99_ms"] = std::round(p99 * 100) / 100;
  j[k + "ack_p50_ms"] = std::round(p50 * 100) / 100;
  j[k + "peak_rss_mb"] = peak_kb > 0 ? std::round(peak_kb / 102.4) / 10 : -1;
  j[k + "rss_throughput_start_mb"] = rss_start_kb > 0 ? std::round(rss_start_kb / 102.4) / 10 : -1;
  j[k + "rss_throughput_end_mb"] = rss_end_kb > 0 ? std::round(rss_end_kb / 102.4) / 10 : -1;
  j[k + "throughput_server_cpu_cores"] = round_to(server_cpu, 0.01);
  if (database_pid > 0) {
    j[k + "throughput_postgres_cpu_cores"] = round_to(database_cpu, 0.01);
    j[k + "postgres_version"] = database_version;
  }
  j[k + "load_db_backend"] = o.db_backend;
  j[k + "load_servers"] = o.servers;
  j[k + "load_streams"] = o.streams;
  j[k + "load_streams_failed"] = failed;
  j[k + "load_tensors_per_report"] = o.tensors;
  j[k + "load_histogram_bins_per_report"] = bins;
  j[k + "load_report_bytes"] = report_bytes;
  j[k + "load_window"] = o.window;
  j[k + "load_duration_s"] = o.duration_s;
  j[k + "ack_offered_tensor_stats_per_s"] = o.offered;
  j[k + "load_sync"] = o.sync;
  std::string extra;
  for (const auto& a : o.server_args) extra += (extra.empty() ? "" : " ") + a;
  j[k + "load_server_args"] = extra;
  j[k + "load_hardware_threads"] = std::thread::hardware_concurrency();
  std::cout << j.dump(2) << "\n";
  if (!o.out.empty()) {
    std::ofstream out(o.out);
    out << j.dump(2) << "\n";
  }
  if (o.work_dir.empty()) std::filesystem::remove_all(dir);
  return 0;
}
