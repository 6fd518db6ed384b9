// A store with known reports for the web UI's series and JSON API tests, written through
// StoreWriter. Run "web" (two ranks, steps 0..9, rank 1 without step 9):
// - loss: rank 0 10 - step, rank 1 11 - step, NaN at step 6 on rank 1; val_loss 7.5 at step 4
//   and 6.5 at step 9 (rank 0); step_time_s 0.125 (rank 0) and 0.375 (rank 1);
//   tensor_core_active_ratio 0.5 on rank 0, absent on rank 1.
// - loss_scale 65536 for steps 0..5, 32768 for 6..7, 24576 (not a power of two) for 8..9;
//   step 5 found_inf and skipped on both ranks (scale_after 32768; first offender
//   h0.mlp.fc.weight), step 6 found_inf and skipped on rank 1 only (first offender
//   h1.attn.out).
// - tensors of every report: h0.mlp.fc.weight (weight_grad, backward, FP16 target: 60 checked,
//   2 underflow, 5 subnormal; FULL on even steps, COUNTS on odd ones; histogram min exponent
//   kScaledMinExponent at the report's scale), h1.attn.out (activation_grad, COUNTS, FP16: 100
//   checked, 10 underflow, 1 overflow; 4 +Inf at step 5 on rank 0), h0.ln.weight (weight,
//   BF16 target: 50 checked; 2 NaN at step 3 on rank 0); and at step 0 on rank 0
//   h0.mlp.fc.weight after unscaling (FULL, FP32 target, 6 checked, scale 1).
// - the report of step 9 carries the flight recorder's FULL sample of h0.mlp.fc.weight at
//   step 7 (scale 32768, histogram {1, 2, 3}).
// - one policy decision (loss scale 32768 from step 6) applied by both ranks; tensor totals.
#pragma once

#include <chrono>
#include <string>

#include "server_harness.h"
#include "store.h"

