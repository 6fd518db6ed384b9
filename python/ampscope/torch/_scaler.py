"""Loss scalers for PyTorch: ampscope's LossScaler, and the adapters through which the monitor
observes and steers a LossScaler or a PyTorch GradScaler.

LossScaler
----------
A drop-in for ``torch.cuda.amp.GradScaler`` (same methods, same state_dict keys plus a few) whose
rule is computed by libampscope_agent.so (``ampscope_loss_scale_update``): the very C++ rules of
ampscope/loss_scale.h that the built-in trainer runs, so a LossScaler and the trainer's scaler
move through the same scales step for step. Three kinds:

  "static"      the scale never changes (``update()`` keeps it)
  "dynamic"     PyTorch GradScaler's rule: an overflow multiplies the scale by backoff_factor
                (not below min_scale); growth_interval clean steps in a row multiply it by
                growth_factor (kept only when finite and <= max_scale)
  "hysteresis"  Megatron-LM's DynamicGradScaler: the scale backs off only after `hysteresis`
                overflows since the last growth (LossScaler.megatron() gives its defaults)

The scale lives on the host (a Python float holding an FP32 value): ``scale()`` multiplies by it
as an FP32 tensor on the output's device and ``unscale_()`` by float32(1/double(scale)) as
GradScaler does, neither waiting for the device; ``step()`` reads the optimizer's found_inf once
(GradScaler does the same). Differences from GradScaler: FP16 gradients may be unscaled
(GradScaler refuses them); optimizers with ``_step_supports_amp_scaling`` get unscaled
gradients and a plain ``step()`` instead of the scaler; CPU tensors work on every torch
version.

Adapters
--------
``adapt_scaler(scaler)`` returns a ScalerAdapter for an ampscope.torch.LossScaler or a PyTorch
GradScaler (``torch.cuda.amp.GradScaler``; ``torch.amp.GradScaler`` in torch 2.x; also one a
framework created), None for None, and raises TypeError for anything else. The interface:

  enabled             bool. A disabled scaler (``enabled=False``, or a CUDA GradScaler that
                      disabled itself on a machine without CUDA) reports kind static and scale 1
                      and refuses every change.
  settings()          dict(kind=<_capi.SCALER_*>, scale, growth_factor, backoff_factor,
                      growth_interval, hysteresis, min_scale, max_scale) for the agent's
                      RunInfo; 0 where a field does not apply (no hysteresis, no bound).
  current_scale()     the scale as a float, from any thread, without a device sync (a cached
                      float, refreshed at every update() and applied change).
  apply_change(fields) -> None when applied, else a one-line reason and nothing changed.
                      fields: a dict with any of scale, growth_factor, backoff_factor,
                      growth_interval, hysteresis, min_scale, max_scale. Validated by the C
                      rule (ampscope_loss_scale_apply_change), so the reasons are the built-in
                      trainer's. A new scale restarts the trackers, a new growth_interval the
                      growth tracker. Call it on the training thread, between steps (the agent
                      calls it from begin_step of the step the change is effective from).
                      A GradScaler takes no hysteresis (refused with a reason naming
                      LossScaler(kind='hysteresis')); its min_scale and max_scale are enforced
                      by the adapter after every rule update, exactly as the C dynamic rule
                      bounds it (a backoff stops at min_scale, a growth beyond max_scale is not
                      taken; update(new_scale) is not bounded, as with a LossScaler).
  install(hooks)      makes the scaler call the hooks (below); a GradScaler is adapted in
                      place: its scale, unscale_, step, update and load_state_dict become
                      instance attributes wrapping the class's methods (pickling and deepcopy
                      leave them out). One hooks object per scaler at a time.
  uninstall()         restores the scaler as it was.

The hooks object may define any of these (a missing one is a no-op). Every call is guarded: an
exception in a hook never reaches the training loop; it is passed to
``hooks.on_error(where, exc)`` (where: the hook's name, or the scaler method whose observation
by the adapter failed) and the step goes on. Exceptions of the scaler itself (unscale_ twice,
step twice) propagate as without the adapter, and the refused call calls no hook.

  on_scale(loss, scale)                       scale(outputs) with a single tensor: the unscaled
                                              loss and the scale it was multiplied by
  before_unscale(optimizer, scale)            the optimizer's gradients hold scaled values
  after_unscale(optimizer)                    they are unscaled
  after_step(optimizer, skipped)              after step(); skipped: the optimizer's step was
                                              skipped for non-finite gradients
  on_update(found_inf, scale_before, scale_after)
                                              after update(), the end of the training step;
                                              found_inf over all optimizers whose gradients
                                              were checked since the last update (as the
                                              scaler's own update sees them)

Fused statistics (LossScaler only): with CPU gradients, a hooks object that also defines
``unscale_stats_target(param)`` (the (format, scale_log2) target its statistics should count,
or None) gets the full statistics of each such gradient computed in the unscale pass itself
(ampscope's fused kernel: one read and one write of the gradient, the same values as without
it) through ``on_unscaled_stats(param, stats)`` (an ampscope.Stats), before after_unscale.

step() without an explicit unscale_() still calls before_unscale/after_unscale (the implicit
unscale). A disabled scaler calls the hooks at the same points, with scale 1 and found_inf
False. With a GradScaler, on_update reads found_inf and the new scale from the device in one
copy (the adapter's only sync besides the one GradScaler's step already makes; an optimizer
with ``_step_supports_amp_scaling`` costs one more, after its step, for `skipped`).
"""

