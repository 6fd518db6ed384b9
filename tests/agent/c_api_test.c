/* A C trainer of its own: the agent's C API exercised from C through libampscope_agent.so, in a
 * process that links nothing else of ampscope. c_api_test_driver.cc runs it and checks what
 * reached the spool, the server or a recording stand-in for the server.
 *
 *   agent_c_api_program rules                       the loss-scale rules (no agent)
 *   agent_c_api_program exercise SPOOL_DIR          configuration, a scaler, three steps (one
 *                                                   with a NaN), held, FP32 layers, errors
 *   agent_c_api_program old-layouts SPOOL_DIR ADDR  a caller compiled against the first layouts
 *   agent_c_api_program hello SPOOL_DIR ADDR        the scaler and capable layers of the Hello
 *   agent_c_api_program overrides SPOOL_DIR ADDR    the server's FP32 fallback (and static
 *                                                   scaler parameters) reach the callbacks
 *   agent_c_api_program fused SPOOL_DIR             fused statistics: an unscale through
 *                                                   ampscope_scale_and_compute_stats handed
 *                                                   over with ampscope_agent_observe_stats
 *   agent_c_api_program quantizers SPOOL_DIR        quantisers counted by the agent and by
 *                                                   ampscope_count_recipe, refusals, BF16
 *                                                   GEMMs in the step info (and its ABI 2 size)
 *   agent_c_api_program gemm-precision SPOOL_DIR ADDR DELAYED
 *                                                   a PolicyUpdate's BF16 GEMMs and delayed
 *                                                   recipe settings reach the callbacks (the
 *                                                   run's recipe delayed when DELAYED is 1)
 *
 * Exit status: 0 when every check passed, otherwise the number of the failed check (with a
 * line on stderr). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampscope/agent/c_api.h"

#define CHECK(n, cond, msg)                                                                \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "check %d failed: %s (line %d)\n", n, msg, __LINE__);               \
      return n;                                                                            \
    }                                                                                      \
  } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Callbacks */

typedef struct scaler_state {
  double scale;
  int scheduled;
} scaler_state;

static int schedule(void* user, const ampscope_scaler_change* change, char* reason,
                    size_t reason_size) {
  scaler_state* s = (scaler_state*)user;
  if (!AMPSCOPE_STRUCT_HAS(ampscope_scaler_change, change, max_scale)) {
    snprintf(reason, reason_size, "the change is smaller than this trainer's header");
    return 1;
  }
  if (change->has_scale && change->scale > 1e9) {
    snprintf(reason, reason_size, "scale %g is too large for this trainer", change->scale);
    return 1;
  }
  if (change->has_scale) s->scale = change->scale;
  s->scheduled++;
  return 0;
}

static double current_scale(void* user) { return ((scaler_state*)user)->scale; }

typedef struct overrides_state {
  const char* capable[2];
  char fp32[4][64]; /* the FP32 set */
  size_t num_fp32;
  int64_t from_step;
  int replaced;
} overrides_state;

static size_t capable_layers(void* user, const char** names, size_t capacity) {
  overrides_state* s = (overrides_state*)user;
  for (size_t i = 0; i < 2 && i < capacity; ++i) names[i] = s->capable[i];
  return 2;
}

