// The Attach wire contract (proto/ampscope/v1/telemetry.proto) held to the letter by the real
// ampscope-server, probed with a raw client of its own: grpc::GenericStub over bytes, so that it
// can send what no agent would (bytes that are no message, strings that are not UTF-8) and can
// leave the server's messages unread. Every bound of Hello and StepReport at and one past, every
// enum with unknown values, sizes at and past each limit, sequence numbers around 2^63 across a
// restart, steps at the largest the policy lead leaves room for, two processes claiming one rank,
// half-closes at every point of the exchange, and a client that never reads.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "server_harness.h"

namespace ampscope::testing {
namespace {

constexpr std::uint64_t kMaxSeq = std::numeric_limits<std::int64_t>::max();  // 2^63-1
constexpr std::int64_t kMaxStep = (std::int64_t{1} << 62) - 1;
constexpr std::size_t kMaxMessageBytes = 1 << 20;  // the fixture's --max-message-bytes 1M
#if defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang 14 does not define __SANITIZE_ADDRESS__
#define AMPSCOPE_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(AMPSCOPE_TEST_ASAN)
constexpr bool kAddressSanitizer = true;  // the server of this build too
#else
constexpr bool kAddressSanitizer = false;
#endif

// One Attach call over raw bytes. `read`: false for a client that never reads what the server
// sends (its writes then block once flow control is exhausted).
class RawStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RawStream(const std::shared_ptr<grpc::Channel>& channel, bool read = true)
      : stub_(channel) {
    stub_.PrepareBidiStreamingCall(&context_, "/ampscope.v1.Telemetry/Attach",
                                   grpc::StubOptions(), this);
    if (read) StartRead(&in_);
    StartCall();
  }
  ~RawStream() override {
    context_.TryCancel();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  // One message of these bytes; false when it failed or did not complete within `timeout`.
  bool send_bytes(const std::string& bytes, std::chrono::milliseconds timeout = 10s) {
    {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, timeout, [&] { return !writing_; })) return false;
      grpc::Slice slice(bytes);
      out_ = grpc::ByteBuffer(&slice, 1);
      writing_ = true;
    }
    StartWrite(&out_);
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !writing_; }) && write_ok_;
  }
  bool send(const v1::AgentMessage& m) { return send_bytes(m.SerializeAsString()); }
  bool hello(const v1::Hello& h) {
    v1::AgentMessage m;
    *m.mutable_hello() = h;
    return send(m);
  }
  bool report(const v1::StepReport& r) {
    v1::AgentMessage m;
    *m.mutable_report() = r;
    return send(m);
  }
  void half_close() {
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, 10s, [&] { return !writing_; });
    }
    StartWritesDone();
  }
  grpc::Status wait_end(std::chrono::milliseconds timeout = 20s) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: the stream did not end");
    }
    return status_;
  }
  grpc::Status finish() {
    half_close();
    return wait_end();
  }
  std::vector<v1::ServerMessage> messages() {
    std::lock_guard lock(mu_);
    return received_;
  }
  // Waits until a message satisfies `match` (or the stream ended); the first such one.
  std::optional<v1::ServerMessage> wait_for(
      const std::function<bool(const v1::ServerMessage&)>& match,
      std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mu_);
    std::optional<v1::ServerMessage> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const v1::ServerMessage& m : received_) {
        if (match(m)) {
          found = m;
          return true;
        }
      }
      return done_;
    });
    return found;
  }
  bool wait_ack(std::uint64_t seq) {
    return wait_for([&](const v1::ServerMessage& m) {
             return m.has_ack() && m.ack().persisted_seq() >= seq;
           }).has_value();
  }
  std::optional<v1::Reject> wait_reject(std::uint64_t seq) {
    auto m = wait_for([&](const v1::ServerMessage& m) {
      return m.has_reject() && m.reject().seq() == seq;
    });
    return m ? std::optional<v1::Reject>(m->reject()) : std::nullopt;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    writing_ = false;
    write_ok_ = ok;
    cv_.notify_all();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    v1::ServerMessage m;
    const bool parsed = grpc::SerializationTraits<v1::ServerMessage>::Deserialize(&in_, &m).ok();
    {
      std::lock_guard lock(mu_);
      if (parsed) received_.push_back(std::move(m));
      undecodable_ += parsed ? 0 : 1;
      cv_.notify_all();
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    std::lock_guard lock(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_all();
  }
  int undecodable() {
    std::lock_guard lock(mu_);
    return undecodable_;
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false;
  bool write_ok_ = false;
  std::vector<v1::ServerMessage> received_;
  int undecodable_ = 0;
  bool done_ = false;
  grpc::Status status_;
};

// Index of the first message matching `match` in `all`, or all.size().
std::size_t index_of(const std::vector<v1::ServerMessage>& all,
                     const std::function<bool(const v1::ServerMessage&)>& match) {
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (match(all[i])) return i;
  }
  return all.size();
}

std::function<bool(const v1::ServerMessage&)> ack_of(std::uint64_t seq) {
  return [seq](const v1::ServerMessage& m) {
    return m.has_ack() && m.ack().persisted_seq() >= seq;
  };
}

bool is_policy(const v1::ServerMessage& m) { return m.has_policy(); }

// A tensor at level COUNTS that every rule accepts.
v1::TensorStats counts_tensor(const std::string& name) {
  v1::TensorStats t;
  t.set_name(name);
  t.set_role(v1::TENSOR_ROLE_WEIGHT_GRAD);
  t.set_phase(v1::TENSOR_PHASE_BACKWARD);
  t.set_dtype(v1::FORMAT_FP16);
  t.set_level(v1::STATS_LEVEL_COUNTS);
  t.set_scale(1.0);
  t.set_numel(4);
  t.set_zeros(4);
  return t;
}

// The test process's child ampscope-server (ChildProcess forks it from here).
pid_t server_pid() {
  pid_t found = -1;
  DIR* proc = opendir("/proc");
  while (dirent* e = proc == nullptr ? nullptr : readdir(proc)) {
    const std::string pid = e->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat("/proc/" + pid + "/stat");
    std::string line;
    std::getline(stat, line);
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos || line.find("(ampscope-server)") == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent == ::getpid()) found = static_cast<pid_t>(std::stol(pid));
  }
  if (proc != nullptr) closedir(proc);
  return found;
}

