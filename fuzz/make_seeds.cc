// Writes the seed corpora of the fuzz targets (fuzz/make_seeds.sh runs it; .npy seeds come from
// NumPy there): valid streams built with the server tests' builders, policy updates as the
// server sends them, a checkpoint from the trainer's own writer, segments from the agent's own
// spool, and option strings. Usage: ampscope_fuzz_seeds CORPUS_DIR
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/recipe.h"
#include "checkpoint_fixture.h"
#include "server_harness.h"
#include "spool.h"
#include "support.h"

namespace ampscope::fuzz {
namespace {

namespace fs = std::filesystem;
using testing::crafted_tensor;
using testing::make_hello;
using testing::make_report;

void seed(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  write_file(dir / name, bytes.data(), bytes.size());
  std::printf("%s (%zu bytes)\n", (dir / name).c_str(), bytes.size());
}

v1::AgentMessage hello_message(const v1::Hello& h) {
  v1::AgentMessage m;
  *m.mutable_hello() = h;
  return m;
}
v1::AgentMessage report_message(const v1::StepReport& r) {
  v1::AgentMessage m;
  *m.mutable_report() = r;
  return m;
}

// A step whose gradients overflowed FP16: NaN and +Inf in one tensor, the scaler backed off.
v1::StepReport overflow_report(const std::string& run, std::uint64_t seq) {
  v1::StepReport r = make_report(run, 0, seq, static_cast<std::int64_t>(seq), 0);
  r.set_found_inf(true);
  r.set_skipped(true);
  r.set_scale_after(r.loss_scale() / 2);
  r.set_grad_norm(std::numeric_limits<double>::infinity());
  *r.add_tensors() = crafted_tensor("h0.attn.scores.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD, 10,
                                    {4, 8, 16, 2}, r.loss_scale(), 1, 2, 0, 3);
  *r.add_tensors() = crafted_tensor("h0.mlp.fc.weight.grad", v1::TENSOR_ROLE_WEIGHT_GRAD, -30,
                                    {1, 5, 9}, r.loss_scale(), 0, 0, 4, 0);
  v1::FirstOffender* f = r.mutable_first_offender();
  f->set_tensor("h0.attn.scores.grad");
  f->set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);
  f->set_phase(v1::TENSOR_PHASE_BACKWARD);
  v1::PolicyOutcome* o = r.add_policy_outcomes();
  o->set_policy_id("1");
  o->set_applied(true);
  r.add_notices("cupti: unavailable: no CUDA device");
  r.add_fp32_layers("h0.attn.core");
  r.set_val_loss(2.75);
  return r;
}

void stream_seeds(const fs::path& corpus) {
  const std::string run = "seed-run";
  v1::Hello hello = make_hello(run);
  hello.add_fp32_capable_layers("h0.attn.core");
  hello.add_fp32_capable_layers("h0.mlp.fc");
  std::vector<std::pair<std::string, std::vector<v1::AgentMessage>>> streams;
  streams.push_back({"hello", {hello_message(hello)}});
  std::vector<v1::AgentMessage> clean = {hello_message(hello)};
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    clean.push_back(report_message(make_report(run, 0, seq, static_cast<std::int64_t>(seq))));
  }
  streams.push_back({"clean-3", clean});
  std::vector<v1::AgentMessage> overflow = {hello_message(hello)};
  for (std::uint64_t seq = 1; seq <= 12; ++seq) {
    overflow.push_back(report_message(seq % 4 == 0 ? overflow_report(run, seq)
                                                   : make_report(run, 0, seq,
                                                                 static_cast<std::int64_t>(seq), 2)));
  }
  streams.push_back({"overflow-12", overflow});
  // Reports the rules refuse: seq 0, another run, a step going backwards, and then a good one.
  std::vector<v1::AgentMessage> rejects = {hello_message(hello)};
  rejects.push_back(report_message(make_report(run, 0, 0, 0, 1)));
  rejects.push_back(report_message(make_report("other-run", 0, 1, 1, 1)));
  v1::StepReport bad_scale = make_report(run, 0, 2, 2, 1);
  bad_scale.set_loss_scale(-1.0);
  rejects.push_back(report_message(bad_scale));
  rejects.push_back(report_message(make_report(run, 0, 3, 3, 1)));
  streams.push_back({"rejects", rejects});
  // Names as PyTorch writes them (UTF-8), and parts refused alone: a tensor whose counts exceed
  // its numel, a first offender, a notice and layer names with control characters; the steps are
  // stored.
  const std::string unicode = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";
  std::vector<v1::AgentMessage> parts = {hello_message(hello)};
  v1::StepReport named = make_report(run, 0, 1, 1, 2);
  named.mutable_tensors(0)->set_name(unicode);
  named.add_notices("trainer: " + unicode);
  parts.push_back(report_message(named));
  v1::StepReport partial = make_report(run, 0, 2, 2, 3);
  partial.mutable_tensors(1)->set_zeros(partial.tensors(1).numel() + 1);
  partial.mutable_first_offender()->set_tensor("h0\x1b[2J");
  partial.add_notices("two\nlines");
  partial.add_fp32_layers("h0\x1b[2J");
  partial.add_bf16_gemms("h0.mlp\nfc");
  parts.push_back(report_message(partial));
  streams.push_back({"unicode-and-parts", parts});
  // FP8/FP4 quantisers as the agent writes them (an MX block recipe with its scale histogram, a
  // delayed recipe with its amax history), then one the rules refuse alone (more underflow than
  // values): the steps are stored either way.
  std::vector<float> x(4 * 64);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8.0f, static_cast<int>(i % 19) - 12);
  }
  const RecipeCounts mx = fake_quantize(x.data(), nullptr, 4, 64, *parse_recipe("mxfp8_e4m3"));
  Recipe delayed = *parse_recipe("e4m3:scale=112");
  const RecipeCounts dl = fake_quantize(x.data(), nullptr, 4, 64, delayed);
  const float history[] = {3.5f, 4.0f, 2.25f};
  std::vector<v1::AgentMessage> quantized = {hello_message(hello)};
  v1::StepReport q1 = make_report(run, 0, 1, 1, 2);
  v1::QuantizerStats* a = q1.add_quantizers();
  a->set_name("h0.mlp.fc.input");
  a->set_role(v1::TENSOR_ROLE_ACTIVATION);
  a->set_phase(v1::TENSOR_PHASE_FORWARD);
  proto::encode_quantizer(mx, {}, a);
  v1::QuantizerStats* b = q1.add_quantizers();
  b->set_name("h0.mlp.fc.weight");
  b->set_role(v1::TENSOR_ROLE_WEIGHT);
  b->set_phase(v1::TENSOR_PHASE_FORWARD);
  proto::encode_quantizer(dl, history, b);
  quantized.push_back(report_message(q1));
  v1::StepReport q2 = make_report(run, 0, 2, 2, 2);
  *q2.add_quantizers() = *a;
  q2.mutable_quantizers(0)->set_underflow(mx.values + 1);
  quantized.push_back(report_message(q2));
  streams.push_back({"quantizers", quantized});
  // Two ranks of a sharded run, rank 1's stream.
  v1::Hello rank1 = make_hello(run, 1, 2);
  rank1.set_gradients_sharded(true);
  rank1.set_policy_agreement(v1::POLICY_AGREEMENT_PER_STEP);
  streams.push_back({"rank1-of-2", {hello_message(rank1),
                                     report_message(make_report(run, 1, 1, 1, 2))}});
  for (const auto& [name, messages] : streams) {
    seed(corpus / "validation_fuzz", name, serialize_stream(messages));
    seed(corpus / "ingest_fuzz", name, serialize_stream(messages));
  }
}

