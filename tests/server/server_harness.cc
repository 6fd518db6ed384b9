#include "server_harness.h"
#include "ampscope/proto/stats_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "ampscope/testing/net.h"

namespace ampscope::testing {
namespace {

// An idle client connection answers the server's shutdown GOAWAY ping only when something polls
// it; in a test process with no call in flight that is gRPC's backup poller, every 5 s by
// default, which would hold every graceful shutdown for that long. Set before gRPC starts.
const bool kFastBackupPoll = [] {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "50", /*overwrite=*/0);
  return true;
}();

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const ClientOptions& options) {
  grpc::ChannelArguments args;
  // Each channel owns its connection, which closes with it: a connection left idle in gRPC's
  // global pool would hold the server's graceful shutdown until its GOAWAY ping times out.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  if (!options.tls_host_override.empty()) {
    args.SetSslTargetNameOverride(options.tls_host_override);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_ca;
    ssl.pem_cert_chain = options.tls_cert;
    ssl.pem_private_key = options.tls_key;
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

void add_auth(grpc::ClientContext* context, const ClientOptions& options) {
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
}

std::vector<v1::StepReport> stored_reports(const std::string& address, const std::string& run) {
  auto client = v1::Query::NewStub(make_channel(address));
  std::vector<v1::StepReport> out;
  std::string token;
  for (int page = 0; page < 1000; ++page) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    v1::GetReportsRequest req;
    req.set_run_id(run);
    req.set_include_tensors(true);
    req.set_limit(10000);
    req.set_page_token(token);
    v1::GetReportsResponse resp;
    const grpc::Status s = client->GetReports(&ctx, req, &resp);
    if (!s.ok()) {
      ADD_FAILURE() << "GetReports(" << run << "): " << s.error_message();
      return out;
    }
    for (const auto& r : resp.reports()) out.push_back(r.report());
    token = resp.next_page_token();
    if (token.empty()) break;
  }
  return out;
}

std::optional<v1::GetRunResponse> get_run(const std::string& address, const std::string& run) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  v1::GetRunRequest req;
  req.set_run_id(run);
  req.set_limit(1000);
  v1::GetRunResponse resp;
  if (!v1::Query::NewStub(make_channel(address))->GetRun(&ctx, req, &resp).ok()) {
    return std::nullopt;
  }
  return resp;
}

grpc::Status delete_run(const std::string& address, const std::string& run,
                        const ClientOptions& options, v1::DeleteRunResponse* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  add_auth(&ctx, options);
  v1::DeleteRunRequest req;
  req.set_run_id(run);
  v1::DeleteRunResponse resp;
  const grpc::Status s =
      v1::Query::NewStub(make_channel(address, options))->DeleteRun(&ctx, req, &resp);
  if (out != nullptr) *out = resp;
  return s;
}

std::optional<v1::GetPolicyResponse> get_policy(const std::string& address,
                                                const std::string& run) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  v1::GetPolicyRequest req;
  req.set_run_id(run);
  v1::GetPolicyResponse resp;
  if (!v1::Query::NewStub(make_channel(address))->GetPolicy(&ctx, req, &resp).ok()) {
    return std::nullopt;
  }
  return resp;
}

AgentStream::AgentStream(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options) {
  add_auth(&context_, options);
  stream_ = v1::Telemetry::NewStub(channel)->Attach(&context_);
  reader_ = std::thread([this] { read_loop(); });
}

AgentStream::~AgentStream() {
  context_.TryCancel();
  reader_.join();
}

void AgentStream::read_loop() {
  v1::ServerMessage m;
  while (stream_->Read(&m)) {
    std::lock_guard lock(mu_);
    received_.push_back(m);
    cv_.notify_all();
  }
  grpc::Status status = stream_->Finish();
  std::lock_guard lock(mu_);
  status_ = status;
  ended_ = true;
  cv_.notify_all();
}

bool AgentStream::send_message(const v1::AgentMessage& message) { return stream_->Write(message); }

bool AgentStream::send_hello(const v1::Hello& hello) {
  v1::AgentMessage m;
  *m.mutable_hello() = hello;
  return send_message(m);
}

bool AgentStream::send(const v1::StepReport& report) {
  v1::AgentMessage m;
  *m.mutable_report() = report;
  return send_message(m);
}

