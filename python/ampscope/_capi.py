"""libampscope_agent.so through ctypes: the C API's structs, functions and constants
(ampscope/agent/c_api.h, ABI 7), and where the library is found.

The library is looked up, in order: the AMPSCOPE_AGENT_LIBRARY environment variable (a path);
next to this package (ampscope/_lib/, where `cmake --install` puts it); the system's library
path (ctypes.util.find_library). Functions are called through ctypes.CDLL, which releases the
GIL for the call, so the agent's callbacks (which take the GIL) can run while another Python
thread waits in the agent.
"""

import ctypes
import ctypes.util
import os

# The ABI this module declares (AMPSCOPE_AGENT_ABI_VERSION of the header it mirrors). A library
# with a lower version lacks functions or fields used here and is refused.
ABI_VERSION = 8

OK, INVALID_ARGUMENT, UNAVAILABLE, DEADLINE_EXCEEDED, FAILED_PRECONDITION, INTERNAL = range(6)

(FORMAT_FP32, FORMAT_FP16, FORMAT_BF16, FORMAT_E4M3, FORMAT_E5M2, FORMAT_E2M1, FORMAT_E3M2,
 FORMAT_E2M3) = range(8)
(ROLE_WEIGHT, ROLE_MASTER_WEIGHT, ROLE_ACTIVATION, ROLE_ACTIVATION_GRAD, ROLE_WEIGHT_GRAD,
 ROLE_OPTIMIZER_STATE, ROLE_LOSS) = range(7)
PHASE_UNKNOWN, PHASE_STEP_START, PHASE_FORWARD, PHASE_BACKWARD, PHASE_AFTER_UNSCALE = range(5)
DEVICE_CPU, DEVICE_CUDA = range(2)
SCALER_STATIC, SCALER_DYNAMIC, SCALER_HYSTERESIS = range(3)
STEP_PHASE_FORWARD, STEP_PHASE_BACKWARD, STEP_PHASE_UNSCALE_CHECK, STEP_PHASE_OPTIMIZER = range(4)

FORMAT_NAMES = {FORMAT_FP32: "fp32", FORMAT_FP16: "fp16", FORMAT_BF16: "bf16",
                FORMAT_E4M3: "e4m3", FORMAT_E5M2: "e5m2", FORMAT_E2M1: "e2m1",
                FORMAT_E3M2: "e3m2", FORMAT_E2M3: "e2m3"}
SCALER_KINDS = {"static": SCALER_STATIC, "dynamic": SCALER_DYNAMIC,
                "hysteresis": SCALER_HYSTERESIS}

_c_int32, _c_int64, _c_double = ctypes.c_int32, ctypes.c_int64, ctypes.c_double


class RunInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("host", ctypes.c_char_p),
        ("trainer", ctypes.c_char_p),
        ("precision", ctypes.c_char_p),
        ("compute_format", _c_int32),
        ("loss_scale", _c_double),
        ("growth_factor", _c_double),
        ("backoff_factor", _c_double),
        ("growth_interval", _c_int64),
        ("scaler_kind", _c_int32),
        ("min_scale", _c_double),
        ("max_scale", _c_double),
        ("hysteresis", _c_int32),
    ]


class TensorView(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("role", _c_int32),
        ("phase", _c_int32),
        ("dtype", _c_int32),
        ("data", ctypes.c_void_p),
        ("shape", ctypes.POINTER(_c_int64)),
        ("rank", ctypes.c_int),
        ("numel", _c_int64),
        ("device", _c_int32),
        ("stream", ctypes.c_void_p),
        ("scale", _c_double),
        ("micro_step", ctypes.c_int),
        ("order", ctypes.c_int),
        ("has_held", ctypes.c_int),
        ("held", _c_int32),
    ]


class StepInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("step", _c_int64),
        ("loss", _c_double),
        ("loss_scale", _c_double),
        ("scale_after", _c_double),
        ("found_inf", ctypes.c_int),
        ("skipped", ctypes.c_int),
        ("grad_norm", _c_double),
        ("lr", _c_double),
        ("tokens", _c_int64),
        ("step_time_s", _c_double),
        ("optimizer_steps", _c_int64),
        ("has_val_loss", ctypes.c_int),
        ("val_loss", _c_double),
        ("fp32_layers", ctypes.POINTER(ctypes.c_char_p)),
        ("num_fp32_layers", ctypes.c_size_t),
        ("bf16_gemms", ctypes.POINTER(ctypes.c_char_p)),
        ("num_bf16_gemms", ctypes.c_size_t),
    ]