void policy_update_seeds(const fs::path& corpus) {
  const auto write = [&](const std::string& name, const std::vector<v1::PolicyUpdate>& updates) {
    std::string out;
    google::protobuf::io::StringOutputStream output(&out);
    for (const v1::PolicyUpdate& u : updates) {
      google::protobuf::util::SerializeDelimitedToZeroCopyStream(u, &output);
    }
    seed(corpus / "policy_update_fuzz", name, out);
  };
  v1::PolicyUpdate scale;
  scale.set_policy_id("1");
  scale.set_run_id("fuzz-run");
  scale.set_effective_from_step(12);
  scale.set_mode(v1::POLICY_MODE_HEADROOM);
  scale.set_loss_scale(4096.0);
  scale.set_min_scale(1.0);
  scale.set_max_scale(65536.0);
  scale.set_reason("headroom: max unscaled grad 2^-3");
  scale.set_decided_at_step(10);
  scale.set_seq(1);
  v1::PolicyUpdate params;
  params.set_policy_id("2");
  params.set_run_id("fuzz-run");
  params.set_effective_from_step(20);
  params.set_mode(v1::POLICY_MODE_STATIC_PARAMS);
  params.set_growth_interval(500);
  params.set_growth_factor(2.0);
  params.set_backoff_factor(0.5);
  params.set_hysteresis(2);
  params.set_seq(2);
  v1::PolicyUpdate fp32;
  fp32.set_policy_id("3");
  fp32.set_run_id("fuzz-run");
  fp32.set_effective_from_step(30);
  fp32.set_mode(v1::POLICY_MODE_HEADROOM);
  fp32.add_fp32_tensors("h0.attn.scores");
  fp32.add_fp32_tensors("h1.mlp.fc");
  fp32.set_fp32_tensors_set(true);
  fp32.set_seq(3);
  v1::PolicyUpdate gemms;
  gemms.set_policy_id("5");
  gemms.set_run_id("fuzz-run");
  gemms.set_effective_from_step(40);
  gemms.add_bf16_gemms("h0.mlp.fc");
  gemms.add_bf16_gemms("h1.mlp.proj");
  gemms.set_bf16_gemms_set(true);
  gemms.set_amax_history_length(32);
  gemms.set_amax_margin(2);
  gemms.set_seq(5);
  v1::PolicyUpdate refused = scale;
  refused.set_policy_id("4");
  refused.set_loss_scale(3000.0);  // not a power of two
  refused.set_seq(4);
  write("scale", {scale});
  write("params", {params});
  write("fp32", {fp32});
  write("gemms", {gemms});
  write("sequence", {scale, params, fp32, refused, scale});
}