import ctypes
import enum
import math
import numbers
from collections import abc

import torch

from .. import _agent, _capi

__all__ = ["LossScaler", "ScalerAdapter", "adapt_scaler"]

# The largest finite FP32: a rule's max_scale when it has no ceiling.
F32_MAX = 3.4028234663852886e38

_KIND_NAMES = {v: k for k, v in _capi.SCALER_KINDS.items()}
_FLOAT_FIELDS = ("scale", "growth_factor", "backoff_factor", "min_scale", "max_scale")
_INT_FIELDS = {"growth_interval": 64, "hysteresis": 32}
CHANGE_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis",
                 "min_scale", "max_scale")

_AMP_UNSCALE = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)


def _f32(x):
    """x rounded to FP32 (inf when out of range), as a Python float."""
    return ctypes.c_float(x).value


# ---------------------------------------------------------------------------------------------
# The C rules.

def _copy(s):
    return type(s).from_buffer_copy(s)


def _defaults(kind):
    """(rule, state): the kind's defaults, from the library."""
    lib = _capi.library()
    rule = _capi.new(_capi.LossScaleRule)
    state = _capi.LossScaleState()
    status = lib.ampscope_loss_scale_defaults(kind, ctypes.byref(rule), ctypes.byref(state))
    if status != _capi.OK:
        raise RuntimeError(f"ampscope_loss_scale_defaults({kind}): {_capi.status_text(status)}")
    return rule, state