grpc::Status AgentStream::finish(std::chrono::milliseconds timeout) {
  stream_->WritesDone();
  return wait_end(timeout);
}

grpc::Status AgentStream::wait_end(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return ended_; })) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: stream did not end");
  }
  return status_;
}

std::uint64_t AgentStream::highest_ack() {
  std::lock_guard lock(mu_);
  std::uint64_t best = 0;
  for (const auto& m : received_) {
    if (m.has_ack()) best = std::max(best, m.ack().persisted_seq());
  }
  return best;
}

std::optional<std::uint64_t> AgentStream::wait_ack(std::uint64_t seq,
                                                   std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  std::uint64_t best = 0;
  bool any = false;
  const bool ok = cv_.wait_for(lock, timeout, [&] {
    for (const auto& m : received_) {
      if (m.has_ack()) {
        any = true;
        best = std::max(best, m.ack().persisted_seq());
      }
    }
    return (any && best >= seq) || ended_;
  });
  if (!ok || !any || best < seq) return std::nullopt;
  return best;
}

std::optional<v1::Reject> AgentStream::wait_reject(std::uint64_t seq,
                                                   std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  std::optional<v1::Reject> found;
  cv_.wait_for(lock, timeout, [&] {
    for (const auto& m : received_) {
      if (m.has_reject() && m.reject().seq() == seq) found = m.reject();
    }
    return found.has_value() || ended_;
  });
  return found;
}

std::optional<v1::PolicyUpdate> AgentStream::wait_policy(std::size_t index,
                                                         std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  std::optional<v1::PolicyUpdate> found;
  cv_.wait_for(lock, timeout, [&] {
    std::size_t n = 0;
    for (const auto& m : received_) {
      if (m.has_policy() && n++ == index) found = m.policy();
    }
    return found.has_value() || ended_;
  });
  return found;
}

std::vector<v1::ServerMessage> AgentStream::messages() {
  std::lock_guard lock(mu_);
  return received_;
}

std::string scrape(const std::string& address) {
  const std::string url = "http://" + address + "/metrics";
  std::string body;
  const long status = http_get(url, &body);
  EXPECT_EQ(status, 200) << url << (status == 0 ? ": no connection" : "");
  return body;
}

std::vector<Sample> parse_samples(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    std::size_t i = line.find_first_of("{ ");
    s.name = line.substr(0, i);
    if (i != std::string::npos && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const std::size_t eq = line.find('=', i);
        const std::string key = line.substr(i, eq - i);
        std::string value;
        std::size_t j = eq + 2;  // past ="
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) ++j;
          value += line[j];
        }
        s.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;
    }
    const std::string number = line.substr(line.find_first_not_of(' ', i));
    s.value = number == "Nan" || number == "NaN" ? std::nan("") : std::stod(number);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Sample> find_samples(const std::vector<Sample>& samples, const std::string& name,
                                 const std::map<std::string, std::string>& labels) {
  std::vector<Sample> out;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (match) out.push_back(s);
  }
  return out;
}

double sample_value(const std::vector<Sample>& samples, const std::string& name,
                    const std::map<std::string, std::string>& labels) {
  const std::vector<Sample> found = find_samples(samples, name, labels);
  if (found.size() != 1) {
    std::string want = name + "{";
    for (const auto& [k, v] : labels) want += k + "=" + v + ",";
    ADD_FAILURE() << "expected one sample " << want << "}, found " << found.size();
    return std::nan("");
  }
  return found[0].value;
}

v1::Hello make_hello(const std::string& run_id, std::uint32_t rank, std::uint32_t world_size) {
  v1::Hello h;
  h.set_run_id(run_id);
  h.set_rank(rank);
  h.set_world_size(world_size);
  h.set_host("test-host");
  h.set_trainer("server-test");
  h.set_precision("amp-fp16");
  h.set_compute_format(v1::FORMAT_FP16);
  h.set_agent_version("test");
  v1::ScalerConfig* s = h.mutable_scaler();
  s->set_kind(v1::SCALER_KIND_DYNAMIC);
  s->set_init_scale(65536.0);
  s->set_growth_factor(2.0);
  s->set_backoff_factor(0.5);
  s->set_growth_interval(2000);
  return h;
}