class _LibraryFilled(ctypes.Structure):
    """A struct the library fills for a callback: its struct_size is the library's."""

    def has(self, field):
        """Whether the library's struct carries `field` (AMPSCOPE_STRUCT_HAS)."""
        f = getattr(type(self), field)
        return self.struct_size >= f.offset + f.size


class ScalerChange(_LibraryFilled):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("effective_from_step", _c_int64),
        ("has_scale", ctypes.c_int),
        ("scale", _c_double),
        ("has_growth_factor", ctypes.c_int),
        ("growth_factor", _c_double),
        ("has_backoff_factor", ctypes.c_int),
        ("backoff_factor", _c_double),
        ("has_growth_interval", ctypes.c_int),
        ("growth_interval", _c_int64),
        ("has_hysteresis", ctypes.c_int),
        ("hysteresis", ctypes.c_int),
        ("has_min_scale", ctypes.c_int),
        ("min_scale", _c_double),
        ("has_max_scale", ctypes.c_int),
        ("max_scale", _c_double),
    ]

    def fields(self):
        """The fields that are set, as a dict (effective_from_step not included)."""
        out = {}
        for name in ("scale", "growth_factor", "backoff_factor", "growth_interval",
                     "hysteresis", "min_scale", "max_scale"):
            if self.has(name) and getattr(self, "has_" + name):
                out[name] = getattr(self, name)
        return out


SCHEDULE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ScalerChange),
                               ctypes.c_void_p, ctypes.c_size_t)
SCALE_FN = ctypes.CFUNCTYPE(_c_double, ctypes.c_void_p)
CAPABLE_FN = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t)
REPLACE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p),
                              ctypes.c_size_t, _c_int64, ctypes.c_void_p, ctypes.c_size_t)


class RecipeChange(_LibraryFilled):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("effective_from_step", _c_int64),
        ("has_amax_history_length", ctypes.c_int),
        ("amax_history_length", _c_int32),
        ("has_margin", ctypes.c_int),
        ("margin", _c_int32),
    ]

    def settings(self):
        """(amax_history_length, margin), None for each one the change leaves alone."""
        length = (self.amax_history_length if self.has("amax_history_length")
                  and self.has_amax_history_length else None)
        margin = self.margin if self.has("margin") and self.has_margin else None
        return length, margin


RECIPE_SCHEDULE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(RecipeChange),
                                      ctypes.c_void_p, ctypes.c_size_t)


class ScalerOps(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("schedule", SCHEDULE_FN),
        ("scale", SCALE_FN),
        ("min_scale", _c_double),
        ("max_scale", _c_double),
    ]


class OverridesOps(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("capable_layers", CAPABLE_FN),
        ("replace", REPLACE_FN),
    ]


class RecipeOps(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("delayed", ctypes.c_int),
        ("schedule", RECIPE_SCHEDULE_FN),
    ]


class Quantizer(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("recipe", ctypes.c_char_p),
        ("layer", ctypes.c_char_p),
        ("what_if", ctypes.c_int),
        ("amax_history", ctypes.POINTER(ctypes.c_float)),
        ("amax_history_length", ctypes.c_size_t),
        ("has_loss_cost", ctypes.c_int),  # ABI 8
        ("loss_cost", ctypes.c_double),
    ]


class Counters(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64)
        for name in ("steps", "reports_spooled", "reports_acked", "dropped_reports",
                     "dropped_tensors", "rejected_reports", "spool_bytes", "reconnects",
                     "policies_applied", "policies_refused")
    ] + [("training_thread_s", _c_double), ("connected", ctypes.c_int),
         ("refused_calls", ctypes.c_uint64), ("lockstep_timeouts", ctypes.c_uint64)]

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_[1:]}


class LossScaleRule(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("kind", _c_int32),
        ("growth_factor", _c_double),
        ("backoff_factor", _c_double),
        ("growth_interval", _c_int64),
        ("hysteresis", _c_int32),
        ("min_scale", ctypes.c_float),
        ("max_scale", ctypes.c_float),
    ]


class LossScaleState(ctypes.Structure):
    _fields_ = [
        ("scale", ctypes.c_float),
        ("hysteresis_tracker", _c_int32),
        ("growth_tracker", _c_int64),
    ]


class Target(ctypes.Structure):
    _fields_ = [("format", _c_int32), ("scale_log2", _c_int32)]


class TargetCounts(ctypes.Structure):
    _fields_ = [
        ("target", Target),
        ("overflow", ctypes.c_uint64),
        ("underflow", ctypes.c_uint64),
        ("subnormal", ctypes.c_uint64),
    ]