def _integer(name, value, bits):
    """(int, None), or (None, reason) when value is not an integer of `bits` bits (a float
    with an integral value counts)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None, f"{name} must be an integer, got {value!r}"
    if not -(1 << (bits - 1)) <= int(value) < (1 << (bits - 1)):
        return None, f"{name} must fit in {bits} bits, got {value}"
    return int(value), None


def _change_struct(fields):
    """(ScalerChange, None), or (None, reason) when a field is unknown or not a number."""
    change = _capi.new(_capi.ScalerChange)
    for key, value in fields.items():
        if key in _FLOAT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                return None, f"{key} must be a number, got {value!r}"
            try:
                value = float(value)
            except OverflowError:
                value = math.inf  # refused by the rule as any infinite value
            setattr(change, key, value)
        elif key in _INT_FIELDS:
            value, reason = _integer(key, value, _INT_FIELDS[key])
            if reason is not None:
                return None, reason
            setattr(change, key, value)
        else:
            return None, f"unknown scaler field {key!r} (known: {', '.join(CHANGE_FIELDS)})"
        setattr(change, "has_" + key, 1)
    return change, None


def _apply_change(rule, state, fields):
    """(rule, state) after the change, copies (the inputs are not touched), or a reason."""
    change, reason = _change_struct(fields)
    if reason is not None:
        return reason
    rule, state = _copy(rule), _copy(state)
    buf = ctypes.create_string_buffer(512)
    status = _capi.library().ampscope_loss_scale_apply_change(
        ctypes.byref(rule), ctypes.byref(state), ctypes.byref(change), buf, len(buf))
    if status != _capi.OK:
        return buf.value.decode(errors="replace") or _capi.status_text(status)
    return rule, state


def _update(rule, state, found_inf):
    """The state after one update (a copy)."""
    state = _copy(state)
    status = _capi.library().ampscope_loss_scale_update(ctypes.byref(state), ctypes.byref(rule),
                                                        1 if found_inf else 0)
    if status != _capi.OK:
        raise RuntimeError(f"ampscope_loss_scale_update: {_capi.status_text(status)}")
    return state


def _kind_id(kind):
    if isinstance(kind, str) and kind.lower() in _capi.SCALER_KINDS:
        return _capi.SCALER_KINDS[kind.lower()]
    raise ValueError(f"kind must be one of {', '.join(_capi.SCALER_KINDS)}, got {kind!r}")


# ---------------------------------------------------------------------------------------------
# Hooks.

def _call_hook(hooks, name, *args):
    """hooks.<name>(*args) when it exists, returning what it returned; an exception goes to
    hooks.on_error, never up (and the call returns None)."""
    if hooks is None:
        return None
    try:
        fn = getattr(hooks, name, None)
        if fn is not None:
            return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a hook must not break the training loop
        _report_error(hooks, name, exc)
    return None


def _report_error(hooks, where, exc):
    try:
        on_error = getattr(hooks, "on_error", None)
        if on_error is not None:
            on_error(where, exc)
    except Exception:  # noqa: BLE001
        pass


# ---------------------------------------------------------------------------------------------
# LossScaler.

class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class _OptimizerState:
    __slots__ = ("stage", "found_inf", "found")

    def __init__(self):
        self.stage = _Stage.READY
        self.found_inf = []  # one float32 tensor of shape (1,) per device: > 0 when non-finite
        self.found = None    # the same on the host, once read


def _unscale_generic(grads, found_inf, inv_scale):
    """found_inf |= any non-finite value in `grads` (scaled values); grads *= inv_scale, formed
    in FP32 (FP64 for FP64 grads) and rounded to the gradient's dtype, as PyTorch's
    _amp_foreach_non_finite_check_and_unscale_ does. No host sync."""
    flags = [torch.logical_not(torch.isfinite(g)).any() for g in grads]
    if flags:
        found_inf.copy_(torch.maximum(found_inf, torch.stack(flags).any().to(found_inf.dtype)))
    inv = inv_scale.reshape(())
    for g in grads:
        if g.dtype in (torch.float32, torch.float64):
            g.mul_(inv)
        else:
            g.copy_(g.float().mul_(inv))


_STATS_FORMATS = {torch.float32: _capi.FORMAT_FP32, torch.float16: _capi.FORMAT_FP16,
                  torch.bfloat16: _capi.FORMAT_BF16}


def _measurable(grad):
    """Whether the fused kernel can unscale and measure `grad` in place: a dense, contiguous
    CPU tensor of FP32, FP16 or BF16."""
    return (grad.device.type == "cpu" and not grad.is_sparse and grad.dtype in _STATS_FORMATS
            and grad.is_contiguous())


def _unscale_measured(measured, inv, hooks):
    """Unscales each (param, grad, target) through ampscope_scale_and_compute_stats (one pass:
    the unscale of _unscale_generic, bit for bit, and the statistics of its results), hands each
    result to hooks.on_unscaled_stats(param, stats), and returns the found_inf flag of the
    gradients (a CPU float32 tensor of shape (1,)). With inv in [0, 1] no finite value becomes
    non-finite and every non-finite one stays so: the statistics are the check. Otherwise the
    check reads the scaled values first, as _unscale_generic does."""
    found = False
    for param, grad, target in measured:
        if not 0.0 <= inv <= 1.0:
            found = found or not bool(torch.isfinite(grad).all())
        stats = _agent.scale_and_compute_stats(grad.data_ptr(), grad.numel(),
                                               _STATS_FORMATS[grad.dtype], inv, [target])
        if 0.0 <= inv <= 1.0:
            found = found or stats.nonfinite() > 0
        _call_hook(hooks, "on_unscaled_stats", param, stats)
    return torch.full((1,), 1.0 if found else 0.0, dtype=torch.float32)


class LossScaler:
    """A loss scaler with PyTorch GradScaler's interface and ampscope's C++ rules.

    Args:
        init_scale: the initial scale (stored as FP32).
        growth_factor, backoff_factor, growth_interval: as GradScaler's.
        enabled: False makes every method a pass-through, as GradScaler's.
        kind: "static", "dynamic" (GradScaler's rule) or "hysteresis" (Megatron-LM's).
        hysteresis: overflows tolerated before a backoff (kind "hysteresis"; >= 1).
        min_scale: the floor a backoff stops at; None: none (0).
        max_scale: the ceiling growth stops below; None: none (the largest FP32).

    Raises ValueError with the C rule's reason when the configuration is invalid.

    Usage is GradScaler's::

        scaler = LossScaler()                 # or LossScaler.megatron()
        for batch in data:
            optimizer.zero_grad()
            loss = model(batch)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)        # optional (clipping)
            scaler.step(optimizer)            # skipped when a gradient is Inf/NaN
            scaler.update()                   # once per effective batch

    Besides GradScaler's methods: ``apply_change(fields)`` (a validated change, as a policy
    update makes it), ``found_inf()`` (the last update's), ``last_step_skipped`` (the last
    step() call skipped the optimizer's step), ``kind``, ``get_hysteresis()``,
    ``get_min_scale()``, ``get_max_scale()``. The growth/backoff/interval setters validate as
    apply_change does (ValueError) and a new interval restarts the growth tracker.
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, *, kind="dynamic", hysteresis=2,
                 min_scale=None, max_scale=None):
        self._enabled = bool(enabled)
        rule, state = _defaults(_kind_id(kind))
        result = _apply_change(rule, state, {
            "scale": init_scale,
            "growth_factor": growth_factor,
            "backoff_factor": backoff_factor,
            "growth_interval": growth_interval,
            "hysteresis": hysteresis,
            "min_scale": 0.0 if min_scale is None else min_scale,
            "max_scale": F32_MAX if max_scale is None else max_scale,
        })
        if isinstance(result, str):
            raise ValueError(f"LossScaler: {result}")
        self._rule, self._state = result
        self._scale_value = float(self._state.scale)
        self._scale_tensors = {}  # device -> (value, float32 tensor of shape (1,))
        self._per_optimizer_states = {}
        self._last_found_inf = False
        self.last_step_skipped = False
        self._hooks = None

    @classmethod
    def megatron(cls, **overrides):
        """A LossScaler with Megatron-LM's DynamicGradScaler defaults (kind "hysteresis",
        initial scale 2^32, x2 / x0.5, window 1000, hysteresis 2, min_scale 1; the library's
        ampscope_loss_scale_defaults). Keyword arguments override any of them."""
        rule, state = _defaults(_capi.SCALER_HYSTERESIS)
        kw = dict(init_scale=float(state.scale), growth_factor=rule.growth_factor,
                  backoff_factor=rule.backoff_factor, growth_interval=rule.growth_interval,
                  kind="hysteresis", hysteresis=rule.hysteresis,
                  min_scale=float(rule.min_scale),
                  max_scale=None if rule.max_scale == F32_MAX else float(rule.max_scale))
        kw.update(overrides)
        return cls(**kw)

    # -- scaling ------------------------------------------------------------------------------

    def _scale_on(self, device):
        # A new tensor whenever the scale changed: a tensor handed out before is never written
        # (autograd may have saved it for the backward of the multiplication).
        value = self._scale_value
        entry = self._scale_tensors.get(device)
        if entry is None or entry[0] != value:
            entry = (value, torch.full((1,), value, dtype=torch.float32, device=device))
            self._scale_tensors[device] = entry
        return entry[1]

    def scale(self, outputs):
        """outputs (a tensor, or a list/tuple/iterable of them, nested) multiplied by the scale,
        an FP32 tensor of shape (1,) on each output's device, as GradScaler multiplies. Disabled:
        outputs unchanged."""
        if isinstance(outputs, torch.Tensor):
            if not self._enabled:
                _call_hook(self._hooks, "on_scale", outputs, 1.0)
                return outputs
            scaled = outputs * self._scale_on(outputs.device)
            _call_hook(self._hooks, "on_scale", outputs, self._scale_value)
            return scaled
        if not self._enabled:
            return outputs

        def apply_scale(val):
            if isinstance(val, torch.Tensor):
                return val * self._scale_on(val.device)
            if isinstance(val, abc.Iterable):
                iterable = map(apply_scale, val)
                if isinstance(val, (list, tuple)):
                    return type(val)(iterable)
                return iterable
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    # -- unscaling and stepping ---------------------------------------------------------------

    def _opt_state(self, optimizer):
        st = self._per_optimizer_states.get(id(optimizer))
        if st is None:
            st = self._per_optimizer_states[id(optimizer)] = _OptimizerState()
        return st

    def _unscale_grads(self, optimizer):
        inv = _f32(1.0 / float(self._state.scale))
        per_device = {}
        # Fused statistics: CPU gradients whose statistics the hooks want are unscaled and
        # measured in one pass (hooks.unscale_stats_target(param) -> the target, or None).
        wants_stats = getattr(self._hooks, "unscale_stats_target", None) is not None
        measured = []
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    if wants_stats and _measurable(grad):
                        target = _call_hook(self._hooks, "unscale_stats_target", param)
                        if target is not None:
                            measured.append((param, grad, target))
                            continue
                    if grad.is_sparse:
                        # Duplicate indices add up when coalesced: check what they add up to.
                        if grad.dtype is torch.float16:
                            param.grad = grad = grad.coalesce()
                        grad = grad._values()
                    per_device.setdefault(grad.device, {}).setdefault(grad.dtype, []).append(grad)
            found = []
            for device, per_dtype in per_device.items():
                found_inf = torch.zeros((1,), dtype=torch.float32, device=device)
                inv_scale = torch.full((1,), inv, dtype=torch.float32, device=device)
                for grads in per_dtype.values():
                    if device.type == "cuda" and _AMP_UNSCALE is not None:
                        _AMP_UNSCALE(grads, found_inf, inv_scale)
                    else:
                        _unscale_generic(grads, found_inf, inv_scale)
                found.append(found_inf)
            if measured:
                found.append(_unscale_measured(measured, inv, self._hooks))
        return found

    def unscale_(self, optimizer):
        """Divides the optimizer's gradients by the scale (multiplies by
        float32(1/double(scale)), in place) and records whether any scaled value was Inf/NaN,
        on the device (no sync). Once per optimizer between update() calls, before step();
        a second call raises RuntimeError, as GradScaler's."""
        if not self._enabled:
            st = self._opt_state(optimizer)
            if st.stage is _Stage.READY:
                _call_hook(self._hooks, "before_unscale", optimizer, 1.0)
                st.stage = _Stage.UNSCALED
                _call_hook(self._hooks, "after_unscale", optimizer)
            return
        st = self._opt_state(optimizer)
        if st.stage is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        if st.stage is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        _call_hook(self._hooks, "before_unscale", optimizer, self._scale_value)
        st.found_inf = self._unscale_grads(optimizer)
        st.stage = _Stage.UNSCALED
        _call_hook(self._hooks, "after_unscale", optimizer)

    @staticmethod
    def _read_found(found_inf):
        if not found_inf:
            return False
        if len(found_inf) == 1:
            return bool(found_inf[0].item())
        device = found_inf[0].device
        return bool(sum(f.to(device) for f in found_inf).item())

    def step(self, optimizer, *args, **kwargs):
        """Unscales the optimizer's gradients (unless unscale_() did), then calls
        optimizer.step(*args, **kwargs) unless a gradient was Inf/NaN (one host read of that
        flag). Returns what optimizer.step returned, or None when skipped. Disabled: just
        optimizer.step(*args, **kwargs)."""
        if not self._enabled:
            st = self._opt_state(optimizer)
            if st.stage is _Stage.READY:
                self.unscale_(optimizer)
            retval = optimizer.step(*args, **kwargs)
            st.stage = _Stage.STEPPED
            self.last_step_skipped = False
            _call_hook(self._hooks, "after_step", optimizer, False)
            return retval
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if LossScaler is enabled.")
        st = self._opt_state(optimizer)
        if st.stage is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if st.stage is _Stage.READY:
            self.unscale_(optimizer)
        assert len(st.found_inf) > 0, "No inf checks were recorded for this optimizer."
        st.found = self._read_found(st.found_inf)
        retval = None
        if not st.found:
            retval = optimizer.step(*args, **kwargs)
        st.stage = _Stage.STEPPED
        self.last_step_skipped = st.found
        _call_hook(self._hooks, "after_step", optimizer, st.found)
        return retval

    def update(self, new_scale=None):
        """The end of the training step (once per effective batch): one update of the rule with
        found_inf = whether any optimizer's gradients held an Inf/NaN since the last update.

        new_scale (a float, or a 1-element tensor, read on the host): sets the scale instead,
        as GradScaler's update(new_scale) does (the trackers are kept; no bounds)."""
        states = self._per_optimizer_states
        self._per_optimizer_states = {}
        if not self._enabled:
            self._last_found_inf = False
            _call_hook(self._hooks, "on_update", False, 1.0, 1.0)
            return
        before = self._scale_value
        found = False
        for st in states.values():
            if st.found is None:
                st.found = self._read_found(st.found_inf)
            found = found or st.found
        if new_scale is not None:
            if isinstance(new_scale, torch.Tensor):
                reason = ("new_scale should be a float or a 1-element tensor with "
                          "requires_grad=False.")
                assert new_scale.numel() == 1 and not new_scale.requires_grad, reason
                new_scale = float(new_scale.item())
            value = _f32(float(new_scale))
            if not (math.isfinite(value) and value > 0.0):
                self._per_optimizer_states = states
                raise ValueError(f"new_scale must be finite and > 0, got {new_scale}")
            state = _copy(self._state)
            state.scale = value
        else:
            if not any(st.found_inf for st in states.values()):
                self._per_optimizer_states = states
                raise AssertionError("No inf checks were recorded prior to update.")
            state = _update(self._rule, self._state, found)
        self._state = state
        self._scale_value = float(state.scale)
        self._last_found_inf = found
        _call_hook(self._hooks, "on_update", found, before, self._scale_value)

    # -- policy changes -----------------------------------------------------------------------

    def apply_change(self, fields):
        """Applies a change natively (ampscope_loss_scale_apply_change, the built-in trainer's
        validation): fields is a dict with any of scale, growth_factor, backoff_factor,
        growth_interval, hysteresis, min_scale, max_scale. A new scale restarts both trackers,
        a new growth_interval the growth tracker, a new hysteresis the hysteresis tracker.
        Returns None when applied; otherwise the one-line reason, and nothing changed."""
        if not self._enabled:
            return "the LossScaler is disabled"
        result = _apply_change(self._rule, self._state, dict(fields))
        if isinstance(result, str):
            return result
        self._rule, self._state = result
        self._scale_value = float(self._state.scale)
        return None

    def _set(self, field, value):
        reason = self.apply_change({field: value})
        if reason is not None and self._enabled:
            raise ValueError(reason)

    # -- queries, GradScaler's and ours -------------------------------------------------------

    def is_enabled(self):
        return self._enabled

    @property
    def kind(self):
        """"static", "dynamic" or "hysteresis"."""
        return _KIND_NAMES[self._rule.kind]

    def get_scale(self):
        """The current scale as a Python float (1.0 when disabled). No device sync."""
        return self._scale_value if self._enabled else 1.0

    def _get_scale_async(self):
        return self._scale_on(torch.device("cpu"))

    def found_inf(self):
        """Whether the last update() saw an Inf/NaN gradient (False before the first)."""
        return self._last_found_inf

    def get_growth_factor(self):
        return self._rule.growth_factor

    def set_growth_factor(self, new_factor):
        self._set("growth_factor", new_factor)

    def get_backoff_factor(self):
        return self._rule.backoff_factor

    def set_backoff_factor(self, new_factor):
        self._set("backoff_factor", new_factor)

    def get_growth_interval(self):
        return self._rule.growth_interval

    def set_growth_interval(self, new_interval):
        self._set("growth_interval", new_interval)

    def get_hysteresis(self):
        return self._rule.hysteresis

    def get_min_scale(self):
        return float(self._rule.min_scale)

    def get_max_scale(self):
        return float(self._rule.max_scale)

    def _get_growth_tracker(self):
        return int(self._state.growth_tracker) if self._enabled else 0

    # -- checkpoints --------------------------------------------------------------------------

    def _full_state(self):
        return {
            "scale": float(self._state.scale),
            "growth_factor": self._rule.growth_factor,
            "backoff_factor": self._rule.backoff_factor,
            "growth_interval": int(self._rule.growth_interval),
            "_growth_tracker": int(self._state.growth_tracker),
            "kind": self.kind,
            "hysteresis": int(self._rule.hysteresis),
            "hysteresis_tracker": int(self._state.hysteresis_tracker),
            "min_scale": float(self._rule.min_scale),
            "max_scale": float(self._rule.max_scale),
        }

    def state_dict(self):
        """GradScaler's keys ("scale", "growth_factor", "backoff_factor", "growth_interval",
        "_growth_tracker") plus "kind", "hysteresis", "hysteresis_tracker", "min_scale" and
        "max_scale", all plain Python values; empty when disabled. Loading it into a LossScaler
        resumes exactly (a GradScaler loads its five keys)."""
        return self._full_state() if self._enabled else {}

    def load_state_dict(self, state_dict):
        """Loads a state_dict of a LossScaler or of a GradScaler (whose missing keys keep this
        scaler's values: kind, hysteresis, bounds; the hysteresis tracker starts full). Raises
        ValueError when the result is not a valid rule. No-op when disabled."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        current = self._full_state()
        sd = dict(current)
        sd.update(state_dict)
        rule, state = _defaults(_kind_id(sd["kind"]))
        result = _apply_change(rule, state, {k: sd[k] for k in CHANGE_FIELDS})
        if isinstance(result, str):
            raise ValueError(f"LossScaler.load_state_dict: {result}")
        rule, state = result
        growth_tracker, reason = _integer("_growth_tracker", sd["_growth_tracker"], 64)
        if reason is None and "hysteresis_tracker" in state_dict:
            hysteresis_tracker, reason = _integer("hysteresis_tracker",
                                                  state_dict["hysteresis_tracker"], 32)
        else:
            hysteresis_tracker = rule.hysteresis
        if reason is not None:
            raise ValueError(f"LossScaler.load_state_dict: {reason}")
        state.growth_tracker = growth_tracker
        state.hysteresis_tracker = hysteresis_tracker
        self._rule, self._state = rule, state
        self._scale_value = float(state.scale)

    def __getstate__(self):
        return {"enabled": self._enabled, "state": self._full_state(),
                "last_found_inf": self._last_found_inf,
                "last_step_skipped": self.last_step_skipped}

    def __setstate__(self, saved):
        self.__init__(enabled=True)
        self.load_state_dict(saved["state"])
        self._enabled = saved["enabled"]
        self._last_found_inf = saved["last_found_inf"]
        self.last_step_skipped = saved["last_step_skipped"]

    def __repr__(self):
        return (f"LossScaler(kind={self.kind!r}, scale={self.get_scale()!r}, "
                f"enabled={self._enabled})")


# ---------------------------------------------------------------------------------------------
# Adapters.

class ScalerAdapter:
    """What the monitor sees of a scaler: see the module's docstring for the interface."""

    enabled = False
    scaler = None

    def settings(self):
        raise NotImplementedError

    def current_scale(self):
        raise NotImplementedError

    def apply_change(self, fields):
        raise NotImplementedError

    def install(self, hooks):
        raise NotImplementedError

    def uninstall(self):
        raise NotImplementedError


