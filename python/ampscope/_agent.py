"""One ampscope agent over the C API (libampscope_agent.so): the Python face of
ampscope_agent_*, with Python types, errors as exceptions where a caller can act on them
(creation) and statuses everywhere a training loop is running (the step calls never raise).

    agent = Agent(run_id="r1", server="127.0.0.1:50051", options={"sample_full_every": 10},
                  trainer="my-trainer 1.0", precision="amp-bf16",
                  compute_format=_capi.FORMAT_BF16)
    if agent.begin_step(0):
        agent.observe(name, role, phase, dtype, data_ptr, numel, ...)
    agent.end_step(step=0, loss=2.3, ...)
    agent.close(timeout_s=10)

Thread safety: the step calls may come from any thread (the agent serialises them); close()
once, after the last step call.
"""

import atexit
import contextlib
import ctypes
import os
import socket
import threading
import weakref

from . import _capi


class AgentError(RuntimeError):
    """The agent could not be created (its message says why)."""


def utf8(text):
    """`text` as the agent's C API takes it: UTF-8, lone surrogates included (as their UTF-8
    forms, which the agent sends escaped), so that no name or notice raises here."""
    return text.encode("utf-8", "surrogatepass")


def server_option(server):
    """`server` as the agent's `server` option: a str ("host:port", or several separated by
    commas), or a list or tuple of str, joined with commas (the agent tries them in order and
    follows a server's redirect to the run's owner). TypeError naming `server` otherwise; the
    agent checks each address."""
    if isinstance(server, str):
        return server
    if isinstance(server, (list, tuple)) and all(isinstance(s, str) for s in server):
        return ",".join(server)
    raise TypeError("server must be a str ('host:port' or 'a:50051,b:50051') or a list of str, "
                    f"got {type(server).__name__}")


def recipe_targets_option(recipe_targets):
    """`recipe_targets` as the agent's `recipe_targets` option: recipe texts as
    `ampscope stats --target` takes them ("mxfp8_e4m3", "nvfp4", "e4m3:current"), a list or
    tuple of str or one str separated by commas; at most 8. Each is read by the agent's own
    parser (ampscope/recipe.h's parse_recipe): TypeError or ValueError naming
    `recipe_targets` and the bad recipe otherwise."""
    if isinstance(recipe_targets, str):
        text = recipe_targets
    elif (isinstance(recipe_targets, (list, tuple))
          and all(isinstance(r, str) for r in recipe_targets)):
        if any("," in r for r in recipe_targets):
            raise ValueError(f"recipe_targets: one recipe per item, got {list(recipe_targets)!r}")
        text = ",".join(recipe_targets)
    else:
        raise TypeError("recipe_targets must be a str ('mxfp8_e4m3,nvfp4') or a list of str, "
                        f"got {type(recipe_targets).__name__}")
    lib = _capi.library()
    config = ctypes.c_void_p()
    if lib.ampscope_agent_config_create(ctypes.byref(config)) != _capi.OK:
        raise AgentError("ampscope: could not allocate an agent configuration")
    try:
        if lib.ampscope_agent_config_set(config, b"recipe_targets", text.encode()) != _capi.OK:
            e = lib.ampscope_agent_config_last_error(config)
            raise ValueError(e.decode(errors="replace") if e else
                             f"recipe_targets: refused {text!r}")
    finally:
        lib.ampscope_agent_config_destroy(config)
    return text


def _encode(value, what):
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, (int, float, str)):
        return str(value).encode()
    raise TypeError(f"{what} must be a str, int, float or bool, got {type(value).__name__}")