// VmRSS of `pid` in bytes.
std::int64_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

class AdversarialProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override { start({}); }
  void start(std::vector<std::string> flags) {
    server_.reset();
    flags.insert(flags.end(), {"--max-message-bytes", "1M"});
    server_ = std::make_unique<ServerProcess>(dir_.path(), dir_ / "store.db", flags);
  }
  std::shared_ptr<grpc::Channel> channel() { return make_channel(server_->address()); }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

// --- Hello -----------------------------------------------------------------------------------

struct HelloCase {
  std::string name;
  std::function<void(v1::Hello&)> edit;
  std::string field;  // empty: accepted
};

TEST_F(AdversarialProtocolTest, EveryHelloBoundAtAndOnePast) {
  const std::string s64(64, 'a');
  const std::string s256(256, 'a');
  const std::vector<HelloCase> cases = {
      {"run_id 128", [](v1::Hello& h) { h.set_run_id(std::string(128, 'r')); }, ""},
      {"run_id 129", [](v1::Hello& h) { h.set_run_id(std::string(129, 'r')); }, "hello.run_id"},
      {"run_id empty", [](v1::Hello& h) { h.set_run_id(""); }, "hello.run_id"},
      {"run_id slash", [](v1::Hello& h) { h.set_run_id("a/b"); }, "hello.run_id"},
      {"world 65536", [](v1::Hello& h) { h.set_world_size(65536); }, ""},
      {"world 65537", [](v1::Hello& h) { h.set_world_size(65537); }, "hello.world_size"},
      {"world 0", [](v1::Hello& h) { h.set_world_size(0); }, "hello.world_size"},
      {"rank world-1", [](v1::Hello& h) { h.set_world_size(4), h.set_rank(3); }, ""},
      {"rank world", [](v1::Hello& h) { h.set_world_size(4), h.set_rank(4); }, "hello.rank"},
      {"host 256", [&](v1::Hello& h) { h.set_host(s256); }, ""},
      {"host 257", [&](v1::Hello& h) { h.set_host(s256 + "a"); }, "hello.host"},
      {"host control", [](v1::Hello& h) { h.set_host("a\nb"); }, "hello.host"},
      {"trainer 256", [&](v1::Hello& h) { h.set_trainer(s256); }, ""},
      {"trainer 257", [&](v1::Hello& h) { h.set_trainer(s256 + "a"); }, "hello.trainer"},
      {"precision 64", [&](v1::Hello& h) { h.set_precision(s64); }, ""},
      {"precision 65", [&](v1::Hello& h) { h.set_precision(s64 + "a"); }, "hello.precision"},
      {"agent_version 64", [&](v1::Hello& h) { h.set_agent_version(s64); }, ""},
      {"agent_version 65", [&](v1::Hello& h) { h.set_agent_version(s64 + "a"); },
       "hello.agent_version"},
      {"compute_format E5M2", [](v1::Hello& h) { h.set_compute_format(v1::FORMAT_E5M2); }, ""},
      {"compute_format 99",
       [](v1::Hello& h) { h.set_compute_format(static_cast<v1::Format>(99)); },
       "hello.compute_format"},
      {"scaler kind 99",
       [](v1::Hello& h) { h.mutable_scaler()->set_kind(static_cast<v1::ScalerKind>(99)); },
       "hello.scaler.kind"},
      {"scaler init 0", [](v1::Hello& h) { h.mutable_scaler()->set_init_scale(0); },
       "hello.scaler.init_scale"},
      {"scaler init inf", [](v1::Hello& h) { h.mutable_scaler()->set_init_scale(INFINITY); },
       "hello.scaler.init_scale"},
      {"scaler growth 1", [](v1::Hello& h) { h.mutable_scaler()->set_growth_factor(1.0); }, ""},
      {"scaler growth 0.99", [](v1::Hello& h) { h.mutable_scaler()->set_growth_factor(0.99); },
       "hello.scaler.growth_factor"},
      {"scaler backoff 1", [](v1::Hello& h) { h.mutable_scaler()->set_backoff_factor(1.0); }, ""},
      {"scaler backoff 1.01", [](v1::Hello& h) { h.mutable_scaler()->set_backoff_factor(1.01); },
       "hello.scaler.backoff_factor"},
      {"scaler backoff 0", [](v1::Hello& h) { h.mutable_scaler()->set_backoff_factor(0); },
       "hello.scaler.backoff_factor"},
      {"scaler min -1", [](v1::Hello& h) { h.mutable_scaler()->set_min_scale(-1); },
       "hello.scaler.min_scale"},
      {"scaler max < min",
       [](v1::Hello& h) {
         h.mutable_scaler()->set_min_scale(4);
         h.mutable_scaler()->set_max_scale(2);
       },
       "hello.scaler.max_scale"},
      {"resume_from_seq 2^63-1", [](v1::Hello& h) { h.set_resume_from_seq(kMaxSeq); }, ""},
      {"resume_from_seq 2^63", [](v1::Hello& h) { h.set_resume_from_seq(kMaxSeq + 1); },
       "hello.resume_from_seq"},
      {"last_policy_seq 2^63-1", [](v1::Hello& h) { h.set_last_policy_seq(kMaxSeq); }, ""},
      {"last_policy_seq 2^64-1", [](v1::Hello& h) { h.set_last_policy_seq(~std::uint64_t{0}); },
       "hello.last_policy_seq"},
      {"layers 4096",
       [](v1::Hello& h) {
         for (int i = 0; i < 4096; ++i) h.add_fp32_capable_layers("l" + std::to_string(i));
       },
       ""},
      {"layers 4097",
       [](v1::Hello& h) {
         for (int i = 0; i < 4097; ++i) h.add_fp32_capable_layers("l" + std::to_string(i));
       },
       "hello.fp32_capable_layers"},
      {"layer name 256", [&](v1::Hello& h) { h.add_fp32_capable_layers(s256); }, ""},
      {"layer name 257", [&](v1::Hello& h) { h.add_fp32_capable_layers(s256 + "a"); },
       "hello.fp32_capable_layers[0]"},
      {"data_parallel world", [](v1::Hello& h) { h.set_world_size(2), h.set_data_parallel_size(2); },
       ""},
      {"data_parallel world+1",
       [](v1::Hello& h) { h.set_world_size(2), h.set_data_parallel_size(3); },
       "hello.data_parallel_size"},
      {"agreement INDEPENDENT",
       [](v1::Hello& h) { h.set_policy_agreement(v1::POLICY_AGREEMENT_INDEPENDENT); }, ""},
      // Only stored: a value of a newer agent is taken, as the compatibility rules promise.
      {"agreement 99",
       [](v1::Hello& h) { h.set_policy_agreement(static_cast<v1::PolicyAgreement>(99)); }, ""},
      {"pid 2^31-1", [](v1::Hello& h) { h.set_pid(2147483647u); }, ""},
      {"pid 2^31", [](v1::Hello& h) { h.set_pid(2147483648u); }, "hello.pid"},
      {"process start 0", [](v1::Hello& h) { h.set_process_start_unix_ns(0); }, ""},
      {"process start -1", [](v1::Hello& h) { h.set_process_start_unix_ns(-1); },
       "hello.process_start_unix_ns"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const HelloCase& c = cases[i];
    SCOPED_TRACE(c.name);
    v1::Hello h = make_hello("hello-" + std::to_string(i));
    c.edit(h);
    RawStream s(channel());
    ASSERT_TRUE(s.hello(h));
    if (c.field.empty()) {
      EXPECT_TRUE(s.wait_ack(0));
      EXPECT_TRUE(s.finish().ok());
      continue;
    }
    const grpc::Status st = s.wait_end();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_EQ(st.error_message().rfind(c.field + ": ", 0), 0u) << st.error_message();
    EXPECT_EQ(index_of(s.messages(), ack_of(0)), s.messages().size()) << "no Ack of a bad Hello";
  }
}

// --- StepReport -------------------------------------------------------------------------------

struct ReportCase {
  std::string name;
  std::function<void(v1::StepReport&)> edit;
  std::string field;   // empty: accepted
  std::string reason;  // Reject.reason
};

// A part of a report that breaks a rule of its own (a tensor, a notice, a layer name, a policy
// outcome, the first offender's name) is refused alone: no Reject, the step is stored without
// it (validation_test checks what is left).
bool refused_alone(const std::string& field) {
  for (const char* part : {"report.tensors[", "report.fp32_layers[", "report.policy_outcomes[",
                           "report.notices[", "report.first_offender.tensor"}) {
    if (field.starts_with(part)) return true;
  }
  return false;
}

TEST_F(AdversarialProtocolTest, EveryReportBoundAndEnumAtAndOnePast) {
  const std::string s256(256, 'n');
  const std::string s512(512, 'n');
  const auto with_tensor = [](std::function<void(v1::TensorStats&)> edit) {
    return [edit](v1::StepReport& r) {
      v1::TensorStats* t = r.add_tensors();
      *t = counts_tensor("t");
      edit(*t);
    };
  };
  const auto offender = [](std::function<void(v1::FirstOffender&)> edit) {
    return [edit](v1::StepReport& r) {
      r.mutable_first_offender()->set_tensor("t");
      edit(*r.mutable_first_offender());
    };
  };
  const auto outcome = [](std::string id, std::string reason) {
    return [id, reason](v1::StepReport& r) {
      v1::PolicyOutcome* o = r.add_policy_outcomes();
      o->set_policy_id(id);
      o->set_reason(reason);
    };
  };
  const std::vector<ReportCase> cases = {
      {"valid", [](v1::StepReport&) {}, "", ""},
      {"run_id other", [](v1::StepReport& r) { r.set_run_id("other"); }, "report.run_id",
       "identity"},
      {"rank other", [](v1::StepReport& r) { r.set_rank(1); }, "report.rank", "identity"},
      {"step 0", [](v1::StepReport& r) { r.set_step(0); }, "", ""},
      {"step -1", [](v1::StepReport& r) { r.set_step(-1); }, "report.step", "range"},
      {"step 2^62-1", [](v1::StepReport& r) { r.set_step(kMaxStep); }, "", ""},
      {"step 2^62", [](v1::StepReport& r) { r.set_step(kMaxStep + 1); }, "report.step", "range"},
      {"step 2^63-1",
       [](v1::StepReport& r) { r.set_step(std::numeric_limits<std::int64_t>::max()); },
       "report.step", "range"},
      {"loss NaN", [](v1::StepReport& r) { r.set_loss(NAN); }, "", ""},
      {"loss_scale 0", [](v1::StepReport& r) { r.set_loss_scale(0); }, "report.loss_scale",
       "range"},
      {"loss_scale inf", [](v1::StepReport& r) { r.set_loss_scale(INFINITY); },
       "report.loss_scale", "non_finite"},
      {"scale_after -1", [](v1::StepReport& r) { r.set_scale_after(-1); }, "report.scale_after",
       "range"},
      {"grad_norm NaN clean", [](v1::StepReport& r) { r.set_grad_norm(NAN); },
       "report.grad_norm", "non_finite"},
      {"grad_norm NaN found_inf",
       [](v1::StepReport& r) { r.set_grad_norm(NAN), r.set_found_inf(true); }, "", ""},
      {"grad_norm -1", [](v1::StepReport& r) { r.set_grad_norm(-1); }, "report.grad_norm",
       "range"},
      {"lr 0", [](v1::StepReport& r) { r.set_lr(0); }, "", ""},
      {"lr -1e-9", [](v1::StepReport& r) { r.set_lr(-1e-9); }, "report.lr", "range"},
      {"step_time -1", [](v1::StepReport& r) { r.set_step_time_s(-1); }, "report.step_time_s",
       "range"},
      {"tc ratio 1", [](v1::StepReport& r) { r.set_tensor_core_active_ratio(1.0); }, "", ""},
      {"tc ratio 1+", [](v1::StepReport& r) { r.set_tensor_core_active_ratio(1.0000001); },
       "report.tensor_core_active_ratio", "range"},
      {"tc ratio NaN", [](v1::StepReport& r) { r.set_tensor_core_active_ratio(NAN); },
       "report.tensor_core_active_ratio", "non_finite"},
      {"time -1", [](v1::StepReport& r) { r.set_time_unix_ns(-1); }, "report.time_unix_ns",
       "range"},
      {"offender ok", offender([](v1::FirstOffender&) {}), "", ""},
      {"offender no tensor", offender([](v1::FirstOffender& f) { f.set_tensor(""); }),
       "report.first_offender.tensor", "string"},
      {"offender tensor 257", offender([&](v1::FirstOffender& f) { f.set_tensor(s256 + "n"); }),
       "report.first_offender.tensor", "string"},
      {"offender role 99",
       offender([](v1::FirstOffender& f) { f.set_role(static_cast<v1::TensorRole>(99)); }),
       "report.first_offender.role", "enum"},
      {"offender phase 99",
       offender([](v1::FirstOffender& f) { f.set_phase(static_cast<v1::TensorPhase>(99)); }),
       "report.first_offender.phase", "enum"},
      {"tensors 4096",
       [](v1::StepReport& r) {
         for (int i = 0; i < 4096; ++i) *r.add_tensors() = counts_tensor("t" + std::to_string(i));
       },
       "", ""},
      {"tensors 4097",
       [](v1::StepReport& r) {
         for (int i = 0; i < 4097; ++i) *r.add_tensors() = counts_tensor("t" + std::to_string(i));
       },
       "report.tensors", "too_many"},
      {"tensor name 256", with_tensor([&](v1::TensorStats& t) { t.set_name(s256); }), "", ""},
      {"tensor name 257", with_tensor([&](v1::TensorStats& t) { t.set_name(s256 + "n"); }),
       "report.tensors[0].name", "string"},
      {"tensor role 0",
       with_tensor([](v1::TensorStats& t) { t.set_role(v1::TENSOR_ROLE_UNSPECIFIED); }),
       "report.tensors[0].role", "enum"},
      {"tensor role 99",
       with_tensor([](v1::TensorStats& t) { t.set_role(static_cast<v1::TensorRole>(99)); }),
       "report.tensors[0].role", "enum"},
      {"tensor phase 0",
       with_tensor([](v1::TensorStats& t) { t.set_phase(v1::TENSOR_PHASE_UNSPECIFIED); }), "",
       ""},
      {"tensor phase 99",
       with_tensor([](v1::TensorStats& t) { t.set_phase(static_cast<v1::TensorPhase>(99)); }),
       "report.tensors[0].phase", "enum"},
      {"tensor dtype BF16", with_tensor([](v1::TensorStats& t) { t.set_dtype(v1::FORMAT_BF16); }),
       "", ""},
      {"tensor dtype E4M3", with_tensor([](v1::TensorStats& t) { t.set_dtype(v1::FORMAT_E4M3); }),
       "report.tensors[0].dtype", "enum"},
      {"tensor dtype 99",
       with_tensor([](v1::TensorStats& t) { t.set_dtype(static_cast<v1::Format>(99)); }),
       "report.tensors[0].dtype", "enum"},
      {"tensor held 0",
       with_tensor([](v1::TensorStats& t) { t.set_held(v1::FORMAT_UNSPECIFIED); }),
       "report.tensors[0].held", "enum"},
      {"tensor held 99",
       with_tensor([](v1::TensorStats& t) { t.set_held(static_cast<v1::Format>(99)); }),
       "report.tensors[0].held", "enum"},
      {"tensor level 0",
       with_tensor([](v1::TensorStats& t) { t.set_level(v1::STATS_LEVEL_UNSPECIFIED); }),
       "report.tensors[0].level", "enum"},
      {"tensor level 99",
       with_tensor([](v1::TensorStats& t) { t.set_level(static_cast<v1::StatsLevel>(99)); }),
       "report.tensors[0].level", "enum"},
      {"tensor counts = numel", with_tensor([](v1::TensorStats& t) { t.set_nan(0); }), "", ""},
      {"tensor counts > numel", with_tensor([](v1::TensorStats& t) { t.set_nan(1); }),
       "report.tensors[0].numel", "counts_exceed_numel"},
      {"tensor counts wrap",
       with_tensor([](v1::TensorStats& t) { t.set_nan(~std::uint64_t{0}), t.set_pos_inf(2); }),
       "report.tensors[0].numel", "counts_exceed_numel"},
      {"tensor shape 8 dims",
       with_tensor([](v1::TensorStats& t) {
         for (int i = 0; i < 8; ++i) t.add_shape(i < 2 ? 2 : 1);
       }),
       "", ""},
      {"tensor shape 9 dims",
       with_tensor([](v1::TensorStats& t) {
         for (int i = 0; i < 9; ++i) t.add_shape(i < 2 ? 2 : 1);
       }),
       "report.tensors[0].shape", "shape"},
      {"tensor scale 0", with_tensor([](v1::TensorStats& t) { t.set_scale(0); }),
       "report.tensors[0].scale", "range"},
      {"tensor histogram with COUNTS",
       with_tensor([](v1::TensorStats& t) { t.mutable_histogram(); }),
       "report.tensors[0].histogram", "histogram_presence"},
      {"tensor targets 16",
       with_tensor([](v1::TensorStats& t) {
         for (int i = 0; i < 16; ++i) t.add_targets()->set_format(v1::FORMAT_FP16);
       }),
       "", ""},
      {"tensor targets 17",
       with_tensor([](v1::TensorStats& t) {
         for (int i = 0; i < 17; ++i) t.add_targets()->set_format(v1::FORMAT_FP16);
       }),
       "report.tensors[0].targets", "too_many"},
      {"target format 99",
       with_tensor([](v1::TensorStats& t) {
         t.add_targets()->set_format(static_cast<v1::Format>(99));
       }),
       "report.tensors[0].targets[0].format", "enum"},
      {"target scale_log2 256",
       with_tensor([](v1::TensorStats& t) {
         v1::TargetCounts* c = t.add_targets();
         c->set_format(v1::FORMAT_FP16);
         c->set_scale_log2(256);
       }),
       "", ""},
      {"target scale_log2 257",
       with_tensor([](v1::TensorStats& t) {
         v1::TargetCounts* c = t.add_targets();
         c->set_format(v1::FORMAT_FP16);
         c->set_scale_log2(257);
       }),
       "report.tensors[0].targets[0].scale_log2", "range"},
      {"fp32_layers 4096",
       [](v1::StepReport& r) {
         for (int i = 0; i < 4096; ++i) r.add_fp32_layers("l" + std::to_string(i));
       },
       "", ""},
      {"fp32_layers 4097",
       [](v1::StepReport& r) {
         for (int i = 0; i < 4097; ++i) r.add_fp32_layers("l" + std::to_string(i));
       },
       "report.fp32_layers", "too_many"},
      {"fp32_layer 257", [&](v1::StepReport& r) { r.add_fp32_layers(s256 + "n"); },
       "report.fp32_layers[0]", "string"},
      {"outcomes 64",
       [&](v1::StepReport& r) {
         for (int i = 0; i < 64; ++i) outcome("p" + std::to_string(i), "")(r);
       },
       "", ""},
      {"outcomes 65",
       [&](v1::StepReport& r) {
         for (int i = 0; i < 65; ++i) outcome("p" + std::to_string(i), "")(r);
       },
       "report.policy_outcomes", "too_many"},
      {"outcome id empty", outcome("", ""), "report.policy_outcomes[0].policy_id", "string"},
      {"outcome id 65", outcome(std::string(65, 'p'), ""), "report.policy_outcomes[0].policy_id",
       "string"},
      {"outcome reason 512", outcome("p7", s512), "", ""},
      {"outcome reason 513", outcome("p7", s512 + "n"), "report.policy_outcomes[0].reason",
       "string"},
      {"notices 16",
       [](v1::StepReport& r) {
         for (int i = 0; i < 16; ++i) r.add_notices("notice " + std::to_string(i));
       },
       "", ""},
      {"notices 17",
       [](v1::StepReport& r) {
         for (int i = 0; i < 17; ++i) r.add_notices("notice " + std::to_string(i));
       },
       "report.notices", "too_many"},
      {"notice 512", [&](v1::StepReport& r) { r.add_notices(s512); }, "", ""},
      {"notice 513", [&](v1::StepReport& r) { r.add_notices(s512 + "n"); }, "report.notices[0]",
       "string"},
      {"notice empty", [](v1::StepReport& r) { r.add_notices(""); }, "report.notices[0]",
       "string"},
  };
  RawStream s(channel());
  ASSERT_TRUE(s.hello(make_hello("reports")));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    v1::StepReport r = make_report("reports", 0, i + 1, static_cast<std::int64_t>(i), 0);
    cases[i].edit(r);
    ASSERT_TRUE(s.report(r)) << cases[i].name;
  }
  ASSERT_TRUE(s.wait_ack(cases.size()));
  const std::vector<v1::ServerMessage> all = s.messages();
  std::set<std::uint64_t> stored_seqs;
  for (const v1::StepReport& r : stored_reports(server_->address(), "reports")) {
    stored_seqs.insert(r.seq());
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const ReportCase& c = cases[i];
    SCOPED_TRACE(c.name);
    const std::size_t at = index_of(all, [&](const v1::ServerMessage& m) {
      return m.has_reject() && m.reject().seq() == i + 1;
    });
    const bool stored = c.field.empty() || refused_alone(c.field);
    EXPECT_EQ(stored_seqs.contains(i + 1), stored);
    if (stored) {
      EXPECT_EQ(at, all.size()) << all[at].reject().message();
      continue;
    }
    ASSERT_LT(at, all.size()) << "no Reject";
    const v1::Reject& reject = all[at].reject();
    EXPECT_EQ(reject.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_EQ(reject.field(), c.field);
    EXPECT_EQ(reject.reason(), c.reason);
    EXPECT_EQ(reject.message().rfind(c.field + ": ", 0), 0u) << reject.message();
    // Settled, and covered by an Ack that comes after it.
    EXPECT_LT(at, index_of(all, ack_of(i + 1)));
  }
  EXPECT_TRUE(s.finish().ok());
}

TEST_F(AdversarialProtocolTest, MessageSizeAtTheLimitIsTakenOnePastEndsTheStream) {
  // A valid report padded to exactly `bytes` with a field of AgentMessage this server does not
  // know (15, length-delimited), which it skips as the compatibility rules promise.
  const auto sized = [](std::uint64_t seq, std::size_t bytes) {
    v1::AgentMessage m;
    *m.mutable_report() = make_report("sized", 0, seq, static_cast<std::int64_t>(seq), 2);
    std::string out = m.SerializeAsString();
    const auto varint = [](std::size_t v) {
      std::string b;
      for (; v >= 0x80; v >>= 7) b.push_back(static_cast<char>(0x80 | (v & 0x7f)));
      b.push_back(static_cast<char>(v));
      return b;
    };
    const std::size_t pad = bytes - out.size();  // tag + length + payload
    for (std::size_t k = 1; k <= 4; ++k) {
      const std::size_t len = pad - 1 - k;
      if (varint(len).size() != k) continue;
      out += static_cast<char>((15 << 3) | 2) + varint(len) + std::string(len, 'p');
      break;
    }
    EXPECT_EQ(out.size(), bytes);
    return out;
  };
  RawStream s(channel());
  ASSERT_TRUE(s.hello(make_hello("sized")));
  ASSERT_TRUE(s.send_bytes(sized(1, kMaxMessageBytes)));
  ASSERT_TRUE(s.wait_ack(1));
  s.send_bytes(sized(2, kMaxMessageBytes + 1));
  const grpc::Status st = s.wait_end();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  ASSERT_EQ(stored_reports(server_->address(), "sized").size(), 1u);
}

// --- Sequence numbers ----------------------------------------------------------------------------

TEST_F(AdversarialProtocolTest, SeqAbove2To63IsRefusedAndNothingIsLostAcrossARestart) {
  {
    RawStream s(channel());
    ASSERT_TRUE(s.hello(make_hello("seq")));
    ASSERT_TRUE(s.report(make_report("seq", 0, kMaxSeq + 1, 1, 0)));  // 2^63
    ASSERT_TRUE(s.report(make_report("seq", 0, ~std::uint64_t{0}, 2, 0)));        // 2^64-1
    ASSERT_TRUE(s.report(make_report("seq", 0, 5, 3, 0)));
    ASSERT_TRUE(s.wait_ack(5));
    for (std::uint64_t seq : {kMaxSeq + 1, ~std::uint64_t{0}}) {
      const std::optional<v1::Reject> reject = s.wait_reject(seq);
      ASSERT_TRUE(reject.has_value()) << seq;
      EXPECT_EQ(reject->field(), "report.seq");
      EXPECT_EQ(reject->reason(), "range");
      EXPECT_NE(reject->message().find("9223372036854775807"), std::string::npos)
          << reject->message();
    }
    // No Ack names a seq the store cannot keep.
    for (const v1::ServerMessage& m : s.messages()) {
      if (m.has_ack()) {
        EXPECT_LE(m.ack().persisted_seq(), 5u);
      }
    }
    EXPECT_TRUE(s.finish().ok());
  }
  {
    RawStream other(channel());
    ASSERT_TRUE(other.hello(make_hello("seq-max")));
    ASSERT_TRUE(other.report(make_report("seq-max", 0, kMaxSeq, 1, 0)));
    ASSERT_TRUE(other.wait_ack(kMaxSeq));
    EXPECT_TRUE(other.finish().ok());
  }
  server_->restart();
  {
    RawStream s(channel());
    ASSERT_TRUE(s.hello(make_hello("seq")));
    const auto first = s.wait_for([](const v1::ServerMessage& m) { return m.has_ack(); });
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->ack().persisted_seq(), 5u);
    ASSERT_TRUE(s.report(make_report("seq", 0, 6, 4, 0)));
    ASSERT_TRUE(s.wait_ack(6));
    EXPECT_TRUE(s.finish().ok());
  }
  {
    RawStream other(channel());
    ASSERT_TRUE(other.hello(make_hello("seq-max")));
    const auto first = other.wait_for([](const v1::ServerMessage& m) { return m.has_ack(); });
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->ack().persisted_seq(), kMaxSeq);
    EXPECT_TRUE(other.finish().ok());
  }
  const std::vector<v1::StepReport> stored = stored_reports(server_->address(), "seq");
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored[0].seq(), 5u);
  EXPECT_EQ(stored[1].seq(), 6u);
}