def _disabled_settings():
    return dict(kind=_capi.SCALER_STATIC, scale=1.0, growth_factor=0.0, backoff_factor=0.0,
                growth_interval=0, hysteresis=0, min_scale=0.0, max_scale=0.0)


class _LossScalerAdapter(ScalerAdapter):
    def __init__(self, scaler):
        self.scaler = scaler
        self.enabled = scaler.is_enabled()
        self._hooks = None

    def settings(self):
        s = self.scaler
        if not s.is_enabled():
            return _disabled_settings()
        rule = s._rule
        return dict(kind=int(rule.kind), scale=s._scale_value,
                    growth_factor=rule.growth_factor, backoff_factor=rule.backoff_factor,
                    growth_interval=int(rule.growth_interval),
                    hysteresis=int(rule.hysteresis) if rule.kind == _capi.SCALER_HYSTERESIS
                    else 0,
                    min_scale=float(rule.min_scale),
                    max_scale=0.0 if rule.max_scale == F32_MAX else float(rule.max_scale))

    def current_scale(self):
        return self.scaler._scale_value if self.enabled else 1.0

    def apply_change(self, fields):
        return self.scaler.apply_change(fields)

    def install(self, hooks):
        if self.scaler._hooks is not None:
            raise RuntimeError("this LossScaler already has hooks installed")
        self.scaler._hooks = self._hooks = hooks

    def uninstall(self):
        if self._hooks is not None and self.scaler._hooks is self._hooks:
            self.scaler._hooks = None
        self._hooks = None