class Stats:
    """A tensor's full statistics (ampscope_tensor_stats) with the arrays it points to: what
    compute_stats() and scale_and_compute_stats() return and Agent.observe_stats() takes.
    Fields as attributes (numel, zeros, nan, pos_inf, neg_inf, max_abs, min_abs_nonzero, sum,
    sum_sq); histogram() -> (min_exponent, [counts]); targets() -> [((format, scale_log2),
    overflow, underflow, subnormal)]."""

    def __init__(self, targets=()):
        self._counts = (ctypes.c_uint64 * _capi.HISTOGRAM_BINS)()
        self._targets = (_capi.TargetCounts * max(1, len(targets)))()
        for i, (fmt, scale_log2) in enumerate(targets):
            self._targets[i].target.format = fmt
            self._targets[i].target.scale_log2 = scale_log2
        self.c = _capi.new(_capi.TensorStats)
        self.c.histogram_counts = self._counts
        self.c.targets = self._targets
        self.c.num_targets = len(targets)

    def __getattr__(self, name):
        if name in ("numel", "zeros", "nan", "pos_inf", "neg_inf", "max_abs", "min_abs_nonzero",
                    "sum", "sum_sq"):
            return getattr(self.c, name)
        raise AttributeError(name)

    def nonfinite(self):
        return self.c.nan + self.c.pos_inf + self.c.neg_inf

    def histogram(self):
        return self.c.histogram_min_exponent, list(self._counts[:self.c.histogram_bins])

    def targets(self):
        return [((t.target.format, t.target.scale_log2), t.overflow, t.underflow, t.subnormal)
                for t in self._targets[:self.c.num_targets]]


def _stats_call(fn, *args, targets):
    out = Stats(targets)
    reason = ctypes.create_string_buffer(256)
    status = fn(*args, ctypes.byref(out.c), reason, len(reason))
    if status != _capi.OK:
        raise ValueError(reason.value.decode(errors="replace"))
    return out


def compute_stats(data, numel, dtype, targets=()):
    """The full statistics of numel elements of `dtype` storage (FP32, FP16, BF16, or FP8 E4M3 /
    E5M2 bytes as torch.float8_e4m3fn / float8_e5m2 hold them) at the host address `data`,
    counting `targets` ((format, scale_log2) pairs). ValueError on a bad argument."""
    lib = _capi.library()
    return _stats_call(lib.ampscope_compute_stats, data, numel, dtype, targets=targets)


def scale_and_compute_stats(data, numel, dtype, factor, targets=()):
    """Multiplies the elements in place by `factor` (FP32 product rounded to nearest even
    into dtype) and returns the statistics of the results, in one pass over memory: a
    gradient's unscale with its statistics. ValueError on a bad argument."""
    lib = _capi.library()
    return _stats_call(lib.ampscope_scale_and_compute_stats, data, numel, dtype,
                       ctypes.c_float(factor), targets=targets)


RECIPE_COUNT_FIELDS = ("values", "nonfinite", "underflow", "subnormal", "saturated", "overflow",
                       "amax", "signal_sq", "error_sq", "tensor_scale", "blocks", "zero_blocks",
                       "saturated_blocks", "nan_blocks")


def count_recipe(data, numel, dtype, row_length, recipe):
    """A tensor's counts under a scaled recipe (ampscope_count_recipe; ampscope/recipe.h's
    recipe_counts, what `ampscope stats --target RECIPE --json` prints): numel elements of
    `dtype` storage (FP32, FP16, BF16, E4M3 / E5M2 bytes) at the host address `data`, in rows
    of row_length (0: one row), against `recipe` (str). A dict with the fields of
    RECIPE_COUNT_FIELDS and "scale_histogram" {"min_exponent", "counts"}. ValueError (the
    library's reason) on a bad argument."""
    lib = _capi.library()
    bins = (ctypes.c_uint64 * _capi.HISTOGRAM_BINS)()
    out = _capi.new(_capi.RecipeCounts)
    out.scale_histogram_counts = bins
    reason = ctypes.create_string_buffer(256)
    status = lib.ampscope_count_recipe(data, numel, dtype, row_length, utf8(recipe),
                                       ctypes.byref(out), reason, len(reason))
    if status != _capi.OK:
        raise ValueError(reason.value.decode(errors="replace"))
    counts = {f: getattr(out, f) for f in RECIPE_COUNT_FIELDS}
    counts["scale_histogram"] = {"min_exponent": out.scale_histogram_min_exponent,
                                 "counts": list(bins[:out.scale_histogram_bins])}
    return counts


