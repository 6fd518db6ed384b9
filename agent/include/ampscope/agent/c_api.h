/* The agent's C API: the same agent as ampscope/agent/agent.h behind opaque handles and status
 * codes, for trainers written in C or reached through an FFI (Python ctypes, Rust, Julia).
 * It is an ABI: libampscope_agent.so exports these functions and nothing else (no gRPC,
 * protobuf or C++ symbols), and a caller compiled against this header keeps working with a
 * later library.
 *
 *   ampscope_agent_config* cfg = NULL;
 *   ampscope_agent_config_create(&cfg);
 *   ampscope_agent_config_apply_env(cfg);                  // AMPSCOPE_SERVER, ...
 *   ampscope_agent_config_set(cfg, "run_id", "my-run");    // keys of set_option (config.h)
 *   ampscope_run_info run = AMPSCOPE_RUN_INFO_INIT;
 *   run.trainer = "mytrainer 1.0";
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
 * Versioned structs. Every struct begins with `uint32_t struct_size`, which its *_INIT macro
 * sets to sizeof the struct this header declares (the rest is zero; zero means "default" in
 * every field). Fields are only ever appended, each layout ending on an 8-byte boundary:
 *   - structs the caller fills (run info, tensor view, step info, scaler and override ops):
 *     the library reads only the fields that lie within struct_size; the fields past it take
 *     their defaults. A struct_size below the struct's first layout (AMPSCOPE_*_SIZE_V1) is
 *     AMPSCOPE_INVALID_ARGUMENT. A struct larger than this library knows (a newer header) is
 *     accepted and its unknown fields are ignored: compare ampscope_agent_abi_version() with
 *     the version that added a field when the field matters.
 *   - structs the library fills for the caller (counters): written up to the caller's
 *     struct_size at most; on return struct_size says how many bytes were written.
 *   - structs the library hands to a callback (the scaler change): struct_size is the
 *     library's; read a field only when AMPSCOPE_STRUCT_HAS says it is there.
 *
 * Nothing here exits, aborts or lets a C++ exception escape: every function returns a status
 * (or a documented neutral value) and records a one-line message for *_last_error().
 * Strings passed in are copied; strings returned are owned by the handle and valid until the
 * next call on it. Structs are passed by pointer and read during the call only.
 * Threads: begin_step, observe, mark_phase and end_step on the training thread; flush,
 * counters and notices from any thread; destroy once, from the owning thread. Scaler and
 * override callbacks are called on the training thread from begin_step; the scaler's `scale`
 * callback also from the agent's sender thread (for the Hello of each new stream); the
 * overrides' `capable_layers` only during ampscope_agent_attach_overrides (and
 * ampscope_agent_attach_gemm_precision, whose `replace` and recipe `schedule` callbacks run
 * from begin_step too).
 */
#ifndef AMPSCOPE_AGENT_C_API_H_
#define AMPSCOPE_AGENT_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define AMPSCOPE_API __attribute__((visibility("default")))
#else
#define AMPSCOPE_API
#endif

/* The ABI this header describes; ampscope_agent_abi_version() returns the library's.
 *   1  the first versioned layouts (AMPSCOPE_*_SIZE_V1)
 *   2  tensor view: has_held/held; run info: min_scale, max_scale, hysteresis; step info:
 *      fp32_layers; ampscope_overrides_ops and ampscope_agent_attach_overrides
 *   3  counters: refused_calls; ampscope_agent_add_notice; ampscope_agent_wanted; the
 *      loss-scale rules (ampscope_loss_scale_*), so that a caller's own scaler runs the
 *      built-in one's rules
 *   4  the per-step policy agreement of a multi-rank run: ampscope_agent_policy_vote and
 *      ampscope_agent_policy_agreed
 *   5  counters: lockstep_timeouts (agent options policy_lockstep, policy_lockstep_timeout_ms)
 *   6  fused statistics: ampscope_tensor_stats, ampscope_agent_observe_stats,
 *      ampscope_agent_stats_target, ampscope_compute_stats, ampscope_scale_and_compute_stats
 *   7  FP8/FP6/FP4 runs: quantisers (ampscope_quantizer, ampscope_recipe_counts,
 *      ampscope_agent_observe_quantizer, ampscope_agent_observe_quantizer_counts,
 *      ampscope_count_recipe); per-layer precision (ampscope_recipe_ops,
 *      ampscope_recipe_change, ampscope_agent_attach_gemm_precision); step info: bf16_gemms
 *   8  quantizer: has_loss_cost/loss_cost */
#define AMPSCOPE_AGENT_ABI_VERSION 8u