void checkpoint_seeds(const fs::path& corpus) {
  const fs::path dir = corpus / "checkpoint_fuzz";
  fs::create_directories(dir);
  auto t = make_checkpoint_trainer();
  t->save_checkpoint((dir / "step0").string());
  t->step();
  t->step();
  t->fp32_overrides().add("h0.attn.core", 2);
  t->save_checkpoint((dir / "step2").string());
}

void spool_seeds(const fs::path& corpus) {
  const fs::path dir = scratch_dir() / "spool";
  std::string error;
  std::vector<std::string> notices;
  auto spool = agent::Spool::open(agent::SpoolOptions{.dir = dir.string()}, &error, &notices);
  if (!spool) throw std::runtime_error(error);
  for (std::int64_t step = 0; step < 3; ++step) {
    const v1::StepReport r = make_report("seed-run", 0, static_cast<std::uint64_t>(step + 1),
                                         step, 1);
    if (spool->append(r.SerializeAsString(), step, &error) == 0) throw std::runtime_error(error);
  }
  spool.reset();
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.path().filename().string().starts_with("seg-")) continue;
    const std::string bytes = read_file(e.path());
    seed(corpus / "spool_fuzz", "three-records", bytes);
    // Cut in the middle of the last record, as kill -9 during a write leaves it.
    seed(corpus / "spool_fuzz", "torn-tail", bytes.substr(0, bytes.size() - 7));
  }
}

void config_seeds(const fs::path& corpus) {
  const fs::path dir = corpus / "agent_config_fuzz";
  seed(dir, "trainer", "server=127.0.0.1:50051\nrun_id=demo-1\nrank=0\nworld_size=1\n"
                       "spool_dir=/tmp/ampscope-spool\nsample_full_every=50\n");
  seed(dir, "sizes", "spool_max_bytes=512M\nspool_segment_bytes=4K\nworker_max_bytes=1G\n"
                     "queue_steps=256\nmax_batch=64\nmax_in_flight=256\n");
  seed(dir, "timing", "backoff_initial_ms=200\nbackoff_max_ms=5000\nconnect_timeout_ms=2000\n"
                      "keepalive_time_ms=30000\nkeepalive_timeout_ms=10000\n"
                      "flush_timeout_ms=10000\npolicy_fallback_after_ms=60000\n"
                      "policy_receive_delay_ms=0\npolicy_lockstep=on\n"
                      "policy_lockstep_timeout_ms=10000\n");
  seed(dir, "ranks", "world-size=8\nrank=7\ndata_parallel_size=4\ngradients_sharded=yes\n"
                     "policy_agreement=per_step\n");
  seed(dir, "sampling", "sample_counts=1\nsample_count_roles=activation_grad, weight_grad,loss\n"
                        "sample_full_roles=all\nsample_full_on_nonfinite=off\n"
                        "sample_full_on_scale_change=true\nsample_max_tensors=4096\n"
                        "cupti_every=0\nstats_thread=worker\nnvtx=false\n");
  seed(dir, "full-ranks", "world_size=128\nrank=9\nlocal_rank=1\nsample_full_ranks=node\n"
                          "sample_full_ranks=every:8\nsample_full_ranks=16, 0,8\n"
                          "local_rank=auto\nsample_full_ranks=every:0\n");
  seed(dir, "refused", "rank=-1\nworld_size=0\nsample_count_roles=weights\nunknown=1\n"
                       "max_batch=4097\nspool_max_bytes=1T\n");
}

}  // namespace
}  // namespace ampscope::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ampscope_fuzz_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::filesystem::path corpus(argv[1]);
  try {
    ampscope::fuzz::stream_seeds(corpus);
    ampscope::fuzz::policy_update_seeds(corpus);
    ampscope::fuzz::checkpoint_seeds(corpus);
    ampscope::fuzz::spool_seeds(corpus);
    ampscope::fuzz::config_seeds(corpus);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampscope_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