v1::TensorStats to_proto(const TensorStats& s, const std::string& name, v1::TensorRole role,
                         double scale, v1::Format dtype) {
  v1::TensorStats t;
  t.set_name(name);
  t.set_role(role);
  t.set_phase(v1::TENSOR_PHASE_BACKWARD);
  t.set_dtype(dtype);
  t.add_shape(static_cast<std::int64_t>(s.numel));
  t.set_scale(scale);
  ampscope::proto::encode_stats(s, /*full=*/true, &t);
  return t;
}

v1::TensorStats synthetic_tensor(const std::string& name, v1::TensorRole role, int lo_exp,
                                 int hi_exp, double scale, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> e(lo_exp, hi_exp + 1);
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double mag = std::exp2(e(rng)) * scale;
    values[i] = static_cast<float>((i % 2 == 0) ? mag : -mag);
  }
  const TargetSpec targets[] = {TargetSpec{Format::kFP16, 0}};
  const TensorStats s = compute_stats(values.data(), n, Format::kFP32, targets);
  return to_proto(s, name, role, scale);
}

v1::StepReport make_report(const std::string& run_id, std::uint32_t rank, std::uint64_t seq,
                           std::int64_t step, int tensors, double loss_scale) {
  v1::StepReport r;
  r.set_run_id(run_id);
  r.set_rank(rank);
  r.set_seq(seq);
  r.set_step(step);
  r.set_loss(2.5);
  r.set_loss_scale(loss_scale);
  r.set_scale_after(loss_scale);
  r.set_grad_norm(1.25);
  r.set_lr(3e-4);
  r.set_step_time_s(0.05);
  r.set_tokens(4096);
  r.set_time_unix_ns(1'700'000'000'000'000'000 + step);
  r.set_optimizer_steps(static_cast<std::uint64_t>(step + 1));
  for (int i = 0; i < tensors; ++i) {
    const bool weight = i % 2 == 0;
    *r.add_tensors() = synthetic_tensor(
        "h" + std::to_string(i / 2) + (weight ? ".mlp.fc.weight" : ".mlp.fc.out.grad"),
        weight ? v1::TENSOR_ROLE_WEIGHT_GRAD : v1::TENSOR_ROLE_ACTIVATION_GRAD, -20, -6, loss_scale,
        256, static_cast<std::uint32_t>(seq * 131 + i));
  }
  return r;
}

v1::TensorStats crafted_tensor(const std::string& name, v1::TensorRole role, int min_exponent,
                               std::vector<std::uint64_t> counts, double scale, std::uint64_t nan,
                               std::uint64_t pos_inf, std::uint64_t underflow,
                               std::uint64_t overflow) {
  v1::TensorStats t;
  t.set_name(name);
  t.set_role(role);
  t.set_phase(v1::TENSOR_PHASE_BACKWARD);
  t.set_dtype(v1::FORMAT_FP16);
  t.set_scale(scale);
  t.set_level(v1::STATS_LEVEL_FULL);
  std::uint64_t total = 0;
  for (std::uint64_t c : counts) total += c;
  t.set_numel(total + nan + pos_inf + 3);
  t.set_zeros(3);
  t.set_nan(nan);
  t.set_pos_inf(pos_inf);
  t.set_min_abs_nonzero(std::ldexp(1.0, min_exponent));
  t.set_max_abs(std::ldexp(1.5, min_exponent + static_cast<int>(counts.size()) - 1));
  t.set_sum_sq(1.0);
  t.mutable_histogram()->set_min_exponent(min_exponent);
  for (std::uint64_t c : counts) t.mutable_histogram()->add_counts(c);
  v1::TargetCounts* c = t.add_targets();
  c->set_format(v1::FORMAT_FP16);
  c->set_underflow(underflow);
  c->set_overflow(overflow);
  return t;
}

void send_reports(const std::shared_ptr<grpc::Channel>& channel, const std::string& run,
                  std::uint64_t from, std::uint64_t to, int tensors) {
  AgentStream agent(channel);
  EXPECT_TRUE(agent.send_hello(make_hello(run))) << run;
  for (std::uint64_t seq = from; seq <= to; ++seq) {
    EXPECT_TRUE(agent.send(make_report(run, 0, seq, static_cast<std::int64_t>(seq), tensors)))
        << run;
  }
  EXPECT_TRUE(agent.wait_ack(to).has_value()) << run;
  EXPECT_TRUE(agent.finish().ok()) << run;
}

}  // namespace ampscope::testing
