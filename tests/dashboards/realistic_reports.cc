#include "realistic_reports.h"

#include <cmath>

#include "server_harness.h"

namespace ampscope::testing {

v1::TensorStats realistic_tensor(const std::string& name, v1::TensorRole role, int lo, int hi,
                                 double scale, std::uint32_t seed, std::uint64_t nan) {
  v1::TensorStats t = synthetic_tensor(name, role, lo, hi, scale, 256, seed);
  if (nan > 0) {
    t.set_nan(nan);
    t.set_numel(t.numel() + nan);
    t.set_shape(0, static_cast<std::int64_t>(t.numel()));
  }
  return t;
}

v1::StepReport realistic_report(const std::string& run, std::uint64_t seq, double scale,
                                std::int64_t nan_step) {
  const std::int64_t step = static_cast<std::int64_t>(seq) - 1;
  const bool nan = step == nan_step;
  v1::StepReport r = make_report(run, 0, seq, step, 0, scale);
  const auto s = static_cast<std::uint32_t>(seq * 17);
  *r.add_tensors() = realistic_tensor("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT, -8, 0, 1.0, s);
  *r.add_tensors() =
      realistic_tensor("h0.mlp.fc.master", v1::TENSOR_ROLE_MASTER_WEIGHT, -8, 0, 1.0, s + 1);
  *r.add_tensors() =
      realistic_tensor("h0.mlp.fc", v1::TENSOR_ROLE_ACTIVATION, -6, 4, 1.0, s + 2, nan ? 3 : 0);
  *r.add_tensors() = realistic_tensor("h0.mlp.fc.out.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD, -40,
                                      -12, scale, s + 3);
  *r.add_tensors() = realistic_tensor("h0.mlp.fc.weight.grad", v1::TENSOR_ROLE_WEIGHT_GRAD, -42,
                                      -14, scale, s + 4);
  *r.add_tensors() =
      realistic_tensor("adam.m", v1::TENSOR_ROLE_OPTIMIZER_STATE, -20, -8, 1.0, s + 5);
  *r.add_tensors() = realistic_tensor("loss", v1::TENSOR_ROLE_LOSS, 1, 1, 1.0, s + 6);
  if (step % 2 == 0) r.set_tensor_core_active_ratio(0.42);
  if (step % 4 == 3) r.set_val_loss(2.0 - 0.01 * static_cast<double>(step));
  r.mutable_agent()->set_spool_bytes(4096 * seq);
  r.mutable_agent()->set_dropped_reports(0);
  if (nan) {
    r.set_loss(std::nan(""));
    r.set_found_inf(true);
    r.set_skipped(true);
    r.set_grad_norm(std::nan(""));
    r.set_scale_after(scale / 2);
    r.mutable_first_offender()->set_tensor("h0.mlp.fc");
    r.mutable_first_offender()->set_role(v1::TENSOR_ROLE_ACTIVATION);
    r.mutable_first_offender()->set_phase(v1::TENSOR_PHASE_FORWARD);
  }
  return r;
}

}  // namespace ampscope::testing