static int replace(void* user, const char* const* layers, size_t num_layers, int64_t from_step,
                   char* reason, size_t reason_size) {
  overrides_state* s = (overrides_state*)user;
  if (num_layers > 4) {
    snprintf(reason, reason_size, "at most 4 FP32 layers, asked for %zu", num_layers);
    return 1;
  }
  for (size_t i = 0; i < num_layers; ++i) snprintf(s->fp32[i], sizeof(s->fp32[i]), "%s", layers[i]);
  s->num_fp32 = num_layers;
  s->from_step = from_step;
  s->replaced++;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */

static int configure(ampscope_agent_config** cfg, const char* run_id, const char* spool_dir,
                     const char* server) {
  CHECK(101, ampscope_agent_config_create(cfg) == AMPSCOPE_OK, "config_create");
  CHECK(102, ampscope_agent_config_set(*cfg, "run_id", run_id) == AMPSCOPE_OK, "set run_id");
  CHECK(103, ampscope_agent_config_set(*cfg, "spool_dir", spool_dir) == AMPSCOPE_OK,
        "set spool_dir");
  CHECK(104, ampscope_agent_config_set(*cfg, "flush_timeout_ms", "0") == AMPSCOPE_OK,
        "set flush_timeout_ms");
  if (server != NULL) {
    CHECK(105, ampscope_agent_config_set(*cfg, "server", server) == AMPSCOPE_OK, "set server");
  }
  return 0;
}

static ampscope_run_info fp16_run(ampscope_scaler_kind kind) {
  ampscope_run_info run = AMPSCOPE_RUN_INFO_INIT;
  run.trainer = "c_api_test";
  run.precision = "amp-fp16";
  run.compute_format = AMPSCOPE_FORMAT_FP16;
  run.scaler_kind = kind;
  return run;
}

/* An agent of `run`, sending to `server`, with a scaler (`scaler`) and the FP32 overrides of
 * "fc" and "lm_head" (`overrides`) attached. */
static int start_agent(const char* run_id, const char* spool_dir, const char* server,
                       const ampscope_run_info* run, scaler_state* scaler,
                       overrides_state* overrides, ampscope_agent** agent) {
  ampscope_agent_config* cfg = NULL;
  int failed = configure(&cfg, run_id, spool_dir, server);
  if (failed != 0) return failed;
  CHECK(111, ampscope_agent_create(cfg, run, agent) == AMPSCOPE_OK,
        ampscope_agent_config_last_error(cfg));
  ampscope_agent_config_destroy(cfg);
  ampscope_scaler_ops ops = AMPSCOPE_SCALER_OPS_INIT; /* bounds 0: the run info's */
  ops.schedule = schedule;
  ops.scale = current_scale;
  CHECK(112, ampscope_agent_attach_scaler(*agent, &ops, scaler) == AMPSCOPE_OK,
        ampscope_agent_last_error(*agent));
  memset(overrides, 0, sizeof(*overrides));
  overrides->capable[0] = "fc";
  overrides->capable[1] = "lm_head";
  overrides->from_step = -1;
  ampscope_overrides_ops oops = AMPSCOPE_OVERRIDES_OPS_INIT;
  oops.capable_layers = capable_layers;
  CHECK(113, ampscope_agent_attach_overrides(*agent, &oops, overrides) ==
                 AMPSCOPE_INVALID_ARGUMENT,
        "replace is required");
  oops.replace = replace;
  CHECK(114, ampscope_agent_attach_overrides(*agent, &oops, overrides) == AMPSCOPE_OK,
        ampscope_agent_last_error(*agent));
  return 0;
}

static int exercise(const char* spool_dir) {
  ampscope_agent_config* cfg = NULL;
  int failed = configure(&cfg, "c-api", spool_dir, NULL);
  if (failed != 0) return failed;
  CHECK(1, ampscope_agent_abi_version() == AMPSCOPE_AGENT_ABI_VERSION, "abi version");
  CHECK(2, ampscope_agent_config_set(cfg, "sample_full_every", "0") == AMPSCOPE_OK, "set full");
  CHECK(3, ampscope_agent_config_set(cfg, "sample_full_every", "often") ==
               AMPSCOPE_INVALID_ARGUMENT,
        "a bad value is refused");
  CHECK(4, strstr(ampscope_agent_config_last_error(cfg), "sample_full_every") != NULL,
        "the error names the key");
  CHECK(5, ampscope_agent_config_set(cfg, NULL, "x") == AMPSCOPE_INVALID_ARGUMENT, "NULL key");
  CHECK(36, ampscope_agent_config_set(cfg, "sample_full_ranks", "every:8") == AMPSCOPE_OK,
        "set the ranks that send full statistics");
  CHECK(37, ampscope_agent_config_set(cfg, "sample_full_ranks", "every:0") ==
                    AMPSCOPE_INVALID_ARGUMENT &&
                strstr(ampscope_agent_config_last_error(cfg), "sample_full_ranks") != NULL,
        "a bad sample_full_ranks is refused, named");

  ampscope_run_info run = fp16_run(AMPSCOPE_SCALER_DYNAMIC);
  run.loss_scale = 1024;
  ampscope_agent* agent = NULL;
  CHECK(6, ampscope_agent_create(NULL, &run, &agent) == AMPSCOPE_INVALID_ARGUMENT, "NULL config");
  run.scaler_kind = (ampscope_scaler_kind)7;
  CHECK(7, ampscope_agent_create(cfg, &run, &agent) == AMPSCOPE_INVALID_ARGUMENT && agent == NULL,
        "unknown scaler kind");
  CHECK(8, strstr(ampscope_agent_config_last_error(cfg), "scaler_kind") != NULL,
        "the error names scaler_kind");
  run.scaler_kind = AMPSCOPE_SCALER_DYNAMIC;
  CHECK(9, ampscope_agent_create(cfg, &run, &agent) == AMPSCOPE_OK,
        ampscope_agent_config_last_error(cfg));
  ampscope_agent_config_destroy(cfg);

  scaler_state scaler = {1024.0, 0};
  ampscope_scaler_ops ops = AMPSCOPE_SCALER_OPS_INIT;
  ops.schedule = schedule;
  ops.scale = current_scale;
  CHECK(10, ampscope_agent_attach_scaler(agent, &ops, &scaler) == AMPSCOPE_OK, "attach scaler");
  CHECK(10, ampscope_agent_wanted(agent, AMPSCOPE_ROLE_LOSS, AMPSCOPE_PHASE_FORWARD) == 0,
        "nothing is wanted outside a step");
  CHECK(10, ampscope_agent_add_notice(agent, "c trainer: hello from C") == AMPSCOPE_OK,
        "add_notice");
  CHECK(10, ampscope_agent_add_notice(agent, "") == AMPSCOPE_INVALID_ARGUMENT, "empty notice");
  CHECK(10, ampscope_agent_add_notice(agent, NULL) == AMPSCOPE_INVALID_ARGUMENT, "NULL notice");
  {
    /* One rank (policy_agreement auto -> single): a vote says nothing received, and agreeing
     * is for per_step ranks only. */
    uint64_t received = 99;
    int fallback = 99;
    CHECK(10, ampscope_agent_policy_vote(agent, &received, &fallback) == AMPSCOPE_OK &&
                  received == 0 && fallback == 0,
          "policy_vote");
    CHECK(10, ampscope_agent_policy_vote(agent, NULL, &fallback) == AMPSCOPE_INVALID_ARGUMENT,
          "policy_vote NULL");
    CHECK(10, ampscope_agent_policy_agreed(agent, 0, 0) == AMPSCOPE_FAILED_PRECONDITION &&
                  strstr(ampscope_agent_last_error(agent), "per_step") != NULL,
          "policy_agreed on one rank");
  }

  float grad[64];
  for (int i = 0; i < 64; ++i) grad[i] = 0.001f * (float)(i + 1);
  int64_t shape[2] = {8, 8};
  const char* fp32_layers[1] = {"fc"};
  for (int step = 0; step < 3; ++step) {
    if (step == 1) grad[5] = NAN;
    if (step == 2) grad[5] = 0.5f;
    CHECK(11, ampscope_agent_begin_step(agent, step) == 1, "begin_step wants tensors");
    /* Counts of gradients every step; weight gradients after unscaling on full steps only (the
     * step after the NaN's). */
    CHECK(11, ampscope_agent_wanted(agent, AMPSCOPE_ROLE_WEIGHT_GRAD, AMPSCOPE_PHASE_BACKWARD) ==
                  (step == 2 ? 2 : 1),
          "wanted: weight gradients");
    CHECK(11, ampscope_agent_wanted(agent, AMPSCOPE_ROLE_WEIGHT_GRAD,
                                    AMPSCOPE_PHASE_AFTER_UNSCALE) == (step == 2 ? 2 : 0),
          "wanted: unscaled weight gradients");
    CHECK(11, ampscope_agent_wanted(agent, 99, AMPSCOPE_PHASE_BACKWARD) == 0, "wanted: bad role");
    ampscope_tensor_view v = AMPSCOPE_TENSOR_VIEW_INIT;
    v.name = "fc.weight.grad";
    v.role = AMPSCOPE_ROLE_WEIGHT_GRAD;
    v.phase = AMPSCOPE_PHASE_BACKWARD;
    v.dtype = AMPSCOPE_FORMAT_FP32;
    v.data = grad;
    v.shape = shape;
    v.rank = 2;
    v.scale = 1024.0;
    v.has_held = 1;
    v.held = AMPSCOPE_FORMAT_FP32;
    CHECK(12, ampscope_agent_observe(agent, &v) == AMPSCOPE_OK, "observe");
    v.dtype = (ampscope_format)42;
    CHECK(13, ampscope_agent_observe(agent, &v) == AMPSCOPE_INVALID_ARGUMENT, "bad dtype");
    v.dtype = AMPSCOPE_FORMAT_FP32;
    v.held = (ampscope_format)42;
    CHECK(14, ampscope_agent_observe(agent, &v) == AMPSCOPE_INVALID_ARGUMENT, "bad held");
    CHECK(15, strstr(ampscope_agent_last_error(agent), "held") != NULL, "the error names held");
    v.held = AMPSCOPE_FORMAT_FP32;
    v.struct_size = 8;
    CHECK(16, ampscope_agent_observe(agent, &v) == AMPSCOPE_INVALID_ARGUMENT, "tiny struct_size");
    CHECK(17, strstr(ampscope_agent_last_error(agent), "view.struct_size is 8") != NULL,
          ampscope_agent_last_error(agent));
    CHECK(18, ampscope_agent_mark_phase(agent, AMPSCOPE_STEP_PHASE_OPTIMIZER) == AMPSCOPE_OK,
          "mark_phase");
    ampscope_step_info info = AMPSCOPE_STEP_INFO_INIT;
    info.step = step;
    info.loss = 2.5;
    info.loss_scale = 1024.0;
    info.scale_after = step == 1 ? 512.0 : 1024.0;
    info.found_inf = step == 1;
    info.skipped = step == 1;
    info.grad_norm = step == 1 ? NAN : 0.1;
    if (step == 2) {
      info.fp32_layers = fp32_layers;
      info.num_fp32_layers = 1;
    }
    CHECK(19, ampscope_agent_end_step(agent, &info) == AMPSCOPE_OK, "end_step");
  }
  CHECK(20, ampscope_agent_end_step(agent, NULL) == AMPSCOPE_INVALID_ARGUMENT, "NULL info");
  CHECK(21, strstr(ampscope_agent_last_error(agent), "info") != NULL, "last_error says why");
  CHECK(22, ampscope_agent_flush(agent, 5000) == AMPSCOPE_OK, "flush without a server");

  ampscope_agent_counters counters = AMPSCOPE_AGENT_COUNTERS_INIT;
  CHECK(23, ampscope_agent_get_counters(agent, &counters) == AMPSCOPE_OK, "counters");
  CHECK(24, counters.struct_size == sizeof(counters), "all of the counters written");
  CHECK(25, counters.steps == 3 && counters.reports_spooled == 3, "three reports spooled");
  CHECK(26, counters.dropped_reports == 0 && counters.lockstep_timeouts == 0,
        "nothing dropped, no lockstep wait given up");
  counters.struct_size = 4;
  CHECK(27, ampscope_agent_get_counters(agent, &counters) == AMPSCOPE_INVALID_ARGUMENT,
        "counters below their first layout");
  CHECK(28, ampscope_agent_notice_count(agent) >= 1, "at least the transport notice");
  CHECK(29, ampscope_agent_notice(agent, 0) != NULL, "notice 0");
  CHECK(30, ampscope_agent_notice(agent, 100000) == NULL, "no such notice");
  CHECK(31, strcmp(ampscope_status_string(AMPSCOPE_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED") == 0,
        "status string");
  CHECK(32, ampscope_agent_version()[0] != '\0', "version");
  CHECK(33, ampscope_agent_destroy(agent, 0) == AMPSCOPE_OK, "destroy");
  CHECK(34, ampscope_agent_destroy(NULL, 0) == AMPSCOPE_OK, "destroy NULL");
  CHECK(35, ampscope_agent_begin_step(NULL, 0) == 0, "NULL agent");
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The first layouts (ABI 1), as a caller compiled against that header declares them. */

typedef struct run_info_v1 {
  uint32_t struct_size;
  const char* host;
  const char* trainer;
  const char* precision;
  ampscope_format compute_format;
  double loss_scale;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  ampscope_scaler_kind scaler_kind;
} run_info_v1;

typedef struct tensor_view_v1 {
  uint32_t struct_size;
  const char* name;
  ampscope_role role;
  ampscope_phase phase;
  ampscope_format dtype;
  const void* data;
  const int64_t* shape;
  int rank;
  int64_t numel;
  ampscope_device device;
  void* stream;
  double scale;
  int micro_step;
  int order;
} tensor_view_v1;

typedef struct step_info_v1 {
  uint32_t struct_size;
  int64_t step;
  double loss;
  double loss_scale;
  double scale_after;
  int found_inf;
  int skipped;
  double grad_norm;
  double lr;
  int64_t tokens;
  double step_time_s;
  int64_t optimizer_steps;
  int has_val_loss;
  double val_loss;
} step_info_v1;

_Static_assert(sizeof(run_info_v1) == AMPSCOPE_RUN_INFO_SIZE_V1, "run info v1");
_Static_assert(sizeof(tensor_view_v1) == AMPSCOPE_TENSOR_VIEW_SIZE_V1, "tensor view v1");
_Static_assert(sizeof(step_info_v1) == AMPSCOPE_STEP_INFO_SIZE_V1, "step info v1");

/* An old caller's struct in memory whose bytes past it are 0xff: a library that read beyond
 * struct_size would see NaN bounds, a hysteresis of -1, a held format of -1 and a wild
 * fp32_layers pointer, and fail or crash. */
typedef union poisoned_run {
  ampscope_run_info full;
  unsigned char bytes[sizeof(ampscope_run_info)];
} poisoned_run;
typedef union poisoned_view {
  ampscope_tensor_view full;
  unsigned char bytes[sizeof(ampscope_tensor_view)];
} poisoned_view;
typedef union poisoned_info {
  ampscope_step_info full;
  unsigned char bytes[sizeof(ampscope_step_info)];
} poisoned_info;
typedef union poisoned_counters {
  ampscope_agent_counters full;
  unsigned char bytes[sizeof(ampscope_agent_counters) + 16];
} poisoned_counters;

static int old_layouts(const char* spool_dir, const char* server) {
  ampscope_agent_config* cfg = NULL;
  int failed = configure(&cfg, "c-api-v1", spool_dir, server);
  if (failed != 0) return failed;
  CHECK(1, ampscope_agent_config_set(cfg, "sample_full_every", "0") == AMPSCOPE_OK, "set full");

  run_info_v1 run1;
  memset(&run1, 0, sizeof(run1));
  run1.struct_size = sizeof(run1);
  run1.trainer = "c_api_test v1";
  run1.precision = "amp-fp16";
  run1.compute_format = AMPSCOPE_FORMAT_FP16;
  run1.loss_scale = 4096;
  run1.scaler_kind = AMPSCOPE_SCALER_HYSTERESIS;
  poisoned_run run;
  memset(run.bytes, 0xff, sizeof(run.bytes));
  memcpy(run.bytes, &run1, sizeof(run1));
  ampscope_agent* agent = NULL;
  run.full.struct_size = (uint32_t)(sizeof(run1) - 8);
  CHECK(2, ampscope_agent_create(cfg, &run.full, &agent) == AMPSCOPE_INVALID_ARGUMENT,
        "a run info below its first layout");
  CHECK(3, strstr(ampscope_agent_config_last_error(cfg), "run.struct_size") != NULL,
        ampscope_agent_config_last_error(cfg));
  run.full.struct_size = sizeof(run1);
  CHECK(4, ampscope_agent_create(cfg, &run.full, &agent) == AMPSCOPE_OK,
        ampscope_agent_config_last_error(cfg));
  ampscope_agent_config_destroy(cfg);

  float grad[16];
  for (int i = 0; i < 16; ++i) grad[i] = 0.25f;
  for (int step = 0; step < 2; ++step) {
    CHECK(5, ampscope_agent_begin_step(agent, step) == 1, "begin_step wants tensors");
    tensor_view_v1 view1;
    memset(&view1, 0, sizeof(view1));
    view1.struct_size = sizeof(view1);
    view1.name = "fc.weight.grad";
    view1.role = AMPSCOPE_ROLE_WEIGHT_GRAD;
    view1.phase = AMPSCOPE_PHASE_BACKWARD;
    view1.dtype = AMPSCOPE_FORMAT_FP32;
    view1.data = grad;
    view1.numel = 16;
    view1.scale = 4096;
    poisoned_view view;
    memset(view.bytes, 0xff, sizeof(view.bytes));
    memcpy(view.bytes, &view1, sizeof(view1));
    CHECK(6, ampscope_agent_observe(agent, &view.full) == AMPSCOPE_OK,
          ampscope_agent_last_error(agent));

    step_info_v1 info1;
    memset(&info1, 0, sizeof(info1));
    info1.struct_size = sizeof(info1);
    info1.step = step;
    info1.loss = 3.0;
    info1.loss_scale = 4096;
    info1.scale_after = 4096;
    poisoned_info info;
    memset(info.bytes, 0xff, sizeof(info.bytes));
    memcpy(info.bytes, &info1, sizeof(info1));
    CHECK(7, ampscope_agent_end_step(agent, &info.full) == AMPSCOPE_OK,
          ampscope_agent_last_error(agent));
  }
  CHECK(8, ampscope_agent_flush(agent, 10000) == AMPSCOPE_OK, ampscope_agent_last_error(agent));

  /* A caller built against a newer header: its larger struct is filled up to this library's
   * size, which struct_size then says; the bytes past it stay the caller's. */
  poisoned_counters counters;
  memset(counters.bytes, 0xff, sizeof(counters.bytes));
  counters.full.struct_size = (uint32_t)sizeof(counters.bytes);
  CHECK(9, ampscope_agent_get_counters(agent, &counters.full) == AMPSCOPE_OK, "counters");
  CHECK(10, counters.full.struct_size == sizeof(ampscope_agent_counters), "bytes written");
  CHECK(11, counters.full.steps == 2, "two steps");
  CHECK(12, counters.bytes[sizeof(ampscope_agent_counters)] == 0xff &&
                counters.bytes[sizeof(counters.bytes) - 1] == 0xff,
        "nothing written past the library's layout");
  CHECK(13, ampscope_agent_destroy(agent, 10000) == AMPSCOPE_OK, "destroy");
  return 0;
}

/* ------------------------------------------------------------------------------------------ */

static int hello(const char* spool_dir, const char* server) {
  ampscope_run_info run = fp16_run(AMPSCOPE_SCALER_HYSTERESIS);
  run.loss_scale = 65536;
  run.growth_interval = 1000;
  run.hysteresis = 3;
  run.min_scale = 1;
  run.max_scale = 16777216;
  scaler_state scaler = {32768.0, 0};
  overrides_state overrides;
  ampscope_agent* agent = NULL;
  int failed = start_agent("c-api-hello", spool_dir, server, &run, &scaler, &overrides, &agent);
  if (failed != 0) return failed;
  CHECK(5, ampscope_agent_begin_step(agent, 0) == 1, "begin_step");
  ampscope_step_info info = AMPSCOPE_STEP_INFO_INIT;
  info.loss = 1.0;
  info.loss_scale = 32768;
  info.scale_after = 32768;
  CHECK(6, ampscope_agent_end_step(agent, &info) == AMPSCOPE_OK, "end_step");
  CHECK(7, ampscope_agent_flush(agent, 10000) == AMPSCOPE_OK, ampscope_agent_last_error(agent));
  CHECK(8, ampscope_agent_attach_overrides(agent, NULL, NULL) == AMPSCOPE_FAILED_PRECONDITION,
        "overrides attach before the first step only");
  CHECK(9, ampscope_agent_destroy(agent, 10000) == AMPSCOPE_OK, "destroy");
  return 0;
}

/* ------------------------------------------------------------------------------------------ */

static int overrides(const char* spool_dir, const char* server) {
  ampscope_run_info run = fp16_run(AMPSCOPE_SCALER_DYNAMIC);
  scaler_state scaler = {65536.0, 0};
  overrides_state state;
  ampscope_agent* agent = NULL;
  int failed = start_agent("c-api-overrides", spool_dir, server, &run, &scaler, &state, &agent);
  if (failed != 0) return failed;

  /* FP16 activation gradients of "fc" (1.0), one NaN at step 0: the server's FP32 fallback
   * recommends "fc", effective a few steps later, with its static scaler parameters. */
  uint16_t grad[32];
  for (int i = 0; i < 32; ++i) grad[i] = 0x3c00;
  for (int step = 0; step < 8; ++step) {
    grad[7] = step == 0 ? 0x7e00 : 0x3c00;
    ampscope_agent_begin_step(agent, step);
    ampscope_tensor_view v = AMPSCOPE_TENSOR_VIEW_INIT;
    v.name = "fc";
    v.role = AMPSCOPE_ROLE_ACTIVATION_GRAD;
    v.phase = AMPSCOPE_PHASE_BACKWARD;
    v.dtype = AMPSCOPE_FORMAT_FP16;
    v.data = grad;
    v.numel = 32;
    CHECK(3, ampscope_agent_observe(agent, &v) == AMPSCOPE_OK, ampscope_agent_last_error(agent));
    const char* fp32[4];
    for (size_t i = 0; i < state.num_fp32; ++i) fp32[i] = state.fp32[i];
    ampscope_step_info info = AMPSCOPE_STEP_INFO_INIT;
    info.step = step;
    info.loss = 1.0;
    info.fp32_layers = fp32;
    info.num_fp32_layers = state.num_fp32;
    CHECK(4, ampscope_agent_end_step(agent, &info) == AMPSCOPE_OK, ampscope_agent_last_error(agent));
    /* The update a report causes comes before its acknowledgement. */
    if (step == 0) {
      CHECK(5, ampscope_agent_flush(agent, 10000) == AMPSCOPE_OK,
            ampscope_agent_last_error(agent));
    }
  }
  CHECK(6, ampscope_agent_flush(agent, 10000) == AMPSCOPE_OK, ampscope_agent_last_error(agent));
  ampscope_agent_counters counters = AMPSCOPE_AGENT_COUNTERS_INIT;
  CHECK(7, ampscope_agent_get_counters(agent, &counters) == AMPSCOPE_OK, "counters");
  CHECK(8, state.replaced == 1, "replace called once");
  CHECK(9, state.num_fp32 == 1 && strcmp(state.fp32[0], "fc") == 0, "fc in FP32");
  CHECK(10, state.from_step > 0 && state.from_step < 8, "from a later step");
  CHECK(11, counters.policies_applied == 1 && counters.policies_refused == 0, "applied once");
  CHECK(14, scaler.scheduled == 1, "the scaler got the same update");
  printf("replaced from step %lld\n", (long long)state.from_step);
  CHECK(12, ampscope_agent_destroy(agent, 10000) == AMPSCOPE_OK, "destroy");
  return 0;
}

/* The loss-scale rules without an agent: GradScaler's and Megatron's defaults, updates, and
 * changes validated as the built-in trainer validates them. */
static int rules(void) {
  ampscope_loss_scale_rule rule = AMPSCOPE_LOSS_SCALE_RULE_INIT;
  ampscope_loss_scale_state state;
  CHECK(1, ampscope_loss_scale_defaults(AMPSCOPE_SCALER_DYNAMIC, &rule, &state) == AMPSCOPE_OK,
        "dynamic defaults");
  CHECK(2, state.scale == 65536.0f && rule.growth_interval == 2000 && rule.backoff_factor == 0.5,
        "GradScaler's defaults");
  rule.growth_interval = 3;
  CHECK(3, ampscope_loss_scale_update(&state, &rule, 1) == AMPSCOPE_OK && state.scale == 32768.0f,
        "an overflow halves the scale");
  for (int i = 0; i < 3; ++i) ampscope_loss_scale_update(&state, &rule, 0);
  CHECK(4, state.scale == 65536.0f && state.growth_tracker == 0, "3 clean steps double it");

  CHECK(5, ampscope_loss_scale_defaults(AMPSCOPE_SCALER_HYSTERESIS, &rule, &state) == AMPSCOPE_OK,
        "hysteresis defaults");
  CHECK(6, state.scale == 4294967296.0f && rule.hysteresis == 2 && state.hysteresis_tracker == 2 &&
               rule.min_scale == 1.0f,
        "Megatron's defaults");
  ampscope_loss_scale_update(&state, &rule, 1);
  CHECK(7, state.scale == 4294967296.0f && state.hysteresis_tracker == 1,
        "the first overflow is tolerated");
  ampscope_loss_scale_update(&state, &rule, 1);
  CHECK(8, state.scale == 2147483648.0f, "the second backs off");

  ampscope_scaler_change change = {0};
  change.struct_size = sizeof(change);
  change.has_scale = 1;
  change.scale = 256.0;
  change.has_hysteresis = 1;
  change.hysteresis = 4;
  char reason[128] = {0};
  CHECK(9, ampscope_loss_scale_apply_change(&rule, &state, &change, reason, sizeof(reason)) ==
               AMPSCOPE_OK,
        reason);
  CHECK(10, state.scale == 256.0f && rule.hysteresis == 4 && state.hysteresis_tracker == 4 &&
                state.growth_tracker == 0,
        "a new scale restarts the trackers");
  change.has_scale = 0;
  change.has_hysteresis = 0;
  change.has_backoff_factor = 1;
  change.backoff_factor = 1.5;
  CHECK(11, ampscope_loss_scale_apply_change(&rule, &state, &change, reason, sizeof(reason)) ==
                AMPSCOPE_INVALID_ARGUMENT,
        "a backoff factor above 1 is refused");
  CHECK(12, strstr(reason, "backoff_factor") != NULL && rule.backoff_factor == 0.5,
        "the reason names it and nothing changed");
  rule.kind = 9;
  CHECK(13, ampscope_loss_scale_update(&state, &rule, 0) == AMPSCOPE_INVALID_ARGUMENT,
        "an unknown kind");
  CHECK(14, ampscope_loss_scale_defaults(9, &rule, &state) == AMPSCOPE_INVALID_ARGUMENT,
        "an unknown kind has no defaults");
  return 0;
}

/* One step whose unscaled weight gradient goes through the fused path (the agent does not read
 * it); the same values are also shown with observe (as "fc.weight.grad.measured") so that the
 * driver can compare the two records. */
static int fused(const char* spool_dir) {
  ampscope_agent_config* cfg = NULL;
  int failed = configure(&cfg, "c-fused", spool_dir, NULL);
  if (failed != 0) return failed;
  CHECK(1, ampscope_agent_config_set(cfg, "sample_full_every", "1") == AMPSCOPE_OK, "full");
  ampscope_run_info run = fp16_run(AMPSCOPE_SCALER_DYNAMIC);
  ampscope_agent* agent = NULL;
  CHECK(2, ampscope_agent_create(cfg, &run, &agent) == AMPSCOPE_OK,
        ampscope_agent_config_last_error(cfg));
  ampscope_agent_config_destroy(cfg);

  enum { kN = 64 };
  float grad[kN];
  for (int i = 0; i < kN; ++i) grad[i] = ldexpf(1.0f + (float)i / 64.0f, i % 40 - 30);
  grad[3] = 0.0f;
  grad[4] = -3.0e38f; /* with 3e38 below: a sum that cancels */
  grad[5] = 3.0e38f;
  CHECK(3, ampscope_agent_begin_step(agent, 0) == 1, "begin_step");
  ampscope_tensor_view view = AMPSCOPE_TENSOR_VIEW_INIT;
  view.name = "fc.weight.grad";
  view.role = AMPSCOPE_ROLE_WEIGHT_GRAD;
  view.phase = AMPSCOPE_PHASE_BACKWARD;
  view.dtype = AMPSCOPE_FORMAT_FP32;
  view.data = grad;
  view.numel = kN;
  view.scale = 1024.0;
  CHECK(4, ampscope_agent_observe(agent, &view) == AMPSCOPE_OK, "observe the scaled gradient");

  view.phase = AMPSCOPE_PHASE_AFTER_UNSCALE;
  view.scale = 1.0;
  view.order = 1;
  ampscope_target target = {0, 0};
  CHECK(5, ampscope_agent_stats_target(agent, &view, &target) == 1, "a target is wanted");
  CHECK(6, target.format == AMPSCOPE_FORMAT_FP16 && target.scale_log2 == 10,
        "fp16 at the step's scale 2^10");
  uint64_t bins[AMPSCOPE_HISTOGRAM_BINS];
  ampscope_target_counts counts[1];
  memset(counts, 0, sizeof(counts));
  counts[0].target = target;
  ampscope_tensor_stats stats = AMPSCOPE_TENSOR_STATS_INIT;
  stats.histogram_counts = bins;
  stats.targets = counts;
  stats.num_targets = 1;
  char reason[160] = {0};
  CHECK(7, ampscope_scale_and_compute_stats(grad, kN, AMPSCOPE_FORMAT_FP32, 1.0f / 1024.0f,
                                            &stats, reason, sizeof(reason)) == AMPSCOPE_OK,
        reason);
  CHECK(8, grad[6] == ldexpf(1.0f + 6.0f / 64.0f, 6 - 30 - 10), "unscaled in place");
  /* -3e38 and 3e38 (unscaled) cancel exactly: the sum is that of the others, including the
   * first ones, which a plain FP64 sum in order loses against -3e38 / 1024. */
  long double expected = 0.0L;
  for (int i = 0; i < kN; ++i) expected += (i == 4 || i == 5) ? 0.0L : (long double)grad[i];
  CHECK(9, stats.numel == kN && stats.zeros == 1 && stats.histogram_bins > 0 &&
               fabsl((long double)stats.sum - expected) <= 1e-15L * expected,
        "statistics of the unscaled values, the sum exact");
  view.data = NULL; /* the agent needs no data */
  CHECK(10, ampscope_agent_observe_stats(agent, &view, &stats) == AMPSCOPE_OK,
        ampscope_agent_last_error(agent));

  ampscope_tensor_stats bad = stats;
  bad.numel = kN + 1;
  view.name = "fc.weight.grad.bad";
  CHECK(11, ampscope_agent_observe_stats(agent, &view, &bad) == AMPSCOPE_INVALID_ARGUMENT,
        "statistics of another size are refused");
  CHECK(12, strstr(ampscope_agent_last_error(agent), "numel") != NULL, "the error says why");
  CHECK(13, ampscope_compute_stats(grad, kN, AMPSCOPE_FORMAT_E2M1, &stats, reason,
                                   sizeof(reason)) == AMPSCOPE_INVALID_ARGUMENT &&
                strstr(reason, "dtype") != NULL,
        "fp4 storage is refused");

  view.name = "fc.weight.grad.measured";
  view.data = grad;
  view.order = 2;
  CHECK(14, ampscope_agent_observe(agent, &view) == AMPSCOPE_OK, "observe the unscaled values");
  ampscope_step_info info = AMPSCOPE_STEP_INFO_INIT;
  info.loss_scale = info.scale_after = 1024.0;
  CHECK(15, ampscope_agent_end_step(agent, &info) == AMPSCOPE_OK, "end_step");
  CHECK(16, ampscope_agent_destroy(agent, 0) == AMPSCOPE_OK, "destroy");
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Quantisers (ABI 7). */

/* The (8, 64) FP32 activation both this program and the driver count: 40 binades from 2^-30,
 * mantissas 1 + k/8, every third value negative. */
enum { kQRows = 8, kQCols = 64 };
static void quantizer_data(float* x) {
  for (int i = 0; i < kQRows * kQCols; ++i) {
    x[i] = ldexpf(1.0f + (float)(i % 7) / 8.0f, i % 40 - 30) * (i % 3 == 0 ? -1.0f : 1.0f);
  }
}

/* The step info of ABI 2..6 (no bf16_gemms), as a caller compiled against those headers has it. */
typedef union poisoned_info_v2 {
  ampscope_step_info full;
  unsigned char bytes[sizeof(ampscope_step_info)];
} poisoned_info_v2;

static int quantizers(const char* spool_dir) {
  ampscope_agent_config* cfg = NULL;
  int failed = configure(&cfg, "c-quantizers", spool_dir, NULL);
  if (failed != 0) return failed;
  CHECK(1, ampscope_agent_config_set(cfg, "sample_full_every", "1") == AMPSCOPE_OK, "full");
  ampscope_run_info run = fp16_run(AMPSCOPE_SCALER_STATIC);
  run.precision = "mxfp4";
  run.compute_format = AMPSCOPE_FORMAT_BF16;
  ampscope_agent* agent = NULL;
  CHECK(2, ampscope_agent_create(cfg, &run, &agent) == AMPSCOPE_OK,
        ampscope_agent_config_last_error(cfg));
  ampscope_agent_config_destroy(cfg);

  float x[kQRows * kQCols];
  quantizer_data(x);
  int64_t shape[2] = {kQRows, kQCols};
  ampscope_tensor_view view = AMPSCOPE_TENSOR_VIEW_INIT;
  view.name = "fc.input";
  view.role = AMPSCOPE_ROLE_ACTIVATION;
  view.phase = AMPSCOPE_PHASE_FORWARD;
  view.dtype = AMPSCOPE_FORMAT_FP32;
  view.data = x;
  view.shape = shape;
  view.rank = 2;
  ampscope_quantizer q = AMPSCOPE_QUANTIZER_INIT;
  q.recipe = "mxfp4";
  q.layer = "fc";

  /* Outside a step the recipe is still checked, the data is not read. */
  view.data = NULL;
  CHECK(3, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_OK,
        "no step: nothing read, nothing recorded");
  q.recipe = "mxfp9";
  CHECK(4, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_INVALID_ARGUMENT &&
               strstr(ampscope_agent_last_error(agent), "quantizer.recipe: 'mxfp9'") != NULL,
        ampscope_agent_last_error(agent));
  q.recipe = "mxfp4";
  view.data = x;

  CHECK(5, ampscope_agent_begin_step(agent, 0) == 1, "begin_step");
  CHECK(6, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_OK,
        ampscope_agent_last_error(agent));
  q.recipe = NULL;
  CHECK(7, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_INVALID_ARGUMENT &&
               strstr(ampscope_agent_last_error(agent), "quantizer.recipe is NULL") != NULL,
        "a NULL recipe");
  q.recipe = "mxfp4";
  q.struct_size = 8;
  CHECK(8, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_INVALID_ARGUMENT &&
               strstr(ampscope_agent_last_error(agent), "quantizer.struct_size is 8") != NULL,
        "a quantizer below its first layout");
  q.struct_size = sizeof(q);
  q.amax_history_length = 3;
  CHECK(9, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_INVALID_ARGUMENT &&
               strstr(ampscope_agent_last_error(agent), "amax_history is NULL") != NULL,
        "a history length without a history");
  q.amax_history_length = 0;
  view.device = AMPSCOPE_DEVICE_CUDA;
  CHECK(10, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_INVALID_ARGUMENT &&
                strstr(ampscope_agent_last_error(agent), "host") != NULL,
        "device memory is refused");
  view.device = AMPSCOPE_DEVICE_CPU;
  view.data = NULL;
  CHECK(11, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_INVALID_ARGUMENT &&
                strstr(ampscope_agent_last_error(agent), "data is NULL") != NULL,
        "a recorded step needs the data");
  view.data = x;
  view.rank = 0;
  view.shape = NULL;
  view.numel = 500;
  view.name = "fc.input.head";
  q.recipe = "e4m3:tile=1x128";
  /* A caller of ABI 7: its quantizer ends before has_loss_cost (set here, and not read). */
  q.struct_size = (uint32_t)AMPSCOPE_QUANTIZER_SIZE_V1;
  q.has_loss_cost = 1;
  q.loss_cost = NAN;
  CHECK(12, ampscope_agent_observe_quantizer(agent, &view, &q) == AMPSCOPE_OK,
        "a shapeless tensor is one row");
  q.struct_size = sizeof(q);
  q.has_loss_cost = 0;
  view.rank = 2;
  view.shape = shape;
  view.name = "fc.input";

  /* Counts the caller has: ampscope_count_recipe, then handed over with what_if and a history. */
  uint64_t bins[AMPSCOPE_HISTOGRAM_BINS];
  ampscope_recipe_counts counts = AMPSCOPE_RECIPE_COUNTS_INIT;
  counts.scale_histogram_counts = bins;
  char reason[200] = {0};
  CHECK(13, ampscope_count_recipe(x, kQRows * kQCols, AMPSCOPE_FORMAT_FP32, kQCols,
                                  "e4m3:scale=0.5", &counts, reason, sizeof(reason)) ==
                AMPSCOPE_OK,
        reason);
  CHECK(14, counts.values == kQRows * kQCols && counts.underflow > 0 && counts.tensor_scale == 0.5,
        "counts of a delayed scale");
  const float history[3] = {1.0f, 896.0f, 2.0f};
  q.recipe = "e4m3:scale=0.5";
  q.what_if = 1;
  q.amax_history = history;
  q.amax_history_length = 3;
  view.name = "fc.input.delayed";
  view.data = NULL;
  q.has_loss_cost = 1;
  q.loss_cost = INFINITY;
  CHECK(28, ampscope_agent_observe_quantizer_counts(agent, &view, &q, &counts) ==
                    AMPSCOPE_INVALID_ARGUMENT &&
                strstr(ampscope_agent_last_error(agent), "quantizer.loss_cost is not finite") !=
                    NULL,
        "a loss cost that is not finite");
  q.loss_cost = -0.0025;
  CHECK(15, ampscope_agent_observe_quantizer_counts(agent, &view, &q, &counts) == AMPSCOPE_OK,
        ampscope_agent_last_error(agent));
  q.has_loss_cost = 0;
  ampscope_recipe_counts bad = counts;
  bad.underflow = bad.values + 1;
  view.name = "fc.input.bad";
  CHECK(16, ampscope_agent_observe_quantizer_counts(agent, &view, &q, &bad) ==
                AMPSCOPE_INVALID_ARGUMENT,
        "counts above the values are refused");
  bad = counts;
  bad.scale_histogram_bins = AMPSCOPE_HISTOGRAM_BINS + 1;
  CHECK(17, ampscope_agent_observe_quantizer_counts(agent, &view, &q, &bad) ==
                    AMPSCOPE_INVALID_ARGUMENT &&
                strstr(ampscope_agent_last_error(agent), "scale_histogram_bins") != NULL,
        "a histogram longer than the bins");
  CHECK(18, ampscope_agent_observe_quantizer_counts(agent, &view, &q, NULL) ==
                    AMPSCOPE_INVALID_ARGUMENT &&
                strstr(ampscope_agent_last_error(agent), "counts must not be NULL") != NULL,
        "NULL counts");

  /* ampscope_count_recipe's refusals. */
  CHECK(19, ampscope_count_recipe(x, kQRows * kQCols, AMPSCOPE_FORMAT_E2M1, 0, "mxfp4", &counts,
                                  reason, sizeof(reason)) == AMPSCOPE_INVALID_ARGUMENT &&
                strstr(reason, "dtype") != NULL,
        "FP4 is no storage format");
  CHECK(20, ampscope_count_recipe(x, kQRows * kQCols, AMPSCOPE_FORMAT_FP32, 100, "mxfp4", &counts,
                                  reason, sizeof(reason)) == AMPSCOPE_INVALID_ARGUMENT,
        "rows that do not divide the tensor");
  CHECK(21, ampscope_count_recipe(x, kQRows * kQCols, AMPSCOPE_FORMAT_FP32, 0, "nvfp5", &counts,
                                  reason, sizeof(reason)) == AMPSCOPE_INVALID_ARGUMENT &&
                strstr(reason, "'nvfp5' is not a recipe") != NULL,
        reason);
  ampscope_recipe_counts no_room = AMPSCOPE_RECIPE_COUNTS_INIT;
  CHECK(22, ampscope_count_recipe(x, kQRows * kQCols, AMPSCOPE_FORMAT_FP32, 0, "mxfp4", &no_room,
                                  reason, sizeof(reason)) == AMPSCOPE_INVALID_ARGUMENT &&
                strstr(reason, "scale_histogram_counts") != NULL,
        "no room for the histogram");

  const char* bf16[1] = {"fc"};
  ampscope_step_info info = AMPSCOPE_STEP_INFO_INIT;
  info.bf16_gemms = bf16;
  info.num_bf16_gemms = 1;
  CHECK(23, ampscope_agent_end_step(agent, &info) == AMPSCOPE_OK, "end_step with BF16 GEMMs");
  info.bf16_gemms = NULL;
  CHECK(24, ampscope_agent_end_step(agent, &info) == AMPSCOPE_INVALID_ARGUMENT &&
                strstr(ampscope_agent_last_error(agent), "info.bf16_gemms is NULL") != NULL,
        "a count without names");

  /* A caller of ABI 2..6: its step info ends before bf16_gemms (the bytes after it poisoned). */
  CHECK(25, ampscope_agent_begin_step(agent, 1) == 1, "begin_step 1");
  poisoned_info_v2 old;
  memset(old.bytes, 0xff, sizeof(old.bytes));
  memset(&old.full, 0, offsetof(ampscope_step_info, bf16_gemms));
  old.full.struct_size = (uint32_t)offsetof(ampscope_step_info, bf16_gemms);
  old.full.step = 1;
  CHECK(26, ampscope_agent_end_step(agent, &old.full) == AMPSCOPE_OK,
        ampscope_agent_last_error(agent));
  CHECK(27, ampscope_agent_destroy(agent, 0) == AMPSCOPE_OK, "destroy");
  return 0;
}

typedef struct recipe_state {
  int scheduled;
  int64_t from_step;
  int32_t history_length;
  int32_t margin;
} recipe_state;

static int schedule_recipe(void* user, const ampscope_recipe_change* change, char* reason,
                           size_t reason_size) {
  recipe_state* s = (recipe_state*)user;
  if (!AMPSCOPE_STRUCT_HAS(ampscope_recipe_change, change, margin)) {
    snprintf(reason, reason_size, "the change is smaller than this trainer's header");
    return 1;
  }
  s->scheduled++;
  s->from_step = change->effective_from_step;
  s->history_length = change->has_amax_history_length ? change->amax_history_length : -1;
  s->margin = change->has_margin ? change->margin : -1;
  return 0;
}

static int gemm_precision(const char* spool_dir, const char* server, int delayed) {
  ampscope_agent_config* cfg = NULL;
  int failed = configure(&cfg, delayed ? "c-gemms-delayed" : "c-gemms", spool_dir, server);
  if (failed != 0) return failed;
  ampscope_run_info run = fp16_run(AMPSCOPE_SCALER_STATIC);
  run.precision = delayed ? "fp8-delayed" : "mxfp8";
  run.compute_format = AMPSCOPE_FORMAT_BF16;
  ampscope_agent* agent = NULL;
  CHECK(1, ampscope_agent_create(cfg, &run, &agent) == AMPSCOPE_OK,
        ampscope_agent_config_last_error(cfg));
  ampscope_agent_config_destroy(cfg);

  overrides_state gemms;
  memset(&gemms, 0, sizeof(gemms));
  gemms.capable[0] = "fc";
  gemms.capable[1] = "proj";
  gemms.from_step = -1;
  ampscope_overrides_ops gops = AMPSCOPE_OVERRIDES_OPS_INIT;
  gops.capable_layers = capable_layers;
  recipe_state recipe = {0, -1, 0, 0};
  ampscope_recipe_ops rops = AMPSCOPE_RECIPE_OPS_INIT;
  rops.delayed = delayed;
  CHECK(2, ampscope_agent_attach_gemm_precision(agent, &gops, &gemms, &rops, &recipe) ==
                   AMPSCOPE_INVALID_ARGUMENT &&
               strstr(ampscope_agent_last_error(agent), "gemms.capable_layers and gemms.replace") !=
                   NULL,
        "replace is required");
  gops.replace = replace;
  CHECK(3, ampscope_agent_attach_gemm_precision(agent, &gops, &gemms, &rops, &recipe) ==
                   AMPSCOPE_INVALID_ARGUMENT &&
               strstr(ampscope_agent_last_error(agent), "recipe.schedule") != NULL,
        "schedule is required");
  rops.schedule = schedule_recipe;
  rops.struct_size = 4;
  CHECK(4, ampscope_agent_attach_gemm_precision(agent, &gops, &gemms, &rops, &recipe) ==
                   AMPSCOPE_INVALID_ARGUMENT &&
               strstr(ampscope_agent_last_error(agent), "recipe.struct_size is 4") != NULL,
        "recipe ops below their first layout");
  rops.struct_size = sizeof(rops);
  CHECK(5, ampscope_agent_attach_gemm_precision(agent, &gops, &gemms, &rops, &recipe) ==
               AMPSCOPE_OK,
        ampscope_agent_last_error(agent));

  /* The stand-in server sends its PolicyUpdate (BF16 GEMM "fc", history 4, margin 1, from step
   * 3) after the first report. */
  for (int step = 0; step < 6; ++step) {
    ampscope_agent_begin_step(agent, step);
    const char* bf16[4];
    for (size_t i = 0; i < gemms.num_fp32; ++i) bf16[i] = gemms.fp32[i];
    ampscope_step_info info = AMPSCOPE_STEP_INFO_INIT;
    info.step = step;
    info.bf16_gemms = bf16;
    info.num_bf16_gemms = gemms.num_fp32;
    CHECK(6, ampscope_agent_end_step(agent, &info) == AMPSCOPE_OK,
          ampscope_agent_last_error(agent));
    if (step == 0) {
      CHECK(7, ampscope_agent_flush(agent, 10000) == AMPSCOPE_OK,
            ampscope_agent_last_error(agent));
    }
  }
  CHECK(8, ampscope_agent_attach_gemm_precision(agent, NULL, NULL, NULL, NULL) ==
               AMPSCOPE_FAILED_PRECONDITION,
        "attach before the first step only");
  CHECK(9, ampscope_agent_flush(agent, 10000) == AMPSCOPE_OK, ampscope_agent_last_error(agent));
  ampscope_agent_counters counters = AMPSCOPE_AGENT_COUNTERS_INIT;
  CHECK(10, ampscope_agent_get_counters(agent, &counters) == AMPSCOPE_OK, "counters");
  if (delayed) {
    CHECK(11, gemms.replaced == 1 && gemms.from_step == 3 && gemms.num_fp32 == 1 &&
                  strcmp(gemms.fp32[0], "fc") == 0,
          "fc in BF16 from step 3");
    CHECK(12, recipe.scheduled == 1 && recipe.from_step == 3 && recipe.history_length == 4 &&
                  recipe.margin == 1,
          "history 4, margin 1 from step 3");
    CHECK(13, counters.policies_applied == 1 && counters.policies_refused == 0, "applied");
  } else {
    CHECK(14, gemms.replaced == 0 && recipe.scheduled == 0,
          "a delayed setting for a run that is not delayed: nothing applied");
    CHECK(15, counters.policies_applied == 0 && counters.policies_refused == 1, "refused");
  }
  printf("replaced %d, scheduled %d\n", gemms.replaced, recipe.scheduled);
  CHECK(16, ampscope_agent_destroy(agent, 10000) == AMPSCOPE_OK, "destroy");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "rules") == 0) return rules();
  if (argc == 3 && strcmp(argv[1], "exercise") == 0) return exercise(argv[2]);
  if (argc == 4 && strcmp(argv[1], "old-layouts") == 0) return old_layouts(argv[2], argv[3]);
  if (argc == 4 && strcmp(argv[1], "hello") == 0) return hello(argv[2], argv[3]);
  if (argc == 4 && strcmp(argv[1], "overrides") == 0) return overrides(argv[2], argv[3]);
  if (argc == 3 && strcmp(argv[1], "fused") == 0) return fused(argv[2]);
  if (argc == 3 && strcmp(argv[1], "quantizers") == 0) return quantizers(argv[2]);
  if (argc == 5 && strcmp(argv[1], "gemm-precision") == 0) {
    return gemm_precision(argv[2], argv[3], strcmp(argv[4], "1") == 0);
  }
  fprintf(stderr,
          "usage: %s rules | exercise|fused|quantizers|old-layouts|hello|overrides SPOOL_DIR "
          "[SERVER] | gemm-precision SPOOL_DIR SERVER DELAYED\n",
          argv[0]);
  return 200;
}
