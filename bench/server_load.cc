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
#include <curl/curl.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
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
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "ampscope/proto/stats_codec.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/v1/telemetry.grpc.pb.h"

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
};

// --- The server under test --------------------------------------------------------------------

class ServerChild {
 public:
  ServerChild(const Options& o, const std::filesystem::path& dir) {
    const std::filesystem::path ready = dir / "ready.json";
    log_ = dir / "server.log";
    std::vector<std::string> argv = {o.server_binary,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "",
                                     "--db",
                                     (dir / "load.db").string(),
                                     "--ready-file",
                                     ready.string(),
                                     "--sync",
                                     o.sync,
                                     "--max-in-flight",
                                     "1024"};
    if (o.runs > 0) argv[4] = "127.0.0.1:0";  // --metrics-listen: the runs measurement scrapes
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
  // kB from /proc/PID/status ("VmHWM", "VmRSS").
  long status_kb(const std::string& key) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(key + ":", 0) == 0) return std::stol(line.substr(key.size() + 1));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_;
  std::string address_;
  std::string metrics_address_;
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
v1::StepReport realistic_report(int tensors, std::size_t n, std::uint32_t seed) {
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
    std::normal_distribution<double> log_scale(std::log(1e-3), 1.2);
    const double sigma = std::exp(log_scale(rng));
    std::normal_distribution<float> g(0.0f, static_cast<float>(sigma * 65536));
    for (float& v : values) v = g(rng);
    const auto s = ampscope::compute_stats(values.data(), n, ampscope::Format::kFP32, targets);
    const bool weight = i % 2 == 0;
    *r.add_tensors() = to_proto(
        s, "h" + std::to_string(i / 8) + "." + std::to_string(i % 8) + (weight ? ".w" : ".a"),
        weight ? v1::TENSOR_ROLE_WEIGHT_GRAD : v1::TENSOR_ROLE_ACTIVATION_GRAD, 65536, n);
  }
  return r;
}

// --- One agent stream (callback API) ----------------------------------------------------------

class LoadStream : public grpc::ClientBidiReactor<v1::AgentMessage, v1::ServerMessage> {
 public:
  LoadStream(v1::Telemetry::Stub* stub, std::string run_id, std::uint32_t rank, std::uint32_t world,
             const std::vector<v1::StepReport>* templates)
      : run_id_(std::move(run_id)), rank_(rank), templates_(templates) {
    stub->async()->Attach(&context_, this);
    v1::AgentMessage hello;
    auto* h = hello.mutable_hello();
    h->set_run_id(run_id_);
    h->set_rank(rank);
    h->set_world_size(world);
    h->set_precision("amp-fp16");
    h->set_compute_format(v1::FORMAT_FP16);
    h->mutable_scaler()->set_kind(v1::SCALER_KIND_DYNAMIC);
    h->mutable_scaler()->set_init_scale(65536);
    h->mutable_scaler()->set_growth_factor(2);
    h->mutable_scaler()->set_backoff_factor(0.5);
    h->mutable_scaler()->set_growth_interval(2000);
    queue_.push_back(std::move(hello));
    writing_ = true;
    StartWrite(&queue_.front());
    StartRead(&in_);
    StartCall();
  }

