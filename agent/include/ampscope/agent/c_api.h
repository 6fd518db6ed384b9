/* The agent's C API: the same agent as ampscope/agent/agent.h behind opaque handles and status
 * codes, for trainers written in C or reached through an FFI (Python ctypes, Rust, Julia).
 *
 *   ampscope_agent_config* cfg = NULL;
 *   ampscope_agent_config_create(&cfg);
 *   ampscope_agent_config_apply_env(cfg);                  // AMPSCOPE_SERVER, ...
 *   ampscope_agent_config_set(cfg, "run_id", "my-run");    // keys of set_option (config.h)
 *   ampscope_agent* agent = NULL;
 *   if (ampscope_agent_create(cfg, &run, &agent) != AMPSCOPE_OK) {
 *     fprintf(stderr, "%s\n", ampscope_agent_config_last_error(cfg));
 *   }
 *   ampscope_agent_config_destroy(cfg);                    // the agent keeps its own copy
 *   for each step:
 *     if (ampscope_agent_begin_step(agent, step)) { ampscope_agent_observe(agent, &view); ... }
 *     ampscope_agent_end_step(agent, &info);
 *   ampscope_agent_destroy(agent, 10000);                  // flush for up to 10 s, then free
 *
 * Nothing here exits, aborts or lets a C++ exception escape: every function returns a status
 * (or a documented neutral value) and records a one-line message for *_last_error().
 * Strings passed in are copied; strings returned are owned by the handle and valid until the
 * next call on it. Structs are passed by pointer and read during the call only.
 * Threads: begin_step, observe, mark_phase and end_step on the training thread; flush,
 * counters and notices from any thread; destroy once, from the owning thread.
 * Scaler and override callbacks are called on the training thread from begin_step.
 */
#ifndef AMPSCOPE_AGENT_C_API_H_
#define AMPSCOPE_AGENT_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ampscope_status {
  AMPSCOPE_OK = 0,
  AMPSCOPE_INVALID_ARGUMENT = 1,
  AMPSCOPE_UNAVAILABLE = 2,
  AMPSCOPE_DEADLINE_EXCEEDED = 3,
  AMPSCOPE_FAILED_PRECONDITION = 4,
  AMPSCOPE_INTERNAL = 5
} ampscope_status;

/* Formats and roles have the numbers of ampscope::Format and ampscope::TensorRole. */
typedef enum ampscope_format {
  AMPSCOPE_FORMAT_FP32 = 0,
  AMPSCOPE_FORMAT_FP16 = 1,
  AMPSCOPE_FORMAT_BF16 = 2,
  AMPSCOPE_FORMAT_E4M3 = 3,
  AMPSCOPE_FORMAT_E5M2 = 4
} ampscope_format;

typedef enum ampscope_role {
  AMPSCOPE_ROLE_WEIGHT = 0,
  AMPSCOPE_ROLE_MASTER_WEIGHT = 1,
  AMPSCOPE_ROLE_ACTIVATION = 2,
  AMPSCOPE_ROLE_ACTIVATION_GRAD = 3,
  AMPSCOPE_ROLE_WEIGHT_GRAD = 4,
  AMPSCOPE_ROLE_OPTIMIZER_STATE = 5,
  AMPSCOPE_ROLE_LOSS = 6
} ampscope_role;

typedef enum ampscope_phase {
  AMPSCOPE_PHASE_UNKNOWN = 0,
  AMPSCOPE_PHASE_STEP_START = 1,
  AMPSCOPE_PHASE_FORWARD = 2,
  AMPSCOPE_PHASE_BACKWARD = 3,
  AMPSCOPE_PHASE_AFTER_UNSCALE = 4
} ampscope_phase;

typedef enum ampscope_step_phase {
  AMPSCOPE_STEP_PHASE_FORWARD = 0,
  AMPSCOPE_STEP_PHASE_BACKWARD = 1,
  AMPSCOPE_STEP_PHASE_UNSCALE_CHECK = 2,
  AMPSCOPE_STEP_PHASE_OPTIMIZER = 3
} ampscope_step_phase;

typedef struct ampscope_agent_config ampscope_agent_config;
typedef struct ampscope_agent ampscope_agent;

typedef struct ampscope_run_info {
  const char* host;       /* NULL or "": gethostname() */
  const char* trainer;    /* "mytrainer 1.0" */
  const char* precision;  /* "amp-fp16" */
  ampscope_format compute_format;
  /* The local scaler (reported in the Hello); ignored when a scaler control is attached. */
  double loss_scale;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int dynamic; /* 0: static scale, 1: dynamic */
} ampscope_run_info;

/* data: numel elements of `dtype` storage in host memory (device memory when device == 1,
 * ordered on `stream`, a cudaStream_t). shape may be NULL with rank 0 and numel set. */