// --- Undecodable messages ----------------------------------------------------------------------

TEST_F(AdversarialProtocolTest, UndecodableMessageEndsTheStreamAfterTheAcksOfWhatCameBefore) {
  // A report whose run_id is not UTF-8: field 2 (report) holding field 1 (run_id) = 0xff.
  const std::string not_utf8("\x12\x03\x0a\x01\xff", 5);
  const std::string garbage("\xff\xff\xff\xff", 4);
  for (const std::string& bad : {garbage, not_utf8}) {
    SCOPED_TRACE(bad == garbage ? "garbage" : "not UTF-8");
    const std::string run = bad == garbage ? "garbage" : "utf8";
    RawStream s(channel());
    ASSERT_TRUE(s.hello(make_hello(run)));
    ASSERT_TRUE(s.report(make_report(run, 0, 1, 0, 0)));
    ASSERT_TRUE(s.report(make_report(run, 0, 2, 1, 0)));
    ASSERT_TRUE(s.send_bytes(bad));
    s.report(make_report(run, 0, 3, 2, 0));  // never taken
    const grpc::Status st = s.wait_end();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("undecodable message after seq 2"), std::string::npos)
        << st.error_message();
    EXPECT_TRUE(s.wait_ack(2));
    EXPECT_EQ(stored_reports(server_->address(), run).size(), 2u);
  }
  RawStream first(channel());
  ASSERT_TRUE(first.send_bytes(garbage));
  const grpc::Status st = first.wait_end();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("before the Hello"), std::string::npos) << st.error_message();
}