  // Queues the next report; returns its seq.
  void send_next() {
    std::lock_guard lock(mu_);
    if (done_) return;
    const std::uint64_t seq = ++seq_;
    v1::AgentMessage m;
    v1::StepReport* r = m.mutable_report();
    *r = (*templates_)[seq % templates_->size()];
    r->set_run_id(run_id_);
    r->set_rank(rank_);
    r->set_seq(seq);
    r->set_step(static_cast<std::int64_t>(seq));
    sent_at_[seq] = Clock::now();
    queue_.push_back(std::move(m));
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
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
  // An Ack arrived (the first answers the Hello).
  bool answered() {
    std::lock_guard lock(mu_);
    return answered_;
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
          latencies_.push_back(std::chrono::duration<double, std::milli>(now - it->second).count());
          ++acked_;
          it = sent_at_.erase(it);
        }
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
  std::map<std::uint64_t, Clock::time_point> sent_at_;
  std::vector<double> latencies_;
  std::uint64_t acked_ = 0;
  bool answered_ = false;
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
                                       "runs-" + std::to_string(i), 0, 1, &templates));
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

}  // namespace

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
  CLI11_PARSE(app, argc, argv);
  if (o.runs > 0 && !o.server_address.empty()) {
    std::cerr << "--runs starts its own server: drop --server\n";
    return 2;
  }

  std::filesystem::path dir = o.work_dir.empty() ? std::filesystem::temp_directory_path() /
                                                       ("ampscope-load-" + std::to_string(getpid()))
                                                 : std::filesystem::path(o.work_dir);
  std::filesystem::create_directories(dir);
  std::unique_ptr<ServerChild> server;
  std::string address = o.server_address;
  if (address.empty()) {
    server = std::make_unique<ServerChild>(o, dir);
    address = server->address();
  }

  std::cerr << "building report templates (" << o.tensors << " tensors)...\n";
  std::vector<v1::StepReport> templates;
  for (std::uint32_t i = 0; i < 8; ++i) {
    templates.push_back(realistic_report(o.tensors, o.elements, 1234 + i));
  }
  const std::size_t report_bytes = templates[0].ByteSizeLong();
  std::size_t bins = 0;
  for (const auto& t : templates[0].tensors()) bins += t.histogram().counts_size();

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  // One connection per 8 streams, as agents on different hosts would have their own.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Telemetry::Stub>> stubs;
  for (int i = 0; i < (o.streams + 7) / 8; ++i) {
    grpc::ChannelArguments a = args;
    a.SetInt("ampscope.channel", i);  // distinct args: distinct subchannels
    channels.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), a));
    stubs.push_back(v1::Telemetry::NewStub(channels.back()));
  }
  if (o.runs > 0) {
    const nlohmann::ordered_json j = measure_runs(o, *server, stubs, templates);
    server.reset();
    std::cout << j.dump(2) << "\n";
    if (!o.out.empty()) std::ofstream(o.out) << j.dump(2) << "\n";
    if (o.work_dir.empty()) std::filesystem::remove_all(dir);
    return 0;
  }

  std::vector<std::unique_ptr<LoadStream>> streams;
  const int ranks_per_run = 8;
  for (int i = 0; i < o.streams; ++i) {
    streams.push_back(std::make_unique<LoadStream>(stubs[static_cast<std::size_t>(i / 8)].get(),
                                                   "load-run-" + std::to_string(i / ranks_per_run),
                                                   static_cast<std::uint32_t>(i % ranks_per_run),
                                                   ranks_per_run, &templates));
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
      sent = 0;
      for (auto& s : streams) s->take_latencies();
    }
    for (std::size_t i = 0; i < streams.size(); ++i) {
      while (next[i] <= now) {
        streams[i]->send_next();
        ++sent;
        next[i] += period;
      }
    }
    std::this_thread::sleep_for(500us);
  }
  (void)measuring;
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
  bool started = false;
  std::vector<long> rss_samples;
  while (Clock::now() < measure_to) {
    for (auto& s : streams) {
      while (!s->failed() && s->in_flight() < static_cast<std::size_t>(o.window)) s->send_next();
    }
    if (!started && Clock::now() >= measure_from) {
      started = true;
      for (auto& s : streams) acked_at_start += s->acked();
      if (server) rss_start_kb = server->status_kb("VmRSS");
    }
    if (started && server) rss_samples.push_back(server->status_kb("VmRSS"));
    for (auto& s : streams) s->take_latencies();
    std::this_thread::sleep_for(1ms);
  }
  std::uint64_t acked_at_end = 0;
  for (auto& s : streams) acked_at_end += s->acked();
  if (server) rss_end_kb = server->status_kb("VmRSS");
  const double tensor_stats_per_s =
      static_cast<double>(acked_at_end - acked_at_start) * o.tensors / o.duration_s;
  std::cerr << "  " << static_cast<long>(tensor_stats_per_s) << " TensorStats/s ("
            << static_cast<long>(tensor_stats_per_s / o.tensors) << " reports/s)\n";

  const long peak_kb = server ? server->status_kb("VmHWM") : -1;
  long rss_max_kb = 0;
  for (long v : rss_samples) rss_max_kb = std::max(rss_max_kb, v);
  for (auto& s : streams) s->close();
  for (auto& s : streams) s->wait_done();
  server.reset();

  nlohmann::ordered_json j;
  j["server_ingest_tensor_stats_per_s"] = std::round(tensor_stats_per_s);
  j["server_ack_p99_ms"] = std::round(p99 * 100) / 100;
  j["server_ack_p50_ms"] = std::round(p50 * 100) / 100;
  j["server_peak_rss_mb"] = peak_kb > 0 ? std::round(peak_kb / 102.4) / 10 : -1;
  j["server_rss_throughput_start_mb"] =
      rss_start_kb > 0 ? std::round(rss_start_kb / 102.4) / 10 : -1;
  j["server_rss_throughput_end_mb"] = rss_end_kb > 0 ? std::round(rss_end_kb / 102.4) / 10 : -1;
  j["server_load_streams"] = o.streams;
  j["server_load_tensors_per_report"] = o.tensors;
  j["server_load_histogram_bins_per_report"] = bins;
  j["server_load_report_bytes"] = report_bytes;
  j["server_load_window"] = o.window;
  j["server_load_duration_s"] = o.duration_s;
  j["server_ack_offered_tensor_stats_per_s"] = o.offered;
  j["server_load_sync"] = o.sync;
  std::string extra;
  for (const auto& a : o.server_args) extra += (extra.empty() ? "" : " ") + a;
  j["server_load_server_args"] = extra;
  j["server_load_hardware_threads"] = std::thread::hardware_concurrency();
  std::cout << j.dump(2) << "\n";
  if (!o.out.empty()) {
    std::ofstream out(o.out);
    out << j.dump(2) << "\n";
  }
  if (o.work_dir.empty()) std::filesystem::remove_all(dir);
  return 0;
}