HISTOGRAM_BINS = 277  # AMPSCOPE_HISTOGRAM_BINS: binades -149 to 127


class TensorStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_targets", ctypes.c_uint32),
        ("numel", ctypes.c_uint64),
        ("zeros", ctypes.c_uint64),
        ("nan", ctypes.c_uint64),
        ("pos_inf", ctypes.c_uint64),
        ("neg_inf", ctypes.c_uint64),
        ("max_abs", _c_double),
        ("min_abs_nonzero", _c_double),
        ("sum", _c_double),
        ("sum_sq", _c_double),
        ("histogram_min_exponent", _c_int32),
        ("histogram_bins", ctypes.c_uint32),
        ("histogram_counts", ctypes.POINTER(ctypes.c_uint64)),
        ("targets", ctypes.POINTER(TargetCounts)),
    ]


class RecipeCounts(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("scale_histogram_bins", ctypes.c_uint32),
    ] + [(name, ctypes.c_uint64) for name in ("values", "nonfinite", "underflow", "subnormal",
                                              "saturated", "overflow")] + [
        (name, _c_double) for name in ("amax", "signal_sq", "error_sq", "tensor_scale")
    ] + [(name, ctypes.c_uint64) for name in ("blocks", "zero_blocks", "saturated_blocks",
                                              "nan_blocks")] + [
        ("scale_histogram_min_exponent", _c_int32),
        ("scale_histogram_counts", ctypes.POINTER(ctypes.c_uint64)),
    ]


# Every struct of the header, for the layout test (tests/python compares with the C compiler).
STRUCTS = {
    "ampscope_run_info": RunInfo,
    "ampscope_tensor_view": TensorView,
    "ampscope_step_info": StepInfo,
    "ampscope_scaler_change": ScalerChange,
    "ampscope_scaler_ops": ScalerOps,
    "ampscope_overrides_ops": OverridesOps,
    "ampscope_agent_counters": Counters,
    "ampscope_loss_scale_rule": LossScaleRule,
    "ampscope_loss_scale_state": LossScaleState,
    "ampscope_target": Target,
    "ampscope_target_counts": TargetCounts,
    "ampscope_tensor_stats": TensorStats,
    "ampscope_recipe_change": RecipeChange,
    "ampscope_recipe_ops": RecipeOps,
    "ampscope_quantizer": Quantizer,
    "ampscope_recipe_counts": RecipeCounts,
}


def new(struct_type):
    """The *_INIT macro: struct_size set, the rest zero."""
    s = struct_type()
    s.struct_size = ctypes.sizeof(struct_type)
    return s