/* Whether a struct `ptr` of type `type` carries `field` (its struct_size covers it). */
#define AMPSCOPE_STRUCT_HAS(type, ptr, field) \
  ((size_t)(ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* struct_size set, everything else zero (in C++ without -Wmissing-field-initializers noise). */
#ifdef __cplusplus
#define AMPSCOPE_STRUCT_INIT_(type) \
  ([] { type s_{}; s_.struct_size = (uint32_t)sizeof(type); return s_; }())
#else
#define AMPSCOPE_STRUCT_INIT_(type) {.struct_size = (uint32_t)sizeof(type)}
#endif

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

/* Formats, roles, phases, devices and scaler kinds have the numbers of ampscope::Format,
 * TensorRole, TensorPhase, Device and ScalerKind (ampscope/vocabulary.h, ampscope/formats.h).
 * Struct fields and arguments that take them are int32_t, so that any number a caller passes
 * is read safely and an unknown one is refused with AMPSCOPE_INVALID_ARGUMENT. */
typedef enum ampscope_format {
  AMPSCOPE_FORMAT_FP32 = 0,
  AMPSCOPE_FORMAT_FP16 = 1,
  AMPSCOPE_FORMAT_BF16 = 2,
  AMPSCOPE_FORMAT_E4M3 = 3,
  AMPSCOPE_FORMAT_E5M2 = 4,
  /* OCP Microscaling v1.0 elements (FP4, FP6): stats targets and compute formats, not storage
   * the statistics read. A library older than these values refuses them with
   * AMPSCOPE_INVALID_ARGUMENT. */
  AMPSCOPE_FORMAT_E2M1 = 5,
  AMPSCOPE_FORMAT_E3M2 = 6,
  AMPSCOPE_FORMAT_E2M3 = 7
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

typedef enum ampscope_device { AMPSCOPE_DEVICE_CPU = 0, AMPSCOPE_DEVICE_CUDA = 1 } ampscope_device;

/* The loss-scale rule of the run's scaler (ampscope/loss_scale.h): a constant scale, PyTorch
 * GradScaler's, or Megatron-LM's with hysteresis. */
typedef enum ampscope_scaler_kind {
  AMPSCOPE_SCALER_STATIC = 0,
  AMPSCOPE_SCALER_DYNAMIC = 1,
  AMPSCOPE_SCALER_HYSTERESIS = 2
} ampscope_scaler_kind;

typedef enum ampscope_step_phase {
  AMPSCOPE_STEP_PHASE_FORWARD = 0,
  AMPSCOPE_STEP_PHASE_BACKWARD = 1,
  AMPSCOPE_STEP_PHASE_UNSCALE_CHECK = 2,
  AMPSCOPE_STEP_PHASE_OPTIMIZER = 3
} ampscope_step_phase;

typedef struct ampscope_agent_config ampscope_agent_config;
typedef struct ampscope_agent ampscope_agent;

/* The run as the Hello reports it. Zero in a scaler field: the default of the C++ API
 * (ampscope::agent::ScalerSettings: scale 65536, x2, x0.5, 2000 steps, no hysteresis, no
 * bounds). The scaler fields are ignored once a scaler control is attached. */
typedef struct ampscope_run_info {
  uint32_t struct_size;   /* AMPSCOPE_RUN_INFO_INIT */
  const char* host;       /* NULL or "": gethostname() */
  const char* trainer;    /* "mytrainer 1.0" */
  const char* precision;  /* "amp-fp16" */
  int32_t compute_format; /* ampscope_format */
  double loss_scale;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int32_t scaler_kind;    /* ampscope_scaler_kind */
  /* ABI 2 */
  double min_scale;       /* 0: none */
  double max_scale;       /* 0: none */
  int32_t hysteresis;     /* overflows tolerated before backing off (kind HYSTERESIS); 0: none */
} ampscope_run_info;
#define AMPSCOPE_RUN_INFO_INIT AMPSCOPE_STRUCT_INIT_(ampscope_run_info)
#define AMPSCOPE_RUN_INFO_SIZE_V1 offsetof(ampscope_run_info, min_scale)

/* data: numel elements of `dtype` storage in host memory (device memory on
 * AMPSCOPE_DEVICE_CUDA, ordered on `stream`, a cudaStream_t). shape may be NULL with rank 0
 * and numel set. */
typedef struct ampscope_tensor_view {
  uint32_t struct_size;  /* AMPSCOPE_TENSOR_VIEW_INIT */
  const char* name;      /* NUL-terminated, any bytes: escaped where not UTF-8 text */
  int32_t role;          /* ampscope_role */
  int32_t phase;         /* ampscope_phase */
  int32_t dtype;         /* ampscope_format */
  const void* data;
  const int64_t* shape;
  int rank;
  int64_t numel;   /* used when shape is NULL */
  int32_t device;  /* ampscope_device */
  void* stream;
  double scale;    /* the loss scale the values carry; 0 is read as 1 (unscaled) */
  int micro_step;
  int order;       /* execution order within the step, from 0 */
  /* ABI 2. For gradients: the narrowest format the values really pass through (where they can
   * overflow), when it is not the run's compute format; e.g. FP32 for weight gradients that
   * are accumulated in FP32. has_held == 0: not said (the compute format is assumed). */
  int has_held;
  int32_t held;  /* ampscope_format */
} ampscope_tensor_view;
#define AMPSCOPE_TENSOR_VIEW_INIT AMPSCOPE_STRUCT_INIT_(ampscope_tensor_view)
#define AMPSCOPE_TENSOR_VIEW_SIZE_V1 offsetof(ampscope_tensor_view, has_held)

typedef struct ampscope_step_info {
  uint32_t struct_size;  /* AMPSCOPE_STEP_INFO_INIT */
  int64_t step;
  double loss;
  double loss_scale;     /* used this step; 0 is read as 1 */
  double scale_after;    /* after the scaler's update; 0 is read as 1 */
  int found_inf;
  int skipped;
  double grad_norm;
  double lr;
  int64_t tokens;
  double step_time_s;
  int64_t optimizer_steps;
  int has_val_loss;      /* nonzero: val_loss holds the validation loss after this step */
  double val_loss;
  /* ABI 2: the layers computed in FP32 this step (num_fp32_layers names; NULL when none). */
  const char* const* fp32_layers;
  size_t num_fp32_layers;
  /* ABI 7: FP8/FP4 runs, the layers of the GEMM overrides (ampscope_agent_attach_gemm_precision)
   * whose GEMMs ran in BF16 this step instead of the run's recipe (num_bf16_gemms names; NULL
   * when none). */
  const char* const* bf16_gemms;
  size_t num_bf16_gemms;
} ampscope_step_info;
#define AMPSCOPE_STEP_INFO_INIT AMPSCOPE_STRUCT_INIT_(ampscope_step_info)
#define AMPSCOPE_STEP_INFO_SIZE_V1 offsetof(ampscope_step_info, fp32_layers)

/* A scaler change as the schedule callback receives it (the library fills it; struct_size is
 * the library's): has_* says which fields are set. */
typedef struct ampscope_scaler_change {
  uint32_t struct_size;
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
#define AMPSCOPE_SCALER_CHANGE_SIZE_V1 sizeof(ampscope_scaler_change)

/* Applies `change` from effective_from_step on (the agent calls it from begin_step of that
 * step). Returns 0 when accepted; otherwise writes a one-line reason (NUL-terminated, at most
 * reason_size bytes) and returns non-zero. */
typedef int (*ampscope_scaler_schedule_fn)(void* user, const ampscope_scaler_change* change,
                                           char* reason, size_t reason_size);
/* The current loss scale (reported to the server; also the base for bounds checks). */
typedef double (*ampscope_scaler_scale_fn)(void* user);

typedef struct ampscope_scaler_ops {
  uint32_t struct_size;  /* AMPSCOPE_SCALER_OPS_INIT */
  ampscope_scaler_schedule_fn schedule;
  ampscope_scaler_scale_fn scale;
  /* Bounds the agent checks updates against; 0: the run info's. */
  double min_scale;
  double max_scale;
} ampscope_scaler_ops;
#define AMPSCOPE_SCALER_OPS_INIT AMPSCOPE_STRUCT_INIT_(ampscope_scaler_ops)
#define AMPSCOPE_SCALER_OPS_SIZE_V1 sizeof(ampscope_scaler_ops)

/* The layers the trainer can compute in FP32 (the names a policy's FP32 fallback may use):
 * writes at most `capacity` names to names[0..capacity) and returns how many there are in
 * all. The agent calls it with capacity 0, then with room for them all, and copies the names
 * before attach returns. */
typedef size_t (*ampscope_overrides_capable_fn)(void* user, const char** names,
                                                size_t capacity);
/* Makes layers[0..num_layers) exactly the FP32 set from `from_step` on (the agent calls it from
 * begin_step of that step). Returns 0 when accepted; otherwise writes a one-line reason
 * (NUL-terminated, at most reason_size bytes), changes nothing and returns non-zero. */
typedef int (*ampscope_overrides_replace_fn)(void* user, const char* const* layers,
                                             size_t num_layers, int64_t from_step, char* reason,
                                             size_t reason_size);

/* ABI 2. */
typedef struct ampscope_overrides_ops {
  uint32_t struct_size;  /* AMPSCOPE_OVERRIDES_OPS_INIT */
  ampscope_overrides_capable_fn capable_layers;
  ampscope_overrides_replace_fn replace;
} ampscope_overrides_ops;
#define AMPSCOPE_OVERRIDES_OPS_INIT AMPSCOPE_STRUCT_INIT_(ampscope_overrides_ops)
#define AMPSCOPE_OVERRIDES_OPS_SIZE_V1 sizeof(ampscope_overrides_ops)

/* ABI 7. A change to the delayed scaling recipe of every quantiser of an FP8 run (Transformer
 * Engine's amax_history_len and margin), as the schedule callback receives it (the library
 * fills it; struct_size is the library's): has_* says which fields are set. */
typedef struct ampscope_recipe_change {
  uint32_t struct_size;
  int64_t effective_from_step;
  int has_amax_history_length;
  int32_t amax_history_length; /* [1, 1024] */
  int has_margin;
  int32_t margin;              /* binades, [0, 64] */
} ampscope_recipe_change;
#define AMPSCOPE_RECIPE_CHANGE_SIZE_V1 sizeof(ampscope_recipe_change)

/* Applies `change` from effective_from_step on (the agent calls it from begin_step of that
 * step). Returns 0 when accepted; otherwise writes a one-line reason (NUL-terminated, at most
 * reason_size bytes), changes nothing and returns non-zero. */
typedef int (*ampscope_recipe_schedule_fn)(void* user, const ampscope_recipe_change* change,
                                           char* reason, size_t reason_size);

/* ABI 7. The run's scaling recipe as the policy may steer it. */
typedef struct ampscope_recipe_ops {
  uint32_t struct_size; /* AMPSCOPE_RECIPE_OPS_INIT */
  /* Nonzero: the run uses delayed scaling, whose history length and margin schedule may
   * change; zero: such an update is refused without calling schedule. A field, not a
   * callback: the agent checks updates on its own thread, where no callback runs. */
  int delayed;
  ampscope_recipe_schedule_fn schedule;
} ampscope_recipe_ops;
#define AMPSCOPE_RECIPE_OPS_INIT AMPSCOPE_STRUCT_INIT_(ampscope_recipe_ops)
#define AMPSCOPE_RECIPE_OPS_SIZE_V1 sizeof(ampscope_recipe_ops)

/* ABI 7. A quantiser: a GEMM input under a scaled FP8/FP6/FP4 recipe (ampscope/recipe.h), as
 * ampscope_agent_observe_quantizer takes it next to the tensor it quantises. */
typedef struct ampscope_quantizer {
  uint32_t struct_size; /* AMPSCOPE_QUANTIZER_INIT */
  /* The recipe as `ampscope stats --target` takes it: "mxfp8_e4m3", "nvfp4", "e4m3:current",
   * "e4m3:scale=112.5", "e4m3:tile=1x128" (a delayed recipe is its scale: e4m3:scale=S). */
  const char* recipe;
  /* The linear layer whose GEMM it feeds, one of the GEMM overrides' capable layers
   * (QuantizerStats.layer); NULL or "": none the policy can move. */
  const char* layer;
  /* Nonzero: the GEMM ran in BF16 and the counts say what the recipe would have done to its
   * input (QuantizerStats.what_if). */
  int what_if;
  /* Delayed scaling: the amax history the scale came from, oldest first (the newest 1024 are
   * sent); NULL with length 0 for other recipes. */
  const float* amax_history;
  size_t amax_history_length;
  /* ABI 8. Nonzero: loss_cost carries the first-order loss change this recipe causes through
   * its layer's output on this step, nats (QuantizerStats.loss_cost: the sum over the output of
   * dL/dY * (Y_recipe - Y), the loss gradient unscaled; docs/trainer.md "Loss cost"), finite.
   * The server's GEMM precision policy ranks layers by it where it is given. */
  int has_loss_cost;
  double loss_cost;
} ampscope_quantizer;
#define AMPSCOPE_QUANTIZER_INIT AMPSCOPE_STRUCT_INIT_(ampscope_quantizer)
#define AMPSCOPE_QUANTIZER_SIZE_V1 offsetof(ampscope_quantizer, has_loss_cost)

typedef struct ampscope_agent_counters {
  uint32_t struct_size;  /* AMPSCOPE_AGENT_COUNTERS_INIT; on return, the bytes written */
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
  /* ABI 3: step calls refused by the threading contract (re-entry from a callback). */
  uint64_t refused_calls;
  /* ABI 5: policy_lockstep waits given up (timeout, or the stream to the server lost). */
  uint64_t lockstep_timeouts;
} ampscope_agent_counters;
#define AMPSCOPE_AGENT_COUNTERS_INIT AMPSCOPE_STRUCT_INIT_(ampscope_agent_counters)
#define AMPSCOPE_AGENT_COUNTERS_SIZE_V1 offsetof(ampscope_agent_counters, refused_calls)

/* ABI 3. A loss-scale rule (ampscope/loss_scale.h): everything of a scaler's configuration but
 * the scale. Fill it with ampscope_loss_scale_defaults, then change fields. */
typedef struct ampscope_loss_scale_rule {
  uint32_t struct_size;     /* AMPSCOPE_LOSS_SCALE_RULE_INIT */
  int32_t kind;             /* ampscope_scaler_kind */
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int32_t hysteresis;       /* kind HYSTERESIS */
  float min_scale;          /* 0: no floor */
  float max_scale;          /* the largest finite FP32: no ceiling */
} ampscope_loss_scale_rule;
#define AMPSCOPE_LOSS_SCALE_RULE_INIT AMPSCOPE_STRUCT_INIT_(ampscope_loss_scale_rule)
#define AMPSCOPE_LOSS_SCALE_RULE_SIZE_V1 sizeof(ampscope_loss_scale_rule)

/* ABI 3. A scaler's moving state: plain data of a fixed layout (16 bytes), no struct_size. */
typedef struct ampscope_loss_scale_state {
  float scale;
  int32_t hysteresis_tracker;
  int64_t growth_tracker;
} ampscope_loss_scale_state;

/* ABI 6. A what-if question (ampscope/tensor_stats.h TargetSpec): values times 2^scale_log2
 * rounded into `format` (ampscope_format). Plain data of a fixed layout, no struct_size. */
typedef struct ampscope_target {
  int32_t format;
  int32_t scale_log2;
} ampscope_target;

/* ABI 6. The exact counts of one target: how many finite nonzero values overflow, underflow or
 * become subnormal (ampscope/tensor_stats.h). Fixed layout, no struct_size. */
typedef struct ampscope_target_counts {
  ampscope_target target;
  uint64_t overflow;
  uint64_t underflow;
  uint64_t subnormal;
} ampscope_target_counts;

/* Bins of the binade histogram: binades -149 (the smallest FP32 subnormal) to 127. */
#define AMPSCOPE_HISTOGRAM_BINS 277

/* ABI 6. A tensor's full statistics (ampscope/tensor_stats.h TensorStats; docs/statistics.md):
 * counts, extrema and sums over finite values, the binade histogram (histogram_counts[i]
 * values with floor(log2|x|) == histogram_min_exponent + i) and per-target counts. The arrays
 * are the caller's. Read by ampscope_agent_observe_stats (histogram_bins and num_targets
 * entries); filled by ampscope_compute_stats and ampscope_scale_and_compute_stats, which read
 * the targets to count from targets[i].target and need room for AMPSCOPE_HISTOGRAM_BINS
 * counts in histogram_counts. */
typedef struct ampscope_tensor_stats {
  uint32_t struct_size;  /* AMPSCOPE_TENSOR_STATS_INIT */
  uint32_t num_targets;  /* entries of `targets` */
  uint64_t numel;
  uint64_t zeros;
  uint64_t nan;
  uint64_t pos_inf;
  uint64_t neg_inf;
  double max_abs;          /* largest finite |x|; 0 when none */
  double min_abs_nonzero;  /* smallest finite nonzero |x|; 0 when none */
  double sum;              /* of finite values, exactly rounded to FP64 */
  double sum_sq;           /* of their squares, the same */
  int32_t histogram_min_exponent;
  uint32_t histogram_bins;  /* entries of histogram_counts in use; 0 without finite nonzero values */
  uint64_t* histogram_counts;
  ampscope_target_counts* targets;
} ampscope_tensor_stats;
#define AMPSCOPE_TENSOR_STATS_INIT AMPSCOPE_STRUCT_INIT_(ampscope_tensor_stats)
#define AMPSCOPE_TENSOR_STATS_SIZE_V1 sizeof(ampscope_tensor_stats)

/* ABI 7. One tensor's counts under a scaled recipe (ampscope/recipe.h RecipeCounts; the rules
 * in docs/numerics.md), the recipe itself given as text beside it: finite values, non-finite
 * inputs, underflow, subnormal, saturated and overflow counts, amax, the SQNR's sums, the
 * per-tensor scale (current, delayed; NVFP4's tensor decode scale), block counts and the block
 * decode scales' binade histogram (scale_histogram_counts[i] blocks with
 * floor(log2 scale) == scale_histogram_min_exponent + i). The array is the caller's. Filled by
 * ampscope_count_recipe, which needs room for AMPSCOPE_HISTOGRAM_BINS counts; read by
 * ampscope_agent_observe_quantizer_counts (scale_histogram_bins entries). */
typedef struct ampscope_recipe_counts {
  uint32_t struct_size;          /* AMPSCOPE_RECIPE_COUNTS_INIT */
  uint32_t scale_histogram_bins; /* entries of scale_histogram_counts in use */
  uint64_t values;
  uint64_t nonfinite;
  uint64_t underflow;
  uint64_t subnormal;
  uint64_t saturated;
  uint64_t overflow;
  double amax;
  double signal_sq;
  double error_sq;
  double tensor_scale;
  uint64_t blocks;
  uint64_t zero_blocks;
  uint64_t saturated_blocks;
  uint64_t nan_blocks;
  int32_t scale_histogram_min_exponent;
  uint64_t* scale_histogram_counts;
} ampscope_recipe_counts;
#define AMPSCOPE_RECIPE_COUNTS_INIT AMPSCOPE_STRUCT_INIT_(ampscope_recipe_counts)
#define AMPSCOPE_RECIPE_COUNTS_SIZE_V1 sizeof(ampscope_recipe_counts)

/* The library's AMPSCOPE_AGENT_ABI_VERSION (it may be newer than the caller's header). */
AMPSCOPE_API uint32_t ampscope_agent_abi_version(void);
AMPSCOPE_API const char* ampscope_status_string(ampscope_status status);
AMPSCOPE_API const char* ampscope_agent_version(void);

AMPSCOPE_API ampscope_status ampscope_agent_config_create(ampscope_agent_config** out);
AMPSCOPE_API void ampscope_agent_config_destroy(ampscope_agent_config* config);
/* key/value as set_option in config.h ("server", "run_id", "sample_full_every", ...). */
AMPSCOPE_API ampscope_status ampscope_agent_config_set(ampscope_agent_config* config,
                                                       const char* key, const char* value);
AMPSCOPE_API ampscope_status ampscope_agent_config_apply_env(ampscope_agent_config* config);
AMPSCOPE_API const char* ampscope_agent_config_last_error(const ampscope_agent_config* config);

/* On failure *out is NULL and ampscope_agent_config_last_error(config) says why. */
AMPSCOPE_API ampscope_status ampscope_agent_create(ampscope_agent_config* config,
                                                   const ampscope_run_info* run,
                                                   ampscope_agent** out);
/* Shuts down (waiting up to timeout_ms for acknowledgements) and frees. NULL is a no-op. */
AMPSCOPE_API ampscope_status ampscope_agent_destroy(ampscope_agent* agent, int64_t timeout_ms);

/* Optional, before the first step: `ops` is copied; `user` is passed back to the callbacks and
 * must stay valid until destroy. NULL ops detaches. */
AMPSCOPE_API ampscope_status ampscope_agent_attach_scaler(ampscope_agent* agent,
                                                          const ampscope_scaler_ops* ops,
                                                          void* user);
/* ABI 2. Optional, before the first step, as attach_scaler: enables the policy's FP32
 * fallback (Hello.fp32_capable_layers and PolicyUpdate.fp32_tensors). */
AMPSCOPE_API ampscope_status ampscope_agent_attach_overrides(ampscope_agent* agent,
                                                             const ampscope_overrides_ops* ops,
                                                             void* user);
/* ABI 7. Optional, before the first step, as attach_scaler: per-layer precision of an FP8/FP4
 * run. `gemms` (with `gemms_user`) is the set of linear layers whose GEMMs run in BF16 instead
 * of the recipe: its capable_layers are Hello.bf16_capable_gemms, its replace takes
 * PolicyUpdate.bf16_gemms (the complete BF16 set from from_step on). `recipe` (with
 * `recipe_user`) takes a delayed recipe's history length and margin (PolicyUpdate.
 * amax_history_length, amax_margin). Either may be NULL; both NULL detaches. Callbacks run as
 * the overrides' do: capable_layers during this call, replace and schedule on the training
 * thread from begin_step. */
AMPSCOPE_API ampscope_status ampscope_agent_attach_gemm_precision(
    ampscope_agent* agent, const ampscope_overrides_ops* gemms, void* gemms_user,
    const ampscope_recipe_ops* recipe, void* recipe_user);

/* Returns 1 when ampscope_agent_observe calls are wanted this step, else 0 (also on error). */
AMPSCOPE_API int ampscope_agent_begin_step(ampscope_agent* agent, int64_t step);
AMPSCOPE_API ampscope_status ampscope_agent_observe(ampscope_agent* agent,
                                                    const ampscope_tensor_view* view);
/* ABI 3. What ampscope_agent_observe of a tensor of `role` (ampscope_role) shown in `phase`
 * (ampscope_phase) would measure at this point of the step: 0 nothing, 1 counts, 2 full
 * statistics; 0 outside a step, on a bad argument and when refused. For skipping the
 * preparation of tensors nothing would measure; it can rise within a step (the first
 * non-finite value escalates the rest of it). */
AMPSCOPE_API int ampscope_agent_wanted(ampscope_agent* agent, int32_t role, int32_t phase);
/* ABI 6. Fused statistics (agent.h, Agent::observe_stats): a tensor whose full statistics the
 * caller computed in a pass it makes anyway (ampscope_scale_and_compute_stats in its unscale),
 * recorded as ampscope_agent_observe of its data would record them; view->data may be NULL.
 * The stats must count the target ampscope_agent_stats_target names. Statistics that cannot
 * be the view's (numel, counts, histogram, extrema, sums) are AMPSCOPE_INVALID_ARGUMENT with a
 * notice, and nothing is recorded. */
AMPSCOPE_API ampscope_status ampscope_agent_observe_stats(ampscope_agent* agent,
                                                          const ampscope_tensor_view* view,
                                                          const ampscope_tensor_stats* stats);
/* ABI 6. Returns 1 and writes *target when ampscope_agent_observe of `view` (its data not
 * read) would measure it at this point of the step: the target its full statistics count.
 * 0 when nothing would measure it, outside a step, on a bad argument and when refused. */
AMPSCOPE_API int ampscope_agent_stats_target(ampscope_agent* agent,
                                             const ampscope_tensor_view* view,
                                             ampscope_target* target);
/* ABI 7. A quantiser (agent.h, Agent::observe_quantizer) the agent counts itself: `tensor`
 * (name, role, phase, micro_step; dtype fp32, fp16, bf16, e4m3 or e5m2 storage in host
 * memory, rows of the shape's last dimension, one row without a shape or with rank 1) counted
 * against quantizer->recipe with recipe_counts, as `ampscope stats --target RECIPE` counts a
 * file, and recorded with the quantiser's layer, what_if and amax history. The recipe is
 * parsed on every call (a bad one is AMPSCOPE_INVALID_ARGUMENT naming it); the data is read
 * only on a step whose begin_step returned 1 (elsewhere nothing is recorded and data may be
 * NULL). A device tensor is AMPSCOPE_INVALID_ARGUMENT: copy it to the host. Counting runs on
 * the calling thread, one pass over the tensor. */
AMPSCOPE_API ampscope_status ampscope_agent_observe_quantizer(ampscope_agent* agent,
                                                              const ampscope_tensor_view* tensor,
                                                              const ampscope_quantizer* quantizer);
/* ABI 7. The same with counts the caller has already (its own quantise pass, or
 * ampscope_count_recipe on another thread): tensor->data is not read and may be NULL. Counts
 * that break the server's rules (Agent::observe_quantizer's checks) are
 * AMPSCOPE_INVALID_ARGUMENT with a notice, on steps that record only. */
AMPSCOPE_API ampscope_status ampscope_agent_observe_quantizer_counts(
    ampscope_agent* agent, const ampscope_tensor_view* tensor,
    const ampscope_quantizer* quantizer, const ampscope_recipe_counts* counts);
AMPSCOPE_API ampscope_status ampscope_agent_mark_phase(ampscope_agent* agent,
                                                       int32_t phase /* ampscope_step_phase */);
AMPSCOPE_API ampscope_status ampscope_agent_end_step(ampscope_agent* agent,
                                                     const ampscope_step_info* info);

AMPSCOPE_API ampscope_status ampscope_agent_flush(ampscope_agent* agent, int64_t timeout_ms);
AMPSCOPE_API ampscope_status ampscope_agent_get_counters(const ampscope_agent* agent,
                                                         ampscope_agent_counters* out);
/* The number of notices so far; ampscope_agent_notice(agent, i) returns the i-th (or NULL). */
AMPSCOPE_API size_t ampscope_agent_notice_count(const ampscope_agent* agent);
AMPSCOPE_API const char* ampscope_agent_notice(ampscope_agent* agent, size_t index);
AMPSCOPE_API const char* ampscope_agent_last_error(const ampscope_agent* agent);
/* ABI 3. A notice from the caller ("torch: hook on h0.mlp failed: ..."), reported once in the
 * next report and listed by ampscope show, like the agent's own; any bytes, sent as UTF-8 text
 * of at most 512 bytes (invalid UTF-8 and control characters escaped as \xHH, as tensor names
 * are). Any thread. AMPSCOPE_INVALID_ARGUMENT when NULL or empty. */
AMPSCOPE_API ampscope_status ampscope_agent_add_notice(ampscope_agent* agent, const char* text);

/* ABI 4. The per-step policy agreement of a multi-rank run (option policy_agreement=per_step;
 * docs/multi-rank.md). Once per step, after the step's gradients are checked and before the
 * next begin_step: take this rank's vote, reduce the votes of every rank with one max
 * all-reduce of {-received_seq, fallback} (fused with the found_inf reduction where there is
 * one), and hand the lowest seq and "any fallback" back to every rank. The next begin_step
 * applies the updates up to that seq, and falls back, on every rank alike. Any thread.
 * policy_agreed: AMPSCOPE_FAILED_PRECONDITION unless the mode is per_step,
 * AMPSCOPE_INVALID_ARGUMENT when received_seq is above what this rank received. */
AMPSCOPE_API ampscope_status ampscope_agent_policy_vote(ampscope_agent* agent,
                                                        uint64_t* received_seq, int* fallback);
AMPSCOPE_API ampscope_status ampscope_agent_policy_agreed(ampscope_agent* agent,
                                                          uint64_t received_seq, int fallback);

/* ABI 3. The loss-scale rules, as the built-in trainer and the CUDA kernel run them. They need
 * no agent; on failure `reason` (when not NULL; NUL-terminated, at most reason_size bytes)
 * says why.
 * defaults: the rule and starting state of a kind: STATIC and DYNAMIC PyTorch GradScaler's
 * (scale 2^16, x2, x0.5, every 2000 steps), HYSTERESIS Megatron-LM's (2^32, x2, x0.5, every
 * 1000 steps, hysteresis 2, min 1). rule->struct_size must be set (its _INIT macro). */
AMPSCOPE_API ampscope_status ampscope_loss_scale_defaults(int32_t kind,
                                                          ampscope_loss_scale_rule* rule,
                                                          ampscope_loss_scale_state* state);
/* One update after an effective batch, found_inf nonzero when its gradients held an Inf/NaN. */
AMPSCOPE_API ampscope_status ampscope_loss_scale_update(ampscope_loss_scale_state* state,
                                                        const ampscope_loss_scale_rule* rule,
                                                        int found_inf);
/* Applies a change (the has_* fields that are set) to *rule and *state, validated as the
 * built-in trainer validates a policy update: on failure both are unchanged. The change's
 * effective_from_step is not read. */
AMPSCOPE_API ampscope_status ampscope_loss_scale_apply_change(ampscope_loss_scale_rule* rule,
                                                              ampscope_loss_scale_state* state,
                                                              const ampscope_scaler_change* change,
                                                              char* reason, size_t reason_size);

/* ABI 6. Tensor statistics; they need no agent. `data`: n elements of `dtype` storage
 * (AMPSCOPE_FORMAT_FP32, FP16, BF16, or E4M3/E5M2: one byte each) in host memory. `out`:
 * struct_size set, its targets (num_targets of them, at most 64) say what to count,
 * histogram_counts has room for AMPSCOPE_HISTOGRAM_BINS. On failure `reason` (when not NULL;
 * NUL-terminated, at most reason_size bytes) says why. scale_and_compute_stats reads the first
 * three only. Multi-threaded on large tensors (the library's pool).
 * compute_stats: the statistics of the values. scale_and_compute_stats: multiplies each value
 * by `factor` in place (FP32 product, rounded to nearest even into dtype) and returns the
 * statistics of the results, in one pass over memory: a gradient unscale (factor 1/scale)
 * fused with its statistics. */
AMPSCOPE_API ampscope_status ampscope_compute_stats(const void* data, uint64_t n, int32_t dtype,
                                                    ampscope_tensor_stats* out, char* reason,
                                                    size_t reason_size);
AMPSCOPE_API ampscope_status ampscope_scale_and_compute_stats(void* data, uint64_t n,
                                                              int32_t dtype, float factor,
                                                              ampscope_tensor_stats* out,
                                                              char* reason, size_t reason_size);

/* ABI 7. A tensor's counts under a scaled recipe (ampscope/recipe.h recipe_counts; needs no
 * agent): n elements of `dtype` storage (fp32, fp16, bf16, e4m3 or e5m2) in host memory, in
 * rows of row_length elements (0: one row; it must divide n), against `recipe` (text as
 * ampscope_quantizer.recipe). `out`: struct_size set, scale_histogram_counts with room for
 * AMPSCOPE_HISTOGRAM_BINS. On failure `reason` (when not NULL; NUL-terminated, at most
 * reason_size bytes) says why. One thread, two passes over the data. */
AMPSCOPE_API ampscope_status ampscope_count_recipe(const void* data, uint64_t n, int32_t dtype,
                                                   uint64_t row_length, const char* recipe,
                                                   ampscope_recipe_counts* out, char* reason,
                                                   size_t reason_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* AMPSCOPE_AGENT_C_API_H_ */