namespace ampscope::server::webui_fixture {

inline constexpr std::int64_t kSecond = 1'000'000'000;
inline constexpr int kScaledMinExponent = -4;
inline constexpr std::int64_t kSteps = 10;

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline double scale_at(std::int64_t step) {
  return step <= 5 ? 65536.0 : step <= 7 ? 32768.0 : 24576.0;
}

inline v1::TensorStats fc_weight(double scale, bool full) {
  v1::TensorStats t = testing::crafted_tensor("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD,
                                              kScaledMinExponent, {10, 20, 30}, scale, 0, 0,
                                              /*underflow=*/2, /*overflow=*/0);
  t.mutable_targets(0)->set_subnormal(5);
  t.set_order(3);
  if (!full) {
    t.set_level(v1::STATS_LEVEL_COUNTS);
    t.clear_histogram();
  }
  return t;
}

inline v1::StepReport web_report(std::uint32_t rank, std::int64_t step) {
  v1::StepReport r;
  r.set_run_id("web");
  r.set_rank(rank);
  r.set_seq(static_cast<std::uint64_t>(step + 1));
  r.set_step(step);
  r.set_loss(rank == 1 && step == 6 ? std::nan("") : (rank == 0 ? 10.0 : 11.0) - step);
  const double scale = scale_at(step);
  r.set_loss_scale(scale);
  r.set_scale_after(step == 5 ? 32768.0 : step == 7 ? 24576.0 : scale);
  const bool skipped = step == 5 || (step == 6 && rank == 1);
  r.set_found_inf(skipped);
  r.set_skipped(skipped);
  r.set_step_time_s(rank == 0 ? 0.125 : 0.375);
  if (rank == 0) r.set_tensor_core_active_ratio(0.5);
  if (rank == 0 && step == 4) r.set_val_loss(7.5);
  if (rank == 0 && step == 9) r.set_val_loss(6.5);
  *r.add_tensors() = fc_weight(scale, step % 2 == 0);
  v1::TensorStats attn =
      testing::crafted_tensor("h1.attn.out", v1::TENSOR_ROLE_ACTIVATION_GRAD, -10, {100}, scale, 0,
                              rank == 0 && step == 5 ? 4 : 0,
                              /*underflow=*/10, /*overflow=*/1);
  attn.set_level(v1::STATS_LEVEL_COUNTS);
  attn.clear_histogram();
  *r.add_tensors() = attn;
  v1::TensorStats ln = testing::crafted_tensor("h0.ln.weight", v1::TENSOR_ROLE_WEIGHT, -2, {50},
                                               1.0, rank == 0 && step == 3 ? 2 : 0);
  ln.set_phase(v1::TENSOR_PHASE_STEP_START);
  ln.mutable_targets(0)->set_format(v1::FORMAT_BF16);
  *r.add_tensors() = ln;
  if (rank == 0 && step == 0) {
    v1::TensorStats unscaled = testing::crafted_tensor(
        "h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD, -20, {1, 1, 1, 1, 1, 1}, 1.0);
    unscaled.set_phase(v1::TENSOR_PHASE_AFTER_UNSCALE);
    unscaled.mutable_targets(0)->set_format(v1::FORMAT_FP32);
    *r.add_tensors() = unscaled;
  }
  if (step == 5 || (step == 6 && rank == 1)) {
    v1::FirstOffender* f = r.mutable_first_offender();
    f->set_tensor(step == 5 ? "h0.mlp.fc.weight" : "h1.attn.out");
    f->set_role(step == 5 ? v1::TENSOR_ROLE_WEIGHT_GRAD : v1::TENSOR_ROLE_ACTIVATION_GRAD);
    f->set_phase(v1::TENSOR_PHASE_BACKWARD);
    f->set_order(3);
  }
  if (rank == 0 && step == 9) {
    v1::HistoryStep* h = r.add_history();
    h->set_step(7);
    *h->add_tensors() = testing::crafted_tensor("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD,
                                                kScaledMinExponent, {1, 2, 3}, 32768.0);
  }
  return r;
}

// Writes run "web" (received `age_ns` before now, its run last seen then too).
inline void write_web_run(StoreWriter& w, std::int64_t age_ns = 60 * kSecond) {
  const std::int64_t at = now_ns() - age_ns;
  w.begin();
  for (std::uint32_t rank : {0u, 1u}) {
    const v1::Hello hello = testing::make_hello("web", rank, 2);
    w.upsert_run(hello, at);
    w.upsert_agent(hello, at);
  }
  for (std::int64_t step = 0; step < kSteps; ++step) {
    for (std::uint32_t rank : {0u, 1u}) {
      if (rank == 1 && step == kSteps - 1) continue;
      const v1::StepReport r = web_report(rank, step);
      w.insert_report(r, r.SerializeAsString(), at);
    }
  }
  v1::PolicyUpdate u;
  u.set_run_id("web");
  u.set_effective_from_step(6);
  u.set_mode(v1::POLICY_MODE_HEADROOM);
  u.set_loss_scale(32768.0);
  u.set_bf16_gemms_set(true);
  u.add_bf16_gemms("h1.mlp.fc");
  u.set_amax_history_length(8);
  u.set_reason("headroom: test");
  u.set_decided_unix_ns(at);
  const std::int64_t id = w.insert_decision("web", 1, u);
  u.set_policy_id(std::to_string(id));
  w.set_decision_update(id, u);
  w.upsert_application(id, 0, 6, true, "");
  w.upsert_application(id, 1, 6, true, "");
  w.save_policy_state("web", "headroom", "{}", 0, 0, at);
  // Totals as the ingest thread would have added them (ranked for the "tensors" list).
  TensorTotals ln{
      "web", "h0.ln.weight", v1::TENSOR_ROLE_WEIGHT, v1::FORMAT_BF16, 19, 950, 0, 0, 2, 1.5, 9};
  TensorTotals attn{"web",
                    "h1.attn.out",
                    v1::TENSOR_ROLE_ACTIVATION_GRAD,
                    v1::FORMAT_FP16,
                    19,
                    1900,
                    19,
                    190,
                    4,
                    0.1,
                    9};
  TensorTotals fc{"web",
                  "h0.mlp.fc.weight",
                  v1::TENSOR_ROLE_WEIGHT_GRAD,
                  v1::FORMAT_FP16,
                  19,
                  1140,
                  0,
                  38,
                  0,
                  0.01,
                  9};
  for (const TensorTotals& t : {ln, attn, fc}) w.add_tensor_totals(t);
  w.commit();
}

}  // namespace ampscope::server::webui_fixture