_p = ctypes.c_void_p
_FUNCTIONS = [
    ("ampscope_agent_abi_version", ctypes.c_uint32, []),
    ("ampscope_agent_version", ctypes.c_char_p, []),
    ("ampscope_status_string", ctypes.c_char_p, [ctypes.c_int]),
    ("ampscope_agent_config_create", ctypes.c_int, [ctypes.POINTER(_p)]),
    ("ampscope_agent_config_destroy", None, [_p]),
    ("ampscope_agent_config_set", ctypes.c_int, [_p, ctypes.c_char_p, ctypes.c_char_p]),
    ("ampscope_agent_config_apply_env", ctypes.c_int, [_p]),
    ("ampscope_agent_config_last_error", ctypes.c_char_p, [_p]),
    ("ampscope_agent_create", ctypes.c_int, [_p, ctypes.POINTER(RunInfo), ctypes.POINTER(_p)]),
    ("ampscope_agent_destroy", ctypes.c_int, [_p, _c_int64]),
    ("ampscope_agent_attach_scaler", ctypes.c_int, [_p, ctypes.POINTER(ScalerOps), _p]),
    ("ampscope_agent_attach_overrides", ctypes.c_int, [_p, ctypes.POINTER(OverridesOps), _p]),
    ("ampscope_agent_attach_gemm_precision", ctypes.c_int,
     [_p, ctypes.POINTER(OverridesOps), _p, ctypes.POINTER(RecipeOps), _p]),
    ("ampscope_agent_begin_step", ctypes.c_int, [_p, _c_int64]),
    ("ampscope_agent_observe", ctypes.c_int, [_p, ctypes.POINTER(TensorView)]),
    ("ampscope_agent_wanted", ctypes.c_int, [_p, _c_int32, _c_int32]),
    ("ampscope_agent_observe_stats", ctypes.c_int,
     [_p, ctypes.POINTER(TensorView), ctypes.POINTER(TensorStats)]),
    ("ampscope_agent_stats_target", ctypes.c_int,
     [_p, ctypes.POINTER(TensorView), ctypes.POINTER(Target)]),
    ("ampscope_compute_stats", ctypes.c_int,
     [_p, ctypes.c_uint64, _c_int32, ctypes.POINTER(TensorStats), ctypes.c_char_p,
      ctypes.c_size_t]),
    ("ampscope_scale_and_compute_stats", ctypes.c_int,
     [_p, ctypes.c_uint64, _c_int32, ctypes.c_float, ctypes.POINTER(TensorStats),
      ctypes.c_char_p, ctypes.c_size_t]),
    ("ampscope_agent_observe_quantizer", ctypes.c_int,
     [_p, ctypes.POINTER(TensorView), ctypes.POINTER(Quantizer)]),
    ("ampscope_agent_observe_quantizer_counts", ctypes.c_int,
     [_p, ctypes.POINTER(TensorView), ctypes.POINTER(Quantizer), ctypes.POINTER(RecipeCounts)]),
    ("ampscope_count_recipe", ctypes.c_int,
     [_p, ctypes.c_uint64, _c_int32, ctypes.c_uint64, ctypes.c_char_p,
      ctypes.POINTER(RecipeCounts), ctypes.c_char_p, ctypes.c_size_t]),
    ("ampscope_agent_mark_phase", ctypes.c_int, [_p, _c_int32]),
    ("ampscope_agent_end_step", ctypes.c_int, [_p, ctypes.POINTER(StepInfo)]),
    ("ampscope_agent_flush", ctypes.c_int, [_p, _c_int64]),
    ("ampscope_agent_get_counters", ctypes.c_int, [_p, ctypes.POINTER(Counters)]),
    ("ampscope_agent_notice_count", ctypes.c_size_t, [_p]),
    ("ampscope_agent_notice", ctypes.c_char_p, [_p, ctypes.c_size_t]),
    ("ampscope_agent_last_error", ctypes.c_char_p, [_p]),
    ("ampscope_agent_add_notice", ctypes.c_int, [_p, ctypes.c_char_p]),
    ("ampscope_agent_policy_vote", ctypes.c_int,
     [_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int)]),
    ("ampscope_agent_policy_agreed", ctypes.c_int, [_p, ctypes.c_uint64, ctypes.c_int]),
    ("ampscope_loss_scale_defaults", ctypes.c_int,
     [_c_int32, ctypes.POINTER(LossScaleRule), ctypes.POINTER(LossScaleState)]),
    ("ampscope_loss_scale_update", ctypes.c_int,
     [ctypes.POINTER(LossScaleState), ctypes.POINTER(LossScaleRule), ctypes.c_int]),
    ("ampscope_loss_scale_apply_change", ctypes.c_int,
     [ctypes.POINTER(LossScaleRule), ctypes.POINTER(LossScaleState),
      ctypes.POINTER(ScalerChange), ctypes.c_char_p, ctypes.c_size_t]),
]


class LibraryError(RuntimeError):
    """libampscope_agent.so could not be found or loaded, or is too old."""


def _candidates():
    env = os.environ.get("AMPSCOPE_AGENT_LIBRARY")
    if env:
        return [env]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib",
                        "libampscope_agent.so")
    out = [here] if os.path.exists(here) else []
    found = ctypes.util.find_library("ampscope_agent")
    if found:
        out.append(found)
    return out


_lib = None


def library():
    """The loaded library with its functions declared (loaded once per process)."""
    global _lib
    if _lib is not None:
        return _lib
    candidates = _candidates()
    if not candidates:
        raise LibraryError(
            "libampscope_agent.so not found: set AMPSCOPE_AGENT_LIBRARY to its path, or install "
            "ampscope (cmake --install BUILD_DIR)")
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        try:
            version = lib.ampscope_agent_abi_version()
        except AttributeError:
            errors.append(f"{path}: not libampscope_agent (no ampscope_agent_abi_version)")
            continue
        if version < ABI_VERSION:
            errors.append(f"{path}: ABI {version}, this package needs {ABI_VERSION} or later")
            continue
        for name, restype, argtypes in _FUNCTIONS:
            f = getattr(lib, name)
            f.restype, f.argtypes = restype, argtypes
        _lib = lib
        return lib
    raise LibraryError("libampscope_agent.so could not be loaded: " + "; ".join(errors))


def status_text(status):
    return library().ampscope_status_string(status).decode(errors="replace")