_WRAPPED = ("scale", "unscale_", "step", "update", "load_state_dict", "__getstate__")
_MISSING = object()


def _stage_name(scaler, optimizer):
    st = scaler._per_optimizer_states.get(id(optimizer))
    return "READY" if st is None else getattr(st["stage"], "name", str(st["stage"]))


class _GradScalerAdapter(ScalerAdapter):
    def __init__(self, scaler):
        self.scaler = scaler
        self.enabled = bool(scaler.is_enabled())
        self._min = 0.0
        self._max = F32_MAX
        self._hooks = None
        self._saved = None
        self._disabled_unscaled = set()
        if not self.enabled:
            self._cached = 1.0
        elif scaler._scale is None:
            self._cached = _f32(float(scaler._init_scale))
        else:
            self._cached = float(scaler._scale.item())

    # -- the interface ------------------------------------------------------------------------

    def settings(self):
        if not self.enabled:
            return _disabled_settings()
        s = self.scaler
        return dict(kind=_capi.SCALER_DYNAMIC, scale=self._cached,
                    growth_factor=float(s._growth_factor),
                    backoff_factor=float(s._backoff_factor),
                    growth_interval=int(s._growth_interval), hysteresis=0,
                    min_scale=self._min, max_scale=0.0 if self._max == F32_MAX else self._max)

    def current_scale(self):
        return self._cached

    def _mirror(self):
        s = self.scaler
        rule, _ = _defaults(_capi.SCALER_DYNAMIC)
        rule.growth_factor = float(s._growth_factor)
        rule.backoff_factor = float(s._backoff_factor)
        rule.growth_interval = int(s._growth_interval)
        rule.hysteresis = 1
        rule.min_scale = self._min
        rule.max_scale = self._max
        state = _capi.LossScaleState()
        state.scale = self._cached
        state.hysteresis_tracker = 1
        state.growth_tracker = 0
        return rule, state

    def apply_change(self, fields):
        if not self.enabled:
            return "the GradScaler is disabled"
        fields = dict(fields)
        if "hysteresis" in fields:
            return "GradScaler has no hysteresis; use ampscope.torch.LossScaler(kind='hysteresis')"
        rule, state = self._mirror()
        result = _apply_change(rule, state, fields)
        if isinstance(result, str):
            return result
        rule, state = result
        s = self.scaler
        if "growth_factor" in fields:
            s.set_growth_factor(rule.growth_factor)
        if "backoff_factor" in fields:
            s.set_backoff_factor(rule.backoff_factor)
        if "growth_interval" in fields:
            s.set_growth_interval(int(rule.growth_interval))
        self._min, self._max = float(rule.min_scale), float(rule.max_scale)
        if "scale" in fields:
            value = float(state.scale)
            if s._scale is None:
                s._init_scale = value
            else:
                s._scale.fill_(value)
        if "scale" in fields or "growth_interval" in fields:
            if s._growth_tracker is None:
                s._init_growth_tracker = 0
            else:
                s._growth_tracker.fill_(0)
        if "min_scale" in fields or "max_scale" in fields:
            self._clamp(None)
        self._cached = float(state.scale)
        return None

    def _bounded(self):
        return self._min > 0.0 or self._max < F32_MAX

    def _clamp(self, previous):
        """The C dynamic rule's bounds on the GradScaler's scale (on the device, no sync): a
        growth past max_scale is undone (previous: the scale before the update), a backoff stops
        at min_scale."""
        s = self.scaler
        if s._scale is None:
            s._init_scale = min(max(float(s._init_scale), self._min), self._max)
            return
        if self._max < F32_MAX:
            if previous is not None:
                s._scale.copy_(torch.where(s._scale > self._max, previous, s._scale))
            else:
                s._scale.clamp_(max=self._max)
        if self._min > 0.0:
            s._scale.clamp_(min=self._min)

    # -- hooks --------------------------------------------------------------------------------

    def install(self, hooks):
        if self._saved is not None:
            raise RuntimeError("this adapter is already installed")
        s = self.scaler
        if any(getattr(s.__dict__.get(n), "_ampscope_wrapper", False) for n in _WRAPPED):
            raise RuntimeError("this GradScaler already has ampscope hooks installed")
        self._hooks = hooks
        self._saved = {n: s.__dict__.get(n, _MISSING) for n in _WRAPPED}
        originals = {n: getattr(s, n, None) for n in _WRAPPED}
        if originals["__getstate__"] is None:  # Python < 3.11 and no __getstate__ of its own
            originals["__getstate__"] = lambda: dict(s.__dict__)
        wrappers = {
            "scale": self._wrap_scale(originals["scale"]),
            "unscale_": self._wrap_unscale(originals["unscale_"]),
            "step": self._wrap_step(originals["step"]),
            "update": self._wrap_update(originals["update"]),
            "load_state_dict": self._wrap_load_state_dict(originals["load_state_dict"]),
            "__getstate__": self._wrap_getstate(originals["__getstate__"]),
        }
        for name, fn in wrappers.items():
            fn._ampscope_wrapper = True
            fn.__name__ = name
            fn.__doc__ = getattr(originals[name], "__doc__", None)
            setattr(s, name, fn)

    def uninstall(self):
        if self._saved is None:
            return
        s = self.scaler
        for name, value in self._saved.items():
            if value is _MISSING:
                s.__dict__.pop(name, None)
            else:
                s.__dict__[name] = value
        self._saved = None
        self._hooks = None

    def _hook(self, name, *args):
        _call_hook(self._hooks, name, *args)

    def _wrap_getstate(self, original):
        saved = self._saved

        def __getstate__():
            state = original()
            for name, value in saved.items():
                if value is _MISSING:
                    state.pop(name, None)
                else:
                    state[name] = value
            return state
        return __getstate__

    def _wrap_scale(self, original):
        def scale(outputs):
            result = original(outputs)
            if isinstance(outputs, torch.Tensor):
                self._hook("on_scale", outputs, self._cached)
            return result
        return scale

    def _wrap_unscale(self, original):
        def unscale_(optimizer):
            s = self.scaler
            if not self.enabled:
                result = original(optimizer)
                if id(optimizer) not in self._disabled_unscaled:
                    self._disabled_unscaled.add(id(optimizer))
                    self._hook("before_unscale", optimizer, 1.0)
                    self._hook("after_unscale", optimizer)
                return result
            if s._scale is None or _stage_name(s, optimizer) != "READY":
                return original(optimizer)  # raises, as the GradScaler does
            self._hook("before_unscale", optimizer, self._cached)
            result = original(optimizer)
            self._hook("after_unscale", optimizer)
            return result
        self._unscale = unscale_
        return unscale_

    def _found_on_host(self, optimizer):
        st = self.scaler._per_optimizer_states.get(id(optimizer))
        if st is None or not st["found_inf_per_device"]:
            return False
        return bool(sum(v.item() for v in st["found_inf_per_device"].values()))

    def _wrap_step(self, original):
        def step(optimizer, *args, **kwargs):
            s = self.scaler
            if not self.enabled:
                if id(optimizer) not in self._disabled_unscaled:
                    self._unscale(optimizer)
                result = original(optimizer, *args, **kwargs)
                self._hook("after_step", optimizer, False)
                return result
            plain = False
            try:
                plain = ("closure" not in kwargs and s._scale is not None
                         and not getattr(optimizer, "_step_supports_amp_scaling", False))
                stage = _stage_name(s, optimizer) if plain else None
            except Exception as exc:  # noqa: BLE001
                _report_error(self._hooks, "step", exc)
                plain = False
            if plain and stage == "READY":
                # The GradScaler's step would unscale here: do it through the hooks.
                self._unscale(optimizer)
                stage = "UNSCALED"
            skipped = None
            if plain and stage == "UNSCALED":
                # The host read GradScaler's step makes next, made first (its own is then free).
                try:
                    skipped = self._found_on_host(optimizer)
                except Exception as exc:  # noqa: BLE001
                    _report_error(self._hooks, "step", exc)
            result = original(optimizer, *args, **kwargs)
            if skipped is None:
                try:
                    skipped = self._found_on_host(optimizer)
                except Exception as exc:  # noqa: BLE001
                    _report_error(self._hooks, "step", exc)
                    skipped = False
            self._hook("after_step", optimizer, skipped)
            return result
        return step

    def _wrap_update(self, original):
        def update(new_scale=None):
            s = self.scaler
            if not self.enabled:
                result = original(new_scale)
                self._disabled_unscaled.clear()
                self._hook("on_update", False, 1.0, 1.0)
                return result
            before = self._cached
            found_sum = previous = None
            try:
                if s._scale is not None:
                    device = s._scale.device
                    found = [f.to(device=device, non_blocking=True).reshape(())
                             for st in s._per_optimizer_states.values()
                             for f in st["found_inf_per_device"].values()]
                    if found:
                        # Summed before GradScaler's update adds them up in place.
                        found_sum = torch.stack(found).sum()
                    if new_scale is None and self._max < F32_MAX:
                        previous = s._scale.clone()
            except Exception as exc:  # noqa: BLE001
                _report_error(self._hooks, "update", exc)
            result = original(new_scale)
            try:
                if new_scale is None and self._bounded():
                    self._clamp(previous)
                if found_sum is None:
                    found_sum = torch.zeros((), dtype=torch.float32, device=s._scale.device)
                found_value, after = torch.stack(
                    [found_sum.to(torch.float32), s._scale.reshape(())]).tolist()
                self._cached = float(after)
            except Exception as exc:  # noqa: BLE001
                _report_error(self._hooks, "update", exc)
                return result
            self._hook("on_update", bool(found_value), before, self._cached)
            return result
        return update

    def _wrap_load_state_dict(self, original):
        def load_state_dict(state_dict):
            result = original(state_dict)
            if self.enabled:
                try:
                    self._cached = _f32(float(state_dict["scale"]))
                except Exception as exc:  # noqa: BLE001
                    _report_error(self._hooks, "load_state_dict", exc)
            return result
        return load_state_dict


def _gradscaler_types():
    types = []
    cuda_amp = getattr(getattr(torch, "cuda", None), "amp", None)
    if cuda_amp is not None and hasattr(cuda_amp, "GradScaler"):
        types.append(cuda_amp.GradScaler)
    amp = getattr(torch, "amp", None)
    if amp is not None and isinstance(getattr(amp, "GradScaler", None), type):
        types.append(amp.GradScaler)
    return tuple(types)


def adapt_scaler(scaler):
    """A ScalerAdapter for `scaler` (ampscope.torch.LossScaler, torch.cuda.amp.GradScaler or
    torch.amp.GradScaler, subclasses included); None for None. TypeError otherwise."""
    if scaler is None:
        return None
    if isinstance(scaler, LossScaler):
        return _LossScalerAdapter(scaler)
    if isinstance(scaler, _gradscaler_types()):
        return _GradScalerAdapter(scaler)
    t = type(scaler)
    raise TypeError("scaler must be a torch.cuda.amp.GradScaler, torch.amp.GradScaler or "
                    f"ampscope.torch.LossScaler, got {t.__module__}.{t.__qualname__}")