typedef struct ampscope_tensor_view {
  const char* name;
  ampscope_role role;
  ampscope_phase phase;
  ampscope_format dtype;
  const void* data;
  const int64_t* shape;
  int rank;
  int64_t numel; /* used when shape is NULL */
  int device;    /* 0: CPU, 1: CUDA */
  void* stream;
  double scale;  /* loss scale the values carry; 1 when unscaled */
  int micro_step;
  int order;
} ampscope_tensor_view;

typedef struct ampscope_step_info {
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
  int has_val_loss; /* nonzero: val_loss holds the validation loss after this step */
  double val_loss;
} ampscope_step_info;

/* A scaler change as the callback receives it: has_* says which fields are set. */
typedef struct ampscope_scaler_change {
  int64_t effective_from_step;
  int has_scale;
  double scale;
  int has_growth_factor;
  double growth_factor;
  int has_backoff_factor;
  double backoff_factor;
  int has_growth_interval;
  int64_t growth_interval;
  int has_hysteresis;
  int hysteresis;
  int has_min_scale;
  double min_scale;
  int has_max_scale;
  double max_scale;
} ampscope_scaler_change;

/* Applies `change` from effective_from_step on (the agent calls it from begin_step of that
 * step). Returns 0 when accepted; otherwise writes a one-line reason (NUL-terminated, at most
 * reason_size bytes) and returns non-zero. */
typedef int (*ampscope_scaler_schedule_fn)(void* user, const ampscope_scaler_change* change,
                                           char* reason, size_t reason_size);
/* The current loss scale (reported to the server; also the base for bounds checks). */
typedef double (*ampscope_scaler_scale_fn)(void* user);

typedef struct ampscope_scaler_ops {
  ampscope_scaler_schedule_fn schedule;
  ampscope_scaler_scale_fn scale;
  /* Bounds the agent checks updates against (0: none). */
  double min_scale;
  double max_scale;
} ampscope_scaler_ops;

typedef struct ampscope_agent_counters {
  uint64_t steps;
  uint64_t reports_spooled;
  uint64_t reports_acked;
  uint64_t dropped_reports;
  uint64_t dropped_tensors;
  uint64_t rejected_reports;
  uint64_t spool_bytes;
  uint64_t reconnects;
  uint64_t policies_applied;
  uint64_t policies_refused;
  double training_thread_s;
  int connected;
} ampscope_agent_counters;

const char* ampscope_status_string(ampscope_status status);
const char* ampscope_agent_version(void);

ampscope_status ampscope_agent_config_create(ampscope_agent_config** out);
void ampscope_agent_config_destroy(ampscope_agent_config* config);
/* key/value as set_option in config.h ("server", "run_id", "sample_full_every", ...). */
ampscope_status ampscope_agent_config_set(ampscope_agent_config* config, const char* key,
                                          const char* value);
ampscope_status ampscope_agent_config_apply_env(ampscope_agent_config* config);
const char* ampscope_agent_config_last_error(const ampscope_agent_config* config);

/* On failure *out is NULL and ampscope_agent_config_last_error(config) says why. */
ampscope_status ampscope_agent_create(ampscope_agent_config* config, const ampscope_run_info* run,
                                      ampscope_agent** out);
/* Shuts down (waiting up to timeout_ms for acknowledgements) and frees. NULL is a no-op. */
ampscope_status ampscope_agent_destroy(ampscope_agent* agent, int64_t timeout_ms);

/* Optional, before the first step: `ops` is copied; `user` is passed back to the callbacks and
 * must stay valid until destroy. */
ampscope_status ampscope_agent_attach_scaler(ampscope_agent* agent, const ampscope_scaler_ops* ops,
                                             void* user);

/* Returns 1 when ampscope_agent_observe calls are wanted this step, else 0 (also on error). */
int ampscope_agent_begin_step(ampscope_agent* agent, int64_t step);
ampscope_status ampscope_agent_observe(ampscope_agent* agent, const ampscope_tensor_view* view);
ampscope_status ampscope_agent_mark_phase(ampscope_agent* agent, ampscope_step_phase phase);
ampscope_status ampscope_agent_end_step(ampscope_agent* agent, const ampscope_step_info* info);

ampscope_status ampscope_agent_flush(ampscope_agent* agent, int64_t timeout_ms);
ampscope_status ampscope_agent_get_counters(const ampscope_agent* agent,
                                            ampscope_agent_counters* out);
/* The number of notices so far; ampscope_agent_notice(agent, i) returns the i-th (or NULL). */
size_t ampscope_agent_notice_count(const ampscope_agent* agent);
const char* ampscope_agent_notice(ampscope_agent* agent, size_t index);
const char* ampscope_agent_last_error(const ampscope_agent* agent);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* AMPSCOPE_AGENT_C_API_H_ */
