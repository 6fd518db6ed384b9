/* The agent's C API exercised from C: configuration, a scaler control with callbacks, steps
 * with tensors (one holding a NaN), counters, notices and error paths. Called by
 * c_api_test_driver.cc; returns 0 on success, otherwise the number of the failed check (and a
 * message in `why`). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ampscope/agent/c_api.h"

typedef struct scaler_state {
  double scale;
  int scheduled;
} scaler_state;

static int schedule(void* user, const ampscope_scaler_change* change, char* reason,
                    size_t reason_size) {
  scaler_state* s = (scaler_state*)user;
  if (change->has_scale && change->scale > 1e9) {
    snprintf(reason, reason_size, "scale %g is too large for this trainer", change->scale);
    return 1;
  }
  if (change->has_scale) s->scale = change->scale;
  s->scheduled++;
  return 0;
}

static double current_scale(void* user) { return ((scaler_state*)user)->scale; }

#define CHECK(n, cond, msg)                     \
  do {                                          \
    if (!(cond)) {                              \
      snprintf(why, why_size, "%s", msg);       \
      return n;                                 \
    }                                           \
  } while (0)

int run_c_api_test(const char* spool_dir, char* why, size_t why_size) {
  ampscope_agent_config* cfg = NULL;
  CHECK(1, ampscope_agent_config_create(&cfg) == AMPSCOPE_OK, "config_create");
  CHECK(2, ampscope_agent_config_set(cfg, "run_id", "c-api") == AMPSCOPE_OK, "set run_id");
  CHECK(3, ampscope_agent_config_set(cfg, "spool_dir", spool_dir) == AMPSCOPE_OK, "set spool_dir");
  CHECK(4, ampscope_agent_config_set(cfg, "sample_full_every", "0") == AMPSCOPE_OK, "set full");
  CHECK(5, ampscope_agent_config_set(cfg, "flush_timeout_ms", "0") == AMPSCOPE_OK, "set flush");
  CHECK(6, ampscope_agent_config_set(cfg, "sample_full_every", "often") == AMPSCOPE_INVALID_ARGUMENT,
        "a bad value is refused");
  CHECK(7, strstr(ampscope_agent_config_last_error(cfg), "sample_full_every") != NULL,
        "the error names the key");
  CHECK(8, ampscope_agent_config_set(cfg, NULL, "x") == AMPSCOPE_INVALID_ARGUMENT, "NULL key");

  ampscope_run_info run;
  memset(&run, 0, sizeof(run));
  run.trainer = "c_api_test";
  run.precision = "amp-fp16";
  run.compute_format = AMPSCOPE_FORMAT_FP16;
  run.loss_scale = 1024;
  run.dynamic = 1;
  ampscope_agent* agent = NULL;
  CHECK(9, ampscope_agent_create(NULL, &run, &agent) == AMPSCOPE_INVALID_ARGUMENT, "NULL config");
  CHECK(10, ampscope_agent_create(cfg, &run, &agent) == AMPSCOPE_OK,
        ampscope_agent_config_last_error(cfg));
  ampscope_agent_config_destroy(cfg);

  scaler_state scaler = {1024.0, 0};
  ampscope_scaler_ops ops;
  memset(&ops, 0, sizeof(ops));
  ops.schedule = schedule;
  ops.scale = current_scale;
  CHECK(11, ampscope_agent_attach_scaler(agent, &ops, &scaler) == AMPSCOPE_OK, "attach scaler");

  float grad[64];
  for (int i = 0; i < 64; ++i) grad[i] = 0.001f * (float)(i + 1);
  int64_t shape[2] = {8, 8};
  for (int step = 0; step < 3; ++step) {
    if (step == 1) grad[5] = NAN;
    if (step == 2) grad[5] = 0.5f;
    CHECK(12, ampscope_agent_begin_step(agent, step) == 1, "begin_step wants tensors");
    ampscope_tensor_view v;
    memset(&v, 0, sizeof(v));
    v.name = "fc.weight.grad";
    v.role = AMPSCOPE_ROLE_WEIGHT_GRAD;
    v.phase = AMPSCOPE_PHASE_BACKWARD;
    v.dtype = AMPSCOPE_FORMAT_FP32;
    v.data = grad;
    v.shape = shape;
    v.rank = 2;
    v.scale = 1024.0;
    CHECK(13, ampscope_agent_observe(agent, &v) == AMPSCOPE_OK, "observe");
    v.dtype = (ampscope_format)42;
    CHECK(14, ampscope_agent_observe(agent, &v) == AMPSCOPE_INVALID_ARGUMENT, "bad dtype");
    CHECK(15, ampscope_agent_mark_phase(agent, AMPSCOPE_STEP_PHASE_OPTIMIZER) == AMPSCOPE_OK,
          "mark_phase");
    ampscope_step_info info;
    memset(&info, 0, sizeof(info));
    info.step = step;
    info.loss = 2.5;
    info.loss_scale = 1024.0;
    info.scale_after = step == 1 ? 512.0 : 1024.0;
    info.found_inf = step == 1;
    info.skipped = step == 1;
    info.grad_norm = step == 1 ? NAN : 0.1;
    CHECK(16, ampscope_agent_end_step(agent, &info) == AMPSCOPE_OK, "end_step");
  }
  CHECK(17, ampscope_agent_end_step(agent, NULL) == AMPSCOPE_INVALID_ARGUMENT, "NULL info");
  CHECK(18, strstr(ampscope_agent_last_error(agent), "info") != NULL, "last_error says why");
  CHECK(19, ampscope_agent_flush(agent, 5000) == AMPSCOPE_OK, "flush without a server");

  ampscope_agent_counters counters;
  CHECK(20, ampscope_agent_get_counters(agent, &counters) == AMPSCOPE_OK, "counters");
  CHECK(21, counters.steps == 3 && counters.reports_spooled == 3, "three reports spooled");
  CHECK(22, counters.dropped_reports == 0, "nothing dropped");
  CHECK(23, ampscope_agent_notice_count(agent) >= 1, "at least the transport notice");
  CHECK(24, ampscope_agent_notice(agent, 0) != NULL, "notice 0");
  CHECK(25, ampscope_agent_notice(agent, 100000) == NULL, "no such notice");
  CHECK(26, strcmp(ampscope_status_string(AMPSCOPE_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED") == 0,
        "status string");
  CHECK(27, ampscope_agent_version()[0] != '\0', "version");
  CHECK(28, ampscope_agent_destroy(agent, 0) == AMPSCOPE_OK, "destroy");
  CHECK(29, ampscope_agent_destroy(NULL, 0) == AMPSCOPE_OK, "destroy NULL");
  CHECK(30, ampscope_agent_begin_step(NULL, 0) == 0, "NULL agent");
  return 0;
}