// --- Quoted input ------------------------------------------------------------------------------

TEST_F(AdversarialProtocolTest, RejectQuotesAtMost256BytesOfClientTextAsValidUtf8) {
  RawStream s(channel());
  ASSERT_TRUE(s.hello(make_hello("quote")));
  // 1 + 2k bytes: the 256-byte cut falls inside a two-byte character.
  std::string huge = "a";
  for (int i = 0; i < 400000; ++i) huge += "\xc3\xa9";  // é
  v1::StepReport r = make_report("quote", 0, 1, 0, 0);
  r.set_run_id(huge);
  ASSERT_TRUE(s.report(r));
  const std::optional<v1::Reject> reject = s.wait_reject(1);
  ASSERT_TRUE(reject.has_value());
  EXPECT_EQ(reject->reason(), "identity");
  EXPECT_LT(reject->message().size(), 512u);
  EXPECT_NE(reject->message().find("...(truncated, 800001 bytes)"), std::string::npos);
  const std::string quoted = reject->message().substr(reject->message().find('\'') + 1);
  EXPECT_EQ(quoted.find("...(truncated"), 255u) << "cut before the character that would pass 256";
  EXPECT_EQ(s.undecodable(), 0) << "a Reject that was not valid UTF-8";
  EXPECT_TRUE(s.finish().ok());

  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((dir_ / "store.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr),
            SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT max(length(CAST(message AS BLOB))) FROM rejections", -1,
                               &q, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(q, 0), static_cast<std::int64_t>(reject->message().size()));
  sqlite3_finalize(q);
  sqlite3_close(db);
}

// --- Policy updates before the Ack ---------------------------------------------------------------

class AdversarialPolicyTest : public AdversarialProtocolTest {
 protected:
  void SetUp() override {
    start({"--policy", "static-params", "--static-loss-scale", "1024", "--policy-lead-steps", "3"});
  }
};

TEST_F(AdversarialPolicyTest, DecisionPrecedesTheAckEvenWhenTheAgentHalfClosesAtOnce) {
  RawStream s(channel());
  ASSERT_TRUE(s.hello(make_hello("order")));
  ASSERT_TRUE(s.report(make_report("order", 0, 1, kMaxStep, 0)));
  s.half_close();
  ASSERT_TRUE(s.wait_end().ok());
  const std::vector<v1::ServerMessage> all = s.messages();
  const std::size_t policy = index_of(all, is_policy);
  ASSERT_LT(policy, all.size()) << "the decision was lost";
  EXPECT_LT(policy, index_of(all, ack_of(1)));
  // The largest step leaves room for the lead.
  EXPECT_EQ(all[policy].policy().effective_from_step(), kMaxStep + 3);
  EXPECT_EQ(all[policy].policy().loss_scale(), 1024.0);

  // A reconnect that lacks the decision gets the policy in force before its first Ack, even with
  // a report in the same commit.
  RawStream again(channel());
  ASSERT_TRUE(again.hello(make_hello("order")));
  ASSERT_TRUE(again.report(make_report("order", 0, 2, 5, 0)));
  again.half_close();
  ASSERT_TRUE(again.wait_end().ok());
  const std::vector<v1::ServerMessage> next = again.messages();
  ASSERT_FALSE(next.empty());
  EXPECT_TRUE(next.front().has_policy()) << next.front().DebugString();
  EXPECT_LT(index_of(next, ack_of(2)), next.size());

  // One that holds it gets none.
  v1::Hello holds = make_hello("order");
  holds.set_last_policy_seq(all[policy].policy().seq());
  RawStream third(channel());
  ASSERT_TRUE(third.hello(holds));
  third.half_close();
  ASSERT_TRUE(third.wait_end().ok());
  EXPECT_EQ(index_of(third.messages(), is_policy), third.messages().size());
}

TEST_F(AdversarialPolicyTest, StreamEndingSoftlyStillWritesTheDecisionsOfWhatItAcks) {
  RawStream s(channel());
  ASSERT_TRUE(s.hello(make_hello("soft")));
  ASSERT_TRUE(s.report(make_report("soft", 0, 1, 0, 0)));
  ASSERT_TRUE(s.hello(make_hello("soft")));  // a protocol error: a soft end
  const grpc::Status st = s.wait_end();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  const std::vector<v1::ServerMessage> all = s.messages();
  const std::size_t ack = index_of(all, ack_of(1));
  ASSERT_LT(ack, all.size());
  EXPECT_LT(index_of(all, is_policy), ack) << "acked a report whose decision was dropped";
}

TEST_F(AdversarialProtocolTest, HeadroomStepsNearInt64MaxAreRefusedNotOverflowed) {
  start({"--policy", "headroom", "--headroom-every", "1"});
  RawStream s(channel());
  ASSERT_TRUE(s.hello(make_hello("headroom")));
  v1::StepReport last = make_report("headroom", 0, 1, 0);
  last.set_step(std::numeric_limits<std::int64_t>::max());
  ASSERT_TRUE(s.report(last));
  const std::optional<v1::Reject> reject = s.wait_reject(1);
  ASSERT_TRUE(reject.has_value());
  EXPECT_EQ(reject->field(), "report.step");
  ASSERT_TRUE(s.report(make_report("headroom", 0, 2, kMaxStep)));
  ASSERT_TRUE(s.wait_ack(2));
  EXPECT_TRUE(s.finish().ok());
  for (const v1::ServerMessage& m : s.messages()) {
    if (m.has_policy()) {
      EXPECT_GE(m.policy().effective_from_step(), kMaxStep);
    }
  }
}

// --- Half-closes ---------------------------------------------------------------------------------

TEST_F(AdversarialProtocolTest, HalfCloseAtEveryPointEndsOkAfterTheAcks) {
  {
    RawStream s(channel());  // before the Hello
    EXPECT_TRUE(s.finish().ok());
    EXPECT_TRUE(s.messages().empty());
  }
  {
    RawStream s(channel());  // right after the Hello
    ASSERT_TRUE(s.hello(make_hello("half")));
    EXPECT_TRUE(s.finish().ok());
    EXPECT_EQ(index_of(s.messages(), ack_of(0)), 0u);
  }
  {
    RawStream s(channel());  // right after reports
    ASSERT_TRUE(s.hello(make_hello("half")));
    for (std::uint64_t seq = 1; seq <= 20; ++seq) {
      ASSERT_TRUE(s.report(make_report("half", 0, seq, static_cast<std::int64_t>(seq), 1)));
    }
    EXPECT_TRUE(s.finish().ok());
    EXPECT_LT(index_of(s.messages(), ack_of(20)), s.messages().size());
  }
  {
    RawStream s(channel());  // right after a rejected report
    ASSERT_TRUE(s.hello(make_hello("half")));
    ASSERT_TRUE(s.report(make_report("half", 0, 21, -1, 0)));
    EXPECT_TRUE(s.finish().ok());
    const std::vector<v1::ServerMessage> all = s.messages();
    const std::size_t reject = index_of(all, [](const v1::ServerMessage& m) {
      return m.has_reject() && m.reject().seq() == 21;
    });
    ASSERT_LT(reject, all.size());
    EXPECT_LT(reject, index_of(all, ack_of(21)));
    EXPECT_LT(index_of(all, ack_of(21)), all.size());
  }
  EXPECT_EQ(stored_reports(server_->address(), "half").size(), 20u);
}

// --- One rank, two processes ---------------------------------------------------------------------

TEST_F(AdversarialProtocolTest, SecondProcessClaimingARankIsRefusedTheSameProcessReconnects) {
  const auto hello = [](const std::string& host, std::uint64_t pid, std::int64_t start) {
    v1::Hello h = make_hello("claimed", 0, 2);
    h.set_host(host);
    h.set_pid(pid);
    h.set_process_start_unix_ns(start);
    return h;
  };
  RawStream first(channel());
  ASSERT_TRUE(first.hello(hello("h", 1, 100)));
  ASSERT_TRUE(first.report(make_report("claimed", 0, 1, 0, 0)));
  ASSERT_TRUE(first.wait_ack(1));

  struct Claim {
    v1::Hello hello;
    bool refused;
  };
  const std::vector<Claim> claims = {
      {hello("h", 2, 200), true},    // mpirun -np 2, both rank 0
      {hello("h", 1, 300), true},    // pid reused by a later process
      {hello("g", 1, 100), true},    // another host
      {hello("h", 1, 100), false},   // the same process reconnecting
      {hello("h", 0, 0), false},     // an agent that does not say: told apart by host only
  };
  for (const Claim& c : claims) {
    SCOPED_TRACE(c.hello.ShortDebugString());
    RawStream s(channel());
    ASSERT_TRUE(s.hello(c.hello));
    if (!c.refused) {
      EXPECT_TRUE(s.wait_ack(1));
      EXPECT_TRUE(s.finish().ok());
      continue;
    }
    const grpc::Status st = s.wait_end();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
    EXPECT_NE(st.error_message().find("host h pid 1"), std::string::npos) << st.error_message();
    EXPECT_TRUE(s.messages().empty());
  }
  // Rank 1 is another rank: no conflict.
  RawStream rank1(channel());
  ASSERT_TRUE(rank1.hello(make_hello("claimed", 1, 2)));
  EXPECT_TRUE(rank1.wait_ack(0));
  EXPECT_TRUE(rank1.finish().ok());
  EXPECT_TRUE(first.finish().ok());
  // Once the first one is gone, another process may take the rank.
  RawStream later(channel());
  ASSERT_TRUE(later.hello(hello("h", 2, 200)));
  EXPECT_TRUE(later.wait_ack(1));
  EXPECT_TRUE(later.finish().ok());

  const CommandResult show = run_process(
      {AMPSCOPE_CLI_BINARY, "show", "claimed", "--server", server_->address()}, 30s);
  ASSERT_EQ(show.code, 0) << show.err;
  EXPECT_NE(show.out.find("refused a second agent (host h pid 2) while host h pid 1 was "
                          "streaming"),
            std::string::npos)
      << show.out;
  EXPECT_NE(show.out.find("refused a second agent (host g pid 1) while host h pid 1"),
            std::string::npos)
      << show.out;
}

// --- A client that never reads -------------------------------------------------------------------

TEST_F(AdversarialProtocolTest, ClientThatNeverReadsIsPushedBackNotBuffered) {
  const pid_t pid = server_pid();
  ASSERT_GT(pid, 0);
  RawStream s(channel(), /*read=*/false);
  ASSERT_TRUE(s.hello(make_hello("deaf")));
  // Each is refused with a Reject quoting 256 bytes of its run_id: ~0.4 KB queued per report.
  v1::StepReport bad = make_report("deaf", 0, 1, 0, 0);
  bad.set_run_id(std::string(300, 'x'));
  v1::AgentMessage m;
  const std::int64_t before = resident_bytes(pid);
  constexpr int kReports = 200000;
  int sent = 0;
  for (; sent < kReports; ++sent) {
    bad.set_seq(static_cast<std::uint64_t>(sent) + 1);
    *m.mutable_report() = bad;
    if (!s.send_bytes(m.SerializeAsString(), 2s)) break;  // the server stopped reading
  }
  const std::int64_t after = resident_bytes(pid);
  RecordProperty("reports_sent", sent);
  RecordProperty("server_rss_before", std::to_string(before));
  RecordProperty("server_rss_after", std::to_string(after));
  EXPECT_LT(sent, kReports) << "the server read everything a client that never reads sent";
  // Under ASan freed memory waits in a quarantine of up to 256 MB: RSS says nothing there.
  if (kAddressSanitizer) return;
  EXPECT_LT(after - before, std::int64_t{48} << 20)
      << "server RSS grew from " << before << " to " << after << " bytes after " << sent
      << " reports";
}

}  // namespace
}  // namespace ampscope::testing