class Agent:
    def __init__(self, *, run_id, server=None, options=None, trainer="", precision="",
                 compute_format=_capi.FORMAT_FP16, scaler_settings=None):
        """Creates and starts the agent. The environment (AMPSCOPE_SERVER, AMPSCOPE_RUN_ID,
        AMPSCOPE_SAMPLE_FULL_EVERY, ...) is applied first; run_id, server and `options` (the
        agent's option keys: "sample_full_every", "spool_dir", ...) override it; `server` may
        list several servers (see server_option). Raises
        ValueError for a bad option or a configuration the agent refuses (naming the key: a bad
        run_id, a server without a port) and AgentError when the agent cannot start."""
        self._lib = _capi.library()
        lib = self._lib
        config = ctypes.c_void_p()
        if lib.ampscope_agent_config_create(ctypes.byref(config)) != _capi.OK:
            raise AgentError("ampscope: could not allocate an agent configuration")
        try:
            if lib.ampscope_agent_config_apply_env(config) != _capi.OK:
                raise ValueError("ampscope: environment: " + self._config_error(config))
            settings = dict(options or {})
            if run_id is not None:
                settings["run_id"] = run_id
            if server is not None:
                settings["server"] = server_option(server)
            for key, value in settings.items():
                if not isinstance(key, str):
                    raise TypeError(f"options keys must be str, got {type(key).__name__}")
                if lib.ampscope_agent_config_set(config, key.encode(),
                                                 _encode(value, f"options[{key!r}]")) != _capi.OK:
                    raise ValueError(f"options[{key!r}]: " + self._config_error(config))
            run = _capi.new(_capi.RunInfo)
            run.host = utf8(socket.gethostname())
            run.trainer = utf8(trainer)
            run.precision = utf8(precision)
            run.compute_format = compute_format
            s = scaler_settings or {}
            run.scaler_kind = s.get("kind", _capi.SCALER_STATIC)
            run.loss_scale = s.get("scale", 1.0)
            run.growth_factor = s.get("growth_factor", 0.0)
            run.backoff_factor = s.get("backoff_factor", 0.0)
            run.growth_interval = s.get("growth_interval", 0)
            run.min_scale = s.get("min_scale", 0.0)
            run.max_scale = s.get("max_scale", 0.0)
            run.hysteresis = s.get("hysteresis", 0)
            handle = ctypes.c_void_p()
            status = lib.ampscope_agent_create(config, ctypes.byref(run), ctypes.byref(handle))
            if status == _capi.INVALID_ARGUMENT:
                # The configuration broke one of the agent's rules; the message names the key
                # ("run_id: must be ...", "server: expected host:port ...").
                raise ValueError("ampscope: " + self._config_error(config))
            if status != _capi.OK:
                raise AgentError("ampscope: the agent could not start: " +
                                 self._config_error(config))
        finally:
            lib.ampscope_agent_config_destroy(config)
        self._handle = handle
        # What close() waits for acknowledgements by default: the agent's flush_timeout_ms.
        flush_ms = settings.get("flush_timeout_ms", os.environ.get("AMPSCOPE_FLUSH_TIMEOUT_MS"))
        self.flush_timeout_s = float(flush_ms) / 1000.0 if flush_ms is not None else 10.0
        self._callbacks = []  # ctypes callbacks and ops structs kept alive for the agent
        self._local = threading.local()
        self._closed = False
        _open_agents.add(self)

    def _config_error(self, config):
        e = self._lib.ampscope_agent_config_last_error(config)
        return e.decode(errors="replace") if e else "unknown error"

    def last_error(self):
        e = self._lib.ampscope_agent_last_error(self._handle)
        return e.decode(errors="replace") if e else ""

    # -- controls -------------------------------------------------------------------------

    def attach_scaler(self, schedule, scale, min_scale=0.0, max_scale=0.0):
        """schedule(change: dict, step: int) -> None or a reason (str); scale() -> float.
        Both are called on agent threads: schedule from begin_step, scale also from the
        sender thread. Returns the status."""

        def c_schedule(_user, change, reason, reason_size):
            return _answer(lambda: schedule(change.contents.fields(),
                                            change.contents.effective_from_step),
                           reason, reason_size)

        def c_scale(_user):
            try:
                return float(scale())
            except Exception:
                return 1.0

        ops = _capi.new(_capi.ScalerOps)
        ops.schedule = _capi.SCHEDULE_FN(c_schedule)
        ops.scale = _capi.SCALE_FN(c_scale)
        ops.min_scale = min_scale
        ops.max_scale = max_scale
        self._callbacks.append(ops)
        return self._lib.ampscope_agent_attach_scaler(self._handle, ctypes.byref(ops), None)

    def attach_overrides(self, capable_layers, replace):
        """capable_layers: the layer names the FP32 fallback may use. replace(layers: list,
        from_step: int) -> None or a reason (str), called from begin_step of from_step."""
        ops = self._overrides_ops(capable_layers, replace)
        return self._lib.ampscope_agent_attach_overrides(self._handle, ctypes.byref(ops), None)

    def attach_gemm_precision(self, gemm_layers, replace, schedule_recipe=None):
        """Per-layer precision of an FP8/FP4 run. gemm_layers: the linear layers whose GEMMs
        can run in BF16 instead of the recipe; replace(bf16_layers: list, from_step: int) ->
        None or a reason (str). schedule_recipe(amax_history_length, margin, from_step) -> None
        or a reason, each setting None when the update leaves it alone; given only when the run
        uses delayed scaling (without it such an update is refused). Both called from
        begin_step of from_step. gemm_layers None: no GEMM set (replace is not used). Returns
        the status."""
        gemms = self._overrides_ops(gemm_layers, replace) if gemm_layers is not None else None
        recipe = None
        if schedule_recipe is not None:

            def c_schedule(_user, change, reason, reason_size):
                return _answer(lambda: schedule_recipe(*change.contents.settings(),
                                                       change.contents.effective_from_step),
                               reason, reason_size)

            recipe = _capi.new(_capi.RecipeOps)
            recipe.delayed = 1
            recipe.schedule = _capi.RECIPE_SCHEDULE_FN(c_schedule)
            self._callbacks.append(recipe)
        return self._lib.ampscope_agent_attach_gemm_precision(
            self._handle, ctypes.byref(gemms) if gemms is not None else None, None,
            ctypes.byref(recipe) if recipe is not None else None, None)

    def _overrides_ops(self, capable_layers, replace):
        """ampscope_overrides_ops over a list of names and replace(layers, from_step), kept
        alive with the agent."""
        names = [utf8(n) for n in capable_layers]
        array = (ctypes.c_char_p * max(1, len(names)))(*names)

        def c_capable(_user, out, capacity):
            for i in range(min(capacity, len(names))):
                out[i] = array[i]
            return len(names)

        def c_replace(_user, layers, num_layers, from_step, reason, reason_size):
            return _answer(lambda: replace([layers[i].decode(errors="replace")
                                            for i in range(num_layers)], from_step),
                           reason, reason_size)

        ops = _capi.new(_capi.OverridesOps)
        ops.capable_layers = _capi.CAPABLE_FN(c_capable)
        ops.replace = _capi.REPLACE_FN(c_replace)
        self._callbacks.append((ops, array, names))
        return ops

    # -- step calls (never raise) ------------------------------------------------------------

    def begin_step(self, step):
        return bool(self._lib.ampscope_agent_begin_step(self._handle, step))

    def _view(self):
        v = getattr(self._local, "view", None)
        if v is None:
            v = self._local.view = _capi.new(_capi.TensorView)
        return v

    def observe(self, name, role, phase, dtype, data, numel, *, device=_capi.DEVICE_CPU,
                stream=None, scale=1.0, micro_step=0, order=0, held=None):
        """name: bytes. data: the address of numel contiguous elements. Returns the status."""
        v = self._fill_view(name, role, phase, dtype, data, numel, device, stream, scale,
                            micro_step, order, held)
        return self._lib.ampscope_agent_observe(self._handle, ctypes.byref(v))

    def _fill_view(self, name, role, phase, dtype, data, numel, device, stream, scale,
                   micro_step, order, held):
        v = self._view()
        v.name = name
        v.role = role
        v.phase = phase
        v.dtype = dtype
        v.data = data
        v.numel = numel
        v.device = device
        v.stream = stream
        v.scale = scale
        v.micro_step = micro_step
        v.order = order
        v.has_held = 0 if held is None else 1
        v.held = 0 if held is None else held
        return v

    def stats_target(self, name, role, phase, dtype, numel, *, scale=1.0, held=None):
        """The (format, scale_log2) target a full measurement of this tensor counts now, or
        None when observe() would not measure it (fused statistics: ask before computing)."""
        v = self._fill_view(name, role, phase, dtype, None, numel, _capi.DEVICE_CPU, None, scale,
                            0, 0, held)
        t = _capi.Target()
        if not self._lib.ampscope_agent_stats_target(self._handle, ctypes.byref(v),
                                                     ctypes.byref(t)):
            return None
        return (t.format, t.scale_log2)

    def observe_stats(self, name, role, phase, dtype, numel, stats, *, data=None,
                      device=_capi.DEVICE_CPU, scale=1.0, micro_step=0, order=0, held=None):
        """Hands over a tensor's statistics (a Stats, computed with the target stats_target
        named) instead of its data, recorded as observe() would record the data. Returns the
        status (INVALID_ARGUMENT for statistics that cannot be the tensor's)."""
        v = self._fill_view(name, role, phase, dtype, data, numel, device, None, scale,
                            micro_step, order, held)
        return self._lib.ampscope_agent_observe_stats(self._handle, ctypes.byref(v),
                                                      ctypes.byref(stats.c))

    def observe_quantizer(self, name, role, phase, dtype, data, shape, recipe, *, layer=b"",
                          what_if=False, amax_history=None, micro_step=0, loss_cost=None):
        """A quantiser the agent counts itself (ampscope_agent_observe_quantizer): `shape`
        elements (a tuple of ints) of `dtype` storage at the host address `data` (None: not
        read, on a step that does not record), against `recipe` (bytes, as `ampscope stats
        --target` takes it). name, layer: bytes. amax_history: floats, oldest first. loss_cost:
        the recipe's first-order loss change in nats (a finite float), None: not measured. Returns the
        status (INVALID_ARGUMENT with last_error() naming what is wrong)."""
        v = self._fill_view(name, role, phase, dtype, data, 0, _capi.DEVICE_CPU, None, 1.0,
                            micro_step, 0, None)
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        v.shape = dims
        v.rank = len(shape)
        q = _capi.new(_capi.Quantizer)
        q.recipe = recipe
        q.layer = layer
        q.what_if = int(bool(what_if))
        if loss_cost is not None:
            q.has_loss_cost = 1
            q.loss_cost = loss_cost
        history = None
        if amax_history:
            history = (ctypes.c_float * len(amax_history))(*amax_history)
            q.amax_history = history
            q.amax_history_length = len(amax_history)
        status = self._lib.ampscope_agent_observe_quantizer(self._handle, ctypes.byref(v),
                                                            ctypes.byref(q))
        v.shape, v.rank = None, 0
        return status

    def wanted(self, role, phase):
        """What observe() of a tensor of `role` in `phase` would measure now: 0 nothing,
        1 counts, 2 full statistics."""
        return self._lib.ampscope_agent_wanted(self._handle, role, phase)

    def mark_phase(self, phase):
        return self._lib.ampscope_agent_mark_phase(self._handle, phase)

    def end_step(self, *, step, loss=0.0, loss_scale=1.0, scale_after=1.0, found_inf=False,
                 skipped=False, grad_norm=0.0, lr=0.0, tokens=0, step_time_s=0.0,
                 optimizer_steps=0, val_loss=None, fp32_layers=(), bf16_gemms=()):
        info = _capi.new(_capi.StepInfo)
        info.step = step
        info.loss = loss
        info.loss_scale = loss_scale
        info.scale_after = scale_after
        info.found_inf = int(bool(found_inf))
        info.skipped = int(bool(skipped))
        info.grad_norm = grad_norm
        info.lr = lr
        info.tokens = tokens
        info.step_time_s = step_time_s
        info.optimizer_steps = optimizer_steps
        if val_loss is not None:
            info.has_val_loss = 1
            info.val_loss = val_loss
        # The name arrays stay referenced here until the call returns.
        layers = _names(fp32_layers)
        if layers is not None:
            info.fp32_layers, info.num_fp32_layers = layers, len(layers)
        gemms = _names(bf16_gemms)
        if gemms is not None:
            info.bf16_gemms, info.num_bf16_gemms = gemms, len(gemms)
        return self._lib.ampscope_agent_end_step(self._handle, ctypes.byref(info))

    # -- any thread ---------------------------------------------------------------------------

    def add_notice(self, text):
        """Reports `text` once (deduplicated), as ampscope show lists the agent's notices."""
        if self._closed or not text:
            return _capi.INVALID_ARGUMENT
        return self._lib.ampscope_agent_add_notice(self._handle, utf8(text))

    def policy_vote(self):
        """This rank's vote in the per-step policy agreement (option policy_agreement=per_step):
        (received_seq, fallback). Reduce every rank's (-received_seq, fallback) with a max
        all-reduce and hand the result to policy_agreed() before the next begin_step."""
        seq, fallback = ctypes.c_uint64(0), ctypes.c_int(0)
        if self._closed or self._lib.ampscope_agent_policy_vote(
                self._handle, ctypes.byref(seq), ctypes.byref(fallback)) != _capi.OK:
            return 0, False
        return seq.value, bool(fallback.value)

    def policy_agreed(self, received_seq, fallback):
        """The reduced vote: the lowest seq any rank received, and whether any rank wants its
        local scaler back. Returns the status code (OK, or why not: last_error())."""
        if self._closed:
            return _capi.FAILED_PRECONDITION
        return self._lib.ampscope_agent_policy_agreed(self._handle, int(received_seq),
                                                      int(bool(fallback)))

    def flush(self, timeout_s=10.0):
        """Waits until everything so far is acknowledged by the server; True when it was."""
        if self._closed:
            return False
        return self._lib.ampscope_agent_flush(self._handle, int(timeout_s * 1000)) == _capi.OK

    def counters(self):
        c = _capi.new(_capi.Counters)
        if self._closed or self._lib.ampscope_agent_get_counters(self._handle,
                                                                 ctypes.byref(c)) != _capi.OK:
            return {}
        return c.as_dict()

    def notices(self):
        if self._closed:
            return []
        out = []
        for i in range(self._lib.ampscope_agent_notice_count(self._handle)):
            n = self._lib.ampscope_agent_notice(self._handle, i)
            if n is not None:
                out.append(n.decode(errors="replace"))
        return out

    def close(self, timeout_s=None):
        """Flushes for up to timeout_s (default: the agent's flush_timeout_ms, 10 s unless set),
        stops the agent and frees it. Idempotent. Returns True when everything was acknowledged
        (what was not stays in the spool for the next run)."""
        if self._closed:
            return True
        if timeout_s is None:
            timeout_s = self.flush_timeout_s
        self._closed = True
        status = self._lib.ampscope_agent_destroy(self._handle, int(timeout_s * 1000))
        self._handle = None
        return status == _capi.OK


# Agents still open at interpreter exit are closed while Python can still run their callbacks
# (the agent's threads call back into Python for the scale).
_open_agents = weakref.WeakSet()


@atexit.register
def _close_open_agents():
    for agent in list(_open_agents):
        with contextlib.suppress(Exception):
            agent.close()


def _names(texts):
    """A C array of the texts as UTF-8 (NUL-terminated), or None when there are none."""
    if not texts:
        return None
    encoded = [utf8(t) for t in texts]
    return (ctypes.c_char_p * len(encoded))(*encoded)


def refusal(decide):
    """None when decide() accepted (returned None or ""), else its one-line reason: the str it
    returned, or the exception it raised (a reason for the server, never an exception into
    the agent)."""
    try:
        why = decide()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return str(why) if why else None


def _answer(decide, reason, reason_size):
    """A callback's answer to the agent: 0 when decide() accepted, else 1 with its refusal in
    the agent's buffer."""
    why = refusal(decide)
    if why is None:
        return 0
    _write_reason(why, reason, reason_size)
    return 1


def _write_reason(text, buffer, size):
    if not buffer or size == 0:
        return
    data = utf8(text)[: size - 1] + b"\0"
    ctypes.memmove(buffer, data, len(data))
