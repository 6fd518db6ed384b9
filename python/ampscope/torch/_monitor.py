"""The monitor: an ampscope agent attached to a PyTorch model, optimizer and loss scaler.

What it hooks (all removed again by Monitor.close()):
  - torch's global module forward pre-hook and forward hook (torch.nn.modules.module
    register_module_forward_*_hook), which act only on the attached model and its leaf modules,
    recognised by identity: nothing is put on the user's modules, so a model pickles
    (torch.save(model)) and deep-copies as it would unattached, and a copy is not monitored.
    The model's first training forward after a step ended begins the next step (agent
    begin_step); later forwards in the same step are micro-batches. A leaf module's floating
    outputs are activations (named after the module, `named_modules`), and a hook on each
    output that requires grad gives the activation gradient ("NAME.grad"); that hook holds the
    monitor weakly, so a graph the script keeps (a global `loss`) never keeps the monitor alive;
  - the scaler (ampscope.torch._scaler adapters): the loss at scale(), the weight gradients
    before (scaled) and after unscale_, found_inf, the scale before and after update(), which
    ends the step;
  - optimizer.step, as a bound method on the optimizer (as torch's LR schedulers wrap it; the
    optimizer's __getstate__ leaves it out of pickles and copies): counts optimizer steps (and
    ends the step when there is no scaler);
  - scheduler.step, when a scheduler is given, through its class (_SchedulerPatch; its
    state_dict() is its __dict__, so nothing may be added there): advances only when the
    optimizer stepped;
  - the leaves the server moves to FP32 (when a PolicyUpdate names them): the global hooks run
    them outside autocast, floating inputs cast to FP32.
An FP8/FP4 run's own framework (Transformer Engine style) applies per-layer precision itself:
attach(gemm_layers=..., on_gemm_precision=..., on_recipe=...) hands it the server's BF16 GEMM
set and delayed-scaling settings at their step, and Monitor.observe_quantizer reports each GEMM
input it quantises, counted by the agent against the recipe.
With a process group (several ranks), each step's end also runs the per-step policy agreement:
one max all-reduce of (-received policy seq, fallback wish) over that group, so that every rank
applies the server's updates, and falls back, at the same step (docs/multi-rank.md). Use a
gloo group (torch.distributed.new_group(backend="gloo")): its tensors live on the CPU, so the
agreement never synchronises with a CUDA stream.
Every hook body is guarded: an exception becomes a notice (Agent.add_notice), never an
exception in the training loop. Tensors are handed to the agent by address (data_ptr), with no
host synchronisation: CUDA tensors are measured on the agent's side stream, ordered after the
tensor's producer on the current stream, and the current stream waits for the measurement before
its next kernel, so neither later in-place updates nor the caching allocator (which reuses
memory in stream order) can change the memory under it.
"""

import contextlib
import functools
import itertools
import math
import operator
import threading
import time
import types
import warnings as _warnings
import weakref

import torch

from .. import _capi
from .._agent import Agent, recipe_targets_option, refusal, server_option, utf8
from . import _scaler

_FORMATS = {torch.float32: _capi.FORMAT_FP32, torch.float16: _capi.FORMAT_FP16,
            torch.bfloat16: _capi.FORMAT_BF16}
for _name, _fmt in (("float8_e4m3fn", _capi.FORMAT_E4M3), ("float8_e5m2", _capi.FORMAT_E5M2)):
    if hasattr(torch, _name):
        _FORMATS[getattr(torch, _name)] = _fmt
# Raw bytes (torch.uint8) of FP8 storage, for a torch without float8 dtypes.
_RAW_FP8 = {"e4m3": _capi.FORMAT_E4M3, "e5m2": _capi.FORMAT_E5M2}
_ROLES = {"weight": _capi.ROLE_WEIGHT, "master_weight": _capi.ROLE_MASTER_WEIGHT,
          "activation": _capi.ROLE_ACTIVATION, "activation_grad": _capi.ROLE_ACTIVATION_GRAD,
          "weight_grad": _capi.ROLE_WEIGHT_GRAD, "optimizer_state": _capi.ROLE_OPTIMIZER_STATE,
          "loss": _capi.ROLE_LOSS}
_PHASES = {"unknown": _capi.PHASE_UNKNOWN, "step_start": _capi.PHASE_STEP_START,
           "forward": _capi.PHASE_FORWARD, "backward": _capi.PHASE_BACKWARD,
           "after_unscale": _capi.PHASE_AFTER_UNSCALE}
_PRECISIONS = {torch.float16: ("amp-fp16", _capi.FORMAT_FP16),
               torch.bfloat16: ("amp-bf16", _capi.FORMAT_BF16),
               torch.float32: ("fp32", _capi.FORMAT_FP32)}
# Parameters of these modules reach their gradient in FP32 under autocast (autocast runs them in
# FP32 or leaves them alone), so their gradients are not held in the compute format.
_FP32_MODULES = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.Embedding,
                 torch.nn.EmbeddingBag, torch.nn.modules.batchnorm._BatchNorm)


def _dense_start(t):
    """The address of t's elements when they fill one block of memory (contiguous, or a
    permutation of contiguous dimensions), else None."""
    if t.is_contiguous():
        return t.data_ptr()
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return None
        expected *= sz
    return t.data_ptr()


class Monitor:
    """Returned by attach(). Public: step(i), loss(tensor), observe_quantizer(...), flush(),
    counters(), notices(), close(). Nothing here raises into the training loop once attach()
    returned, but for observe_quantizer's TypeError/ValueError on bad arguments (a programming
    error, raised on its first call)."""

    def __init__(self, model, optimizer, scaler, scheduler, agent, *, start_step, master_weights,
                 named_params, process_group=None, optimizer_steps=0, warnings=(),
                 gemm_precision=None):
        self._model = model
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._agent = agent
        self._adapter = scaler
        self._master_weights = master_weights
        self._next_step = start_step
        self._lock = threading.RLock()  # the monitor's step state (hooks run on autograd threads)
        self._in_step = False
        self._explicit = False
        self._wanted = False
        self._unscaled_stats = {}  # id(param) -> Stats from the scaler's fused unscale
        self._step = start_step
        self._micro = 0
        self._order = itertools.count()
        self._t0 = 0.0
        self._losses = []
        self._optimizer_steps = optimizer_steps  # applied so far, the resumed run's included
        self.warnings = list(warnings)  # what attach() found wrong with the setup (str each)
        self._last_skipped = False  # this step's optimizer step was skipped
        self._prev_skipped = False  # the step that ended last was skipped (for the scheduler)
        self._update = None  # (found_inf, scale_before, scale_after) of the step's update()
        self._fp32_active = set()
        self._policy_log = []  # what the agent applied, or was refused, and at which step
        self._handles = []
        self._restores = []
        self._closed = False
        self._param_names = named_params  # id(param) -> (bytes name, held format or None)
        # The leaf modules, observed and offered to the FP32 fallback: id -> (weak reference,
        # qualified name). Identity, not an attribute on the module, says a module is ours.
        self._leaf_ids = {id(module): (weakref.ref(module), name)
                          for name, module in model.named_modules()
                          if name and not any(True for _ in module.children())}
        self._leaf_names = {name for _, name in self._leaf_ids.values()}
        self._leaf_outputs = {}  # name -> (output names, their gradient hooks)
        self._thread = threading.local()  # the FP32 fallback's autocast contexts, per thread
        self._encoded = {}
        self._group = process_group  # the agreement's torch.distributed group, or None
        # Per-layer precision of an FP8/FP4 run: (gemm layers or None, on_gemm_precision,
        # on_recipe) as attach() checked them, and the BF16 set the user's framework accepted.
        self._gemm_layers, self._on_gemm_precision, self._on_recipe = gemm_precision or (
            None, None, None)
        self._bf16_gemms = set()

    # -- wiring --------------------------------------------------------------------------------

    def _install(self):
        # Module hooks go into torch's global registries, not onto the user's modules: a module
        # then pickles (torch.save(model)) and deep-copies (an EMA copy) exactly as it would
        # unattached, and a copy, whose modules are other objects, is not monitored. The hooks
        # recognise the attached modules by identity.
        hooks = torch.nn.modules.module
        self._handles.append(hooks.register_module_forward_pre_hook(self._global_pre_hook))
        self._handles.append(hooks.register_module_forward_hook(self._global_forward_hook))
        if self._adapter is not None:
            self._adapter.install(self)
            a = self._adapter
            status = self._agent.attach_scaler(self._schedule, a.current_scale)
            if status != _capi.OK:
                self._notice("torch: the scaler could not be attached: " +
                             self._agent.last_error())
        if self._leaf_names:
            status = self._agent.attach_overrides(list(self._leaf_names), self._replace_fp32)
            if status != _capi.OK:
                self._notice("torch: FP32 fallback unavailable: " + self._agent.last_error())
        if self._gemm_layers is not None or self._on_recipe is not None:
            status = self._agent.attach_gemm_precision(
                self._gemm_layers, self._replace_bf16,
                self._schedule_recipe if self._on_recipe is not None else None)
            if status != _capi.OK:
                self._notice("torch: per-layer precision unavailable: " +
                             self._agent.last_error())
        if self._optimizer is not None:
            self._wrap_optimizer_step()
        if self._scheduler is not None:
            self._restores.append(_SchedulerPatch.attach(self._scheduler, self))

    def _global_pre_hook(self, module, inputs):
        if self._closed:
            return None
        where = "forward pre-hook"
        try:
            if module is self._model:
                if self._fp32_active:
                    self._unwind_fp32()
                self._on_root_forward(module, inputs)
                return None
            name = self._leaf_name(module)
            if name is not None and name in self._fp32_active:
                where = "FP32 fallback of " + name
                return self._enter_fp32(inputs)
        except Exception as e:  # the training loop never sees the monitor's failures
            self.on_error(where, e)
        return None

    def _global_forward_hook(self, module, inputs, output):
        if self._closed:
            return None
        name = self._leaf_name(module)
        if name is None:
            return None
        where = "forward hook on " + name
        try:
            if name in self._fp32_active:
                self._exit_fp32()
            self._on_leaf_forward(name, output)
        except Exception as e:
            self.on_error(where, e)
        return None

    def _leaf_name(self, module):
        entry = self._leaf_ids.get(id(module))
        if entry is None or entry[0]() is not module:  # another object at a reused id
            return None
        return entry[1]

    def _wrap_optimizer_step(self):
        # A bound method of the optimizer on the instance, as torch's LR schedulers install
        # theirs: a scheduler created later wraps it (it needs __self__/__func__), and the
        # optimizer's own __getstate__ leaves it out of pickles and copies.
        opt = self._optimizer
        original = opt.step
        had_own = "step" in vars(opt)
        monitor = weakref.ref(self)

        @functools.wraps(original)  # keeps marks such as the LR scheduler's _with_counter
        def step(_opt, *args, **kwargs):
            mon = monitor()
            if mon is None or mon._closed:
                return original(*args, **kwargs)
            return mon._optimizer_step(original, *args, **kwargs)

        bound = types.MethodType(step, opt)
        opt.step = bound

        def restore():
            current = vars(opt).get("step")
            if current is None or getattr(current, "__func__", None) is not step:
                return  # wrapped again since (a scheduler made later): ours stays, inert
            if had_own:
                opt.step = original
            else:
                del opt.step

        self._restores.append(restore)

    def _guard(self, where, fn):
        def guarded(*args, **kwargs):
            if self._closed:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # the training loop never sees the monitor's failures
                self.on_error(where, e)
                return None
        return guarded

    def on_error(self, where, exc):
        """A hook failed: one notice per distinct failure (shown by ampscope show)."""
        self._notice(f"torch: {where} failed: {type(exc).__name__}: {exc}")

    def _notice(self, text):
        with contextlib.suppress(Exception):
            self._agent.add_notice(text)

    def _name(self, text):
        b = self._encoded.get(text)
        if b is None:
            b = self._encoded[text] = utf8(text)
        return b

    # -- steps ---------------------------------------------------------------------------------

    def _begin(self, step):
        self._in_step = True
        self._step = step
        self._micro = 0
        self._order = itertools.count()
        self._losses = []
        self._update = None
        self._t0 = time.perf_counter()
        self._wanted = self._agent.begin_step(step)  # may apply a policy (scale, FP32 set)
        if self._wanted:
            self._agent.mark_phase(_capi.STEP_PHASE_FORWARD)
            if self._master_weights and self._agent.wanted(_capi.ROLE_MASTER_WEIGHT,
                                                           _capi.PHASE_STEP_START):
                self._observe_params(_capi.ROLE_MASTER_WEIGHT, _capi.PHASE_STEP_START, 1.0,
                                     grads=False)

    def _end(self):
        if not self._in_step:
            return
        if self._update is None:  # no scaler update this step: the scale did not move
            scale = self._scale_now()
            found_inf, before, after = False, scale, scale
        else:
            found_inf, before, after = self._update
        loss = lr = 0.0
        try:
            # The sum over micro-batches: with the usual loss / accumulation_steps, the
            # effective batch's mean loss.
            if self._losses:
                loss = float(torch.stack([x.float().mean() for x in self._losses]).sum())
            if self._optimizer is not None and self._optimizer.param_groups:
                lr = float(self._optimizer.param_groups[0].get("lr", 0.0))
        except Exception as e:  # the step is still reported
            self.on_error("step loss", e)
        step = self._step
        self._in_step = False
        self._wanted = False
        self._next_step = step + 1
        skipped = self._last_skipped or (self._adapter is not None and found_inf)
        self._prev_skipped = skipped
        self._agent.end_step(step=step, loss=loss, loss_scale=before, scale_after=after,
                             found_inf=found_inf, skipped=skipped, lr=lr,
                             step_time_s=time.perf_counter() - self._t0,
                             optimizer_steps=self._optimizer_steps,
                             fp32_layers=sorted(self._fp32_active),
                             bf16_gemms=sorted(self._bf16_gemms))
        self._last_skipped = False
        if self._group is not None:
            self._agree()

    def _agree(self):
        """The per-step policy agreement: every rank calls this once per step (a collective),
        so it runs even when the step's report failed."""
        try:
            seq, fallback = self._agent.policy_vote()
            votes = torch.tensor([-float(seq), 1.0 if fallback else 0.0], dtype=torch.float64)
            torch.distributed.all_reduce(votes, op=torch.distributed.ReduceOp.MAX,
                                         group=self._group)
            agreed_seq, agreed_fallback = int(-votes[0].item()), votes[1].item() != 0.0
        except Exception as e:  # no agreement this step: nothing new applies anywhere
            self.on_error("policy agreement", e)
            return
        if self._agent.policy_agreed(agreed_seq, agreed_fallback) != _capi.OK:
            self._notice("torch: policy agreement refused: " + self._agent.last_error())

    def _scale_now(self):
        return self._adapter.current_scale() if self._adapter is not None else 1.0

    @contextlib.contextmanager
    def step(self, step):
        """`with mon.step(i):` marks step i's boundaries explicitly (for loops whose steps the
        monitor cannot see: no scaler and no optimizer, or several forwards outside a step)."""
        with self._lock:
            try:
                if self._in_step:
                    self._end()
                self._explicit = True
                self._begin(int(step))
            except Exception as e:
                self.on_error("step begin", e)
        try:
            yield self
        finally:
            with self._lock:
                try:
                    self._end()
                except Exception as e:
                    self.on_error("step end", e)
                self._explicit = False

    def loss(self, loss):
        """Reports the step's loss (a tensor) where no scaler's scale() sees it."""
        try:
            self.on_scale(loss, self._scale_now(), reported=True)
        except Exception as e:
            self.on_error("loss", e)

    # -- hooks ---------------------------------------------------------------------------------

    def _on_root_forward(self, module, inputs):
        if not module.training or not torch.is_grad_enabled():
            return  # evaluation: not a training step
        with self._lock:
            if not self._in_step:
                if self._explicit:
                    return
                self._begin(self._next_step)
            else:
                self._micro += 1

    def _on_leaf_forward(self, name, output):
        if not (self._in_step and self._wanted):
            return
        # The k-th floating output's name (NAME, NAME.1, NAME.2, ...) and the hook on its
        # gradient (NAME.grad, NAME.1.grad, ...).
        names, grad_hooks = self._leaf_outputs.setdefault(name, ([], []))
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        k = 0
        for t in outputs:
            if not (isinstance(t, torch.Tensor) and t.dtype in _FORMATS):
                continue
            if len(names) <= k:
                base = name if k == 0 else f"{name}.{k}"
                names.append(self._name(base))
                grad_hooks.append(_GradHook(self, "gradient hook on " + base,
                                            self._name(base + ".grad")))
            self._observe(names[k], _capi.ROLE_ACTIVATION, _capi.PHASE_FORWARD, t, 1.0)
            if t.requires_grad:
                t.register_hook(grad_hooks[k])
            k += 1

    def _on_grad(self, gname, grad):
        if self._in_step and self._wanted and grad is not None and grad.dtype in _FORMATS:
            self._observe(gname, _capi.ROLE_ACTIVATION_GRAD, _capi.PHASE_BACKWARD, grad,
                          self._scale_now())

    def _enter_fp32(self, inputs):
        """A leaf the server moved to FP32 begins its forward: autocast off and its floating
        inputs in FP32 until its forward ends (_exit_fp32)."""
        stack = contextlib.ExitStack()
        if torch.is_autocast_enabled():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        if torch.is_autocast_cpu_enabled():
            stack.enter_context(torch.autocast("cpu", enabled=False))
        self._fp32_stack().append(stack)
        return _to_fp32(inputs)

    def _exit_fp32(self):
        stack = self._fp32_stack()
        if stack:
            stack.pop().close()

    def _fp32_stack(self):
        s = getattr(self._thread, "fp32", None)
        if s is None:
            s = self._thread.fp32 = []
        return s

    def _unwind_fp32(self):
        # A forward that raised never reached its forward hook: autocast comes back on at the
        # next step's first forward (or at close) rather than staying off for the rest of the run.
        stack = self._fp32_stack()
        while stack:
            with contextlib.suppress(Exception):
                stack.pop().close()

    def _observe(self, name, role, phase, t, scale, held=None):
        t = t.detach()
        start = _dense_start(t)
        if start is None:
            t = t.contiguous()  # a strided view: measured on a dense copy
            start = t.data_ptr()
        if t.is_cuda:
            device = _capi.DEVICE_CUDA
            stream = torch.cuda.current_stream(t.device).cuda_stream
        else:
            device, stream = _capi.DEVICE_CPU, None
        self._agent.observe(name, role, phase, _FORMATS[t.dtype], start, t.numel(),
                            device=device, stream=stream, scale=scale, micro_step=self._micro,
                            order=next(self._order), held=held)

    def _param_name(self, p):
        name, held = self._param_names.get(id(p), (None, None))
        if name is None:
            name = self._name(f"param{len(self._param_names)}")
            self._param_names[id(p)] = (name, None)
        return name, held

    def _observe_params(self, role, phase, scale, grads=True, fused=None):
        if self._optimizer is not None:
            params = (p for g in self._optimizer.param_groups for p in g["params"])
        else:
            params = self._model.parameters()
        for p in params:
            t = p.grad if grads else p
            if t is None or t.dtype not in _FORMATS:
                continue
            name, held = self._param_name(p)
            stats = fused.get(id(p)) if fused else None
            if stats is not None:
                self._agent.observe_stats(name, role, phase, _FORMATS[t.dtype], t.numel(), stats,
                                          data=t.data_ptr(), scale=scale,
                                          micro_step=self._micro, order=next(self._order),
                                          held=held)
                continue
            self._observe(name, role, phase, t, scale, held=held if grads else None)

    # The scaler adapter's hooks (ampscope.torch._scaler).

    def on_scale(self, loss, scale, reported=False):
        if not isinstance(loss, torch.Tensor) or not self._in_step:
            return
        self._losses.append(loss.detach())
        if self._wanted and loss.dtype in _FORMATS:
            self._observe(self._name("loss"), _capi.ROLE_LOSS, _capi.PHASE_FORWARD, loss, 1.0)
        if self._wanted and not reported:
            self._agent.mark_phase(_capi.STEP_PHASE_BACKWARD)

    def before_unscale(self, optimizer, scale):
        if self._in_step and self._wanted:
            self._agent.mark_phase(_capi.STEP_PHASE_UNSCALE_CHECK)
            self._observe_params(_capi.ROLE_WEIGHT_GRAD, _capi.PHASE_BACKWARD, scale)

    def unscale_stats_target(self, param):
        # Fused statistics: a LossScaler asks, before its unscale pass, which CPU gradients to
        # measure in that pass and against what target (the agent's, for this gradient now).
        if not (self._in_step and self._wanted):
            return None
        grad = param.grad
        name, held = self._param_name(param)
        return self._agent.stats_target(name, _capi.ROLE_WEIGHT_GRAD, _capi.PHASE_AFTER_UNSCALE,
                                        _FORMATS[grad.dtype], grad.numel(), held=held)

    def on_unscaled_stats(self, param, stats):
        self._unscaled_stats[id(param)] = stats

    def after_unscale(self, optimizer):
        # Unscaled weight gradients are measured on full steps only: ask before preparing them.
        # Those the scaler measured in its unscale pass go with their statistics.
        fused, self._unscaled_stats = self._unscaled_stats, {}
        if self._in_step and self._wanted and self._agent.wanted(_capi.ROLE_WEIGHT_GRAD,
                                                                 _capi.PHASE_AFTER_UNSCALE):
            self._observe_params(_capi.ROLE_WEIGHT_GRAD, _capi.PHASE_AFTER_UNSCALE, 1.0,
                                 fused=fused)

    def after_step(self, optimizer, skipped):
        self._last_skipped = bool(skipped)

    def on_update(self, found_inf, scale_before, scale_after):
        with self._lock:
            self._update = (bool(found_inf), float(scale_before), float(scale_after))
            if not self._explicit:
                self._end()

    # Optimizer and scheduler wrappers.

    def _optimizer_step(self, original, *args, **kwargs):
        if self._adapter is None:
            self._guard("optimizer step", self._before_plain_step)()
        result = original(*args, **kwargs)
        self._optimizer_steps += 1
        if self._adapter is None:
            self._guard("optimizer step", self._after_plain_step)()
        return result

    def _before_plain_step(self):
        if self._in_step and self._wanted:
            self._agent.mark_phase(_capi.STEP_PHASE_OPTIMIZER)
            self._observe_params(_capi.ROLE_WEIGHT_GRAD, _capi.PHASE_BACKWARD, 1.0)

    def _after_plain_step(self):
        with self._lock:
            if not self._explicit:
                self._end()

    def _scheduler_step(self, original, *args, **kwargs):
        if self._prev_skipped:
            self._prev_skipped = False
            return None  # the learning rate advances with optimizer steps only
        return original(*args, **kwargs)

    # -- policy (called by the agent from begin_step, on the training thread) -----------------

    def _schedule(self, fields, step):
        reason = self._adapter.apply_change(fields)
        self._policy_log.append({"step": step, "scaler": dict(fields), "refused": reason})
        return reason

    def _replace_fp32(self, layers, from_step):
        unknown = [n for n in layers if n not in self._leaf_names]
        if unknown:
            return "not a leaf module of the model: " + ", ".join(unknown[:4])
        # The global hooks run these leaves outside autocast from now on (_enter_fp32).
        self._fp32_active = set(layers)
        self._policy_log.append({"step": from_step, "fp32_layers": sorted(layers),
                                 "refused": None})
        return None

    def _replace_bf16(self, layers, from_step):
        unknown = [n for n in layers if n not in self._gemm_layers]
        if unknown:
            reason = "not one of gemm_layers: " + ", ".join(unknown[:4])
        else:
            reason = refusal(lambda: self._on_gemm_precision(sorted(layers), from_step))
        if reason is None:
            self._bf16_gemms = set(layers)
        self._policy_log.append({"step": from_step, "bf16_gemms": sorted(layers),
                                 "refused": reason})
        return reason

    def _schedule_recipe(self, history_length, margin, from_step):
        reason = refusal(lambda: self._on_recipe(history_length, margin, from_step))
        change = {k: v for k, v in (("amax_history_length", history_length),
                                    ("margin", margin)) if v is not None}
        self._policy_log.append({"step": from_step, "recipe": change, "refused": reason})
        return reason

    # -- public --------------------------------------------------------------------------------

    def observe_quantizer(self, tensor, recipe, name, *, layer=None, what_if=False,
                          role="activation", phase="forward", dtype=None, amax_history=None,
                          loss_cost=None):
        """Reports a quantiser: `tensor`, a GEMM input as it was before `recipe` quantised it (or,
        with what_if=True, the input of a GEMM that ran in BF16, to say what the recipe would
        have done), counted by the agent against the recipe (ampscope/recipe.h's recipe_counts,
        in rows of the last dimension, what `ampscope stats --target RECIPE` counts) on each
        step the agent records; `ampscope show` lists it with the run's quantisers.

        tensor        torch.float32 / float16 / bfloat16, torch.float8_e4m3fn / float8_e5m2, or
                      the raw bytes of FP8 storage (torch.uint8) with dtype="e4m3" or "e5m2"
                      (a torch without float8 dtypes). A CUDA tensor is copied to the host on
                      recorded steps (a synchronisation)
        recipe        "mxfp8_e4m3", "mxfp4", "nvfp4", "e4m3:current", "e4m3:tile=1x128",
                      "e4m3:scale=S" (a delayed recipe's scale S), ...
        name          the quantiser's name ("h0.attn.qkv.input")
        layer         the linear layer whose GEMM it feeds, one of attach(gemm_layers=...):
                      the unit the server moves to BF16; None: none it can move
        role, phase   "activation", "weight", "activation_grad", ...; "forward", "backward"
        amax_history  a delayed recipe's amax history, oldest first (floats or a 1-D tensor)
        loss_cost     the first-order loss change the recipe causes through the layer's output
                      on this step, nats: sum(dL/dY * (Y_recipe - Y)) with the loss gradient
                      unscaled (a finite float; docs/pytorch.md). Report it on the layer's
                      output-gradient quantiser; the server's policy then ranks the layer by
                      it. None: not measured

        Returns True when the agent recorded it. TypeError or ValueError (the agent's message:
        a recipe that is not one, a dtype it cannot take) on bad arguments."""
        args = self._quantizer_args(tensor, recipe, name, layer, role, phase, dtype,
                                    amax_history)
        if loss_cost is not None:
            if isinstance(loss_cost, bool) or not isinstance(loss_cost, (int, float)):
                raise TypeError(f"loss_cost must be a float or None, got {type(loss_cost).__name__}")
            if not math.isfinite(loss_cost):
                raise ValueError(f"loss_cost must be finite, got {loss_cost!r}")
        if self._closed:
            return False
        recording = self._in_step and self._wanted
        t = tensor.detach()
        if recording:
            if t.is_cuda:
                t = t.cpu()
            t = t.contiguous()
        status = self._agent.observe_quantizer(
            args["name"], args["role"], args["phase"], args["dtype"],
            t.data_ptr() if recording else None, tuple(t.shape) or (1,),
            args["recipe"], layer=args["layer"], what_if=what_if,
            amax_history=args["amax_history"], micro_step=self._micro,
            loss_cost=None if loss_cost is None else float(loss_cost))
        if status == _capi.INVALID_ARGUMENT:
            raise ValueError("observe_quantizer: " + self._agent.last_error())
        return recording and status == _capi.OK

    def _quantizer_args(self, tensor, recipe, name, layer, role, phase, dtype, amax_history):
        """observe_quantizer's arguments as the agent takes them; TypeError/ValueError naming
        the bad one."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        for what, value in (("recipe", recipe), ("name", name)):
            if not isinstance(value, str) or not value:
                raise TypeError(f"{what} must be a non-empty str, got {value!r}")
        if layer is not None and not isinstance(layer, str):
            raise TypeError(f"layer must be a str or None, got {type(layer).__name__}")
        if layer and (self._gemm_layers is None or layer not in self._gemm_layers):
            raise ValueError(f"layer {layer!r} is not one of attach(gemm_layers=...)")
        if role not in _ROLES:
            raise ValueError(f"role must be one of {sorted(_ROLES)}, got {role!r}")
        if phase not in _PHASES:
            raise ValueError(f"phase must be one of {sorted(_PHASES)}, got {phase!r}")
        if tensor.dtype == torch.uint8:
            if dtype not in _RAW_FP8:
                raise ValueError("a torch.uint8 tensor holds FP8 bytes: dtype must be 'e4m3' or "
                                 f"'e5m2', got {dtype!r}")
            fmt = _RAW_FP8[dtype]
        elif tensor.dtype in _FORMATS:
            if dtype is not None:
                raise ValueError(f"dtype is for torch.uint8 bytes only; the tensor is "
                                 f"{tensor.dtype}")
            fmt = _FORMATS[tensor.dtype]
        else:
            raise TypeError(f"tensor must be float32, float16, bfloat16, float8 or uint8 (FP8 "
                            f"bytes), got {tensor.dtype}")
        history = None
        if amax_history is not None:
            if isinstance(amax_history, torch.Tensor):
                amax_history = amax_history.detach().flatten().tolist()
            history = [float(a) for a in amax_history]
        return {"name": self._name(name), "role": _ROLES[role], "phase": _PHASES[phase],
                "dtype": fmt, "recipe": utf8(recipe), "layer": utf8(layer or ""),
                "amax_history": history}

    @property
    def bf16_gemms(self):
        """The layers of gemm_layers whose GEMMs run in BF16 now (as on_gemm_precision
        accepted them), sorted."""
        return sorted(self._bf16_gemms)

    @property
    def agent(self):
        return self._agent

    @property
    def policy_log(self):
        """The server's changes as they reached this process, oldest first: dicts with "step"
        (the step they govern from), "scaler" (the fields changed), "fp32_layers" (the new FP32
        set), "bf16_gemms" (the new BF16 GEMM set) or "recipe" (the delayed-scaling settings
        changed: amax_history_length, margin), and "refused" (None, or why the scaler or the
        user's callback refused)."""
        return list(self._policy_log)

    @property
    def optimizer_steps(self):
        """The optimizer steps applied so far (skipped steps are not), a resumed run's earlier
        ones included: save it with a checkpoint and give it to attach(optimizer_steps=) on
        resume, as the reports' optimizer_steps then continue exactly."""
        return self._optimizer_steps

    def flush(self, timeout_s=10.0):
        """Waits until the server acknowledged everything so far; True when it did."""
        return self._agent.flush(timeout_s)

    def counters(self):
        return self._agent.counters()

    def notices(self):
        return self._agent.notices()

    def close(self, timeout_s=None):
        """Removes its hooks and wrappers (never the user's), ends a step left open, flushes
        for up to timeout_s (default: the agent's flush_timeout_ms, 10 s unless set) and stops
        the agent. Idempotent; True when everything was acknowledged."""
        if self._closed:
            return True
        with self._lock:
            with contextlib.suppress(Exception):
                self._end()
            self._closed = True
        self._unwind_fp32()
        for h in self._handles:
            with contextlib.suppress(Exception):
                h.remove()
        for restore in reversed(self._restores):
            with contextlib.suppress(Exception):
                restore()
        if self._adapter is not None:
            with contextlib.suppress(Exception):
                self._adapter.uninstall()
        return self._agent.close(timeout_s)


class _GradHook:
    """The hook on an activation's gradient. It lives in the autograd graph of the user's
    tensors (a `loss` kept as a global keeps it alive), so it holds the monitor weakly: the
    graph never keeps the monitor, and through it the model, optimizer and scheduler, alive."""

    __slots__ = ("_monitor", "_where", "_gname")

    def __init__(self, monitor, where, gname):
        self._monitor = weakref.ref(monitor)
        self._where = where
        self._gname = gname

    def __call__(self, grad):
        mon = self._monitor()
        if mon is None or mon._closed:
            return None
        try:
            mon._on_grad(self._gname, grad)
        except Exception as e:
            mon.on_error(self._where, e)
        return None


class _SchedulerPatch:
    """scheduler.step advancing only on steps the optimizer took, without a single attribute on
    the scheduler: state_dict() is a copy of the scheduler's __dict__, so anything put there
    would be saved (and fail to pickle) with every checkpoint. Instead the scheduler's class
    gets a step that looks the scheduler up by identity and passes every other instance (a
    deep copy, a scheduler nobody attached) straight to the class's own step. The class's step
    is restored when the last monitored scheduler of that class is detached, unless something
    replaced it since."""

    _patched = {}    # class -> (the class's own step or None, the installed step)
    _attached = {}   # id(scheduler) -> (weak reference to it, weak reference to its monitor)

    @classmethod
    def attach(cls, scheduler, monitor):
        klass = type(scheduler)
        if klass not in cls._patched:
            own = klass.__dict__.get("step")
            inherited = getattr(klass, "step")
            attached = cls._attached

            @functools.wraps(inherited)
            def step(self, *args, **kwargs):
                entry = attached.get(id(self))
                mon = entry[1]() if entry is not None and entry[0]() is self else None
                if mon is None or mon._closed:
                    return inherited(self, *args, **kwargs)
                return mon._scheduler_step(functools.partial(inherited, self), *args, **kwargs)

            klass.step = step
            cls._patched[klass] = (own, step)
        key = id(scheduler)
        cls._attached[key] = (weakref.ref(scheduler), weakref.ref(monitor))

        def detach():
            entry = cls._attached.get(key)
            if entry is not None and entry[1]() in (monitor, None):
                del cls._attached[key]
            if any(type(ref()) is klass for ref, _ in cls._attached.values()):
                return
            own, installed = cls._patched.pop(klass, (None, None))
            if klass.__dict__.get("step") is not installed:
                return  # replaced since: leave it (ours passes through)
            if own is None:
                delattr(klass, "step")
            else:
                klass.step = own
        return detach


def _gemm_precision(gemm_layers, on_gemm_precision, on_recipe):
    """attach()'s per-layer precision arguments, checked: (set of layers or None,
    on_gemm_precision, on_recipe), or None when none is given. TypeError/ValueError naming the
    argument."""
    if gemm_layers is None and on_gemm_precision is None and on_recipe is None:
        return None
    if (gemm_layers is None) != (on_gemm_precision is None):
        raise TypeError("gemm_layers and on_gemm_precision go together: the layers the server "
                        "may move to BF16, and the callback that moves them")
    layers = None
    if gemm_layers is not None:
        if isinstance(gemm_layers, str) or not all(isinstance(n, str) and n
                                                   for n in gemm_layers):
            raise TypeError("gemm_layers must be a list of non-empty str")
        layers = list(gemm_layers)
        if len(set(layers)) != len(layers):
            raise ValueError(f"gemm_layers names a layer twice: {layers}")
        if not callable(on_gemm_precision):
            raise TypeError("on_gemm_precision must be callable(bf16_layers, from_step)")
    if on_recipe is not None and not callable(on_recipe):
        raise TypeError("on_recipe must be callable(history_length, margin, from_step)")
    return (set(layers) if layers is not None else None, on_gemm_precision, on_recipe)


def _to_fp32(value):
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, tuple):
        return tuple(_to_fp32(v) for v in value)
    if isinstance(value, list):
        return [_to_fp32(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_fp32(v) for k, v in value.items()}
    return value


_live = weakref.WeakSet()


def _count(what, value):
    """An int >= 0 below 2^63 (the C API's int64), from anything that is an integer
    (operator.index: numpy integers too), never a bool."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise TypeError(f"{what} must be an int >= 0, got the bool {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int >= 0, got {type(value).__name__} "
                        f"{value!r}") from None
    if not 0 <= n < 2 ** 63:
        raise ValueError(f"{what} must be an int >= 0 (and below 2^63), got {n}")
    return n


def _disabled_by_torch(scaler):
    """A CUDA GradScaler that torch disabled itself for want of CUDA (the user asked for it
    enabled, or did not say), as opposed to one made with enabled=False on a CUDA machine."""
    if scaler.is_enabled():
        return False
    device = getattr(scaler, "_device", "cuda")
    return str(device).startswith("cuda") and not torch.cuda.is_available()


def attach(model, optimizer=None, scaler=None, *, run_id=None, server=None, options=None,
           compute_dtype=None, scheduler=None, master_weights=False, start_step=0,
           optimizer_steps=None, process_group=None, recipe_targets=None, gemm_layers=None,
           on_gemm_precision=None, on_recipe=None):
    """Attaches an ampscope agent to a training loop and returns its Monitor.

    model          torch.nn.Module (its modules' qualified names name the tensors)
    optimizer      torch.optim.Optimizer or None (its parameters' gradients are reported)
    scaler         torch.cuda.amp.GradScaler, torch.amp.GradScaler, ampscope.torch.LossScaler
                   or None (an FP32 run, or a bf16 run without scaling)
    run_id, server the run's id and ampscope-server's address (else AMPSCOPE_RUN_ID,
                   AMPSCOPE_SERVER from the environment); several servers as "a:50051,b:50051"
                   or ["a:50051", "b:50051"]: tried in order, a redirect followed to the run's
                   owner
    options        the agent's options ({"sample_full_every": 10, "spool_dir": "..."}); the
                   environment's AMPSCOPE_* apply first
    compute_dtype  the autocast dtype (torch.float16 / torch.bfloat16 / torch.float32); default
                   float16 with a GradScaler, float32 without a scaler
    scheduler      an LR scheduler that should advance only when the optimizer stepped
    master_weights a bool: also report the FP32 parameters at the start of each measured step
    start_step     the number of the first step (a resumed run's); an int >= 0 (numpy
                   integers too)
    optimizer_steps the optimizer steps a resumed run had applied before start_step
                   (Monitor.optimizer_steps saved with its checkpoint); default start_step
    process_group  a torch.distributed group of the data-parallel ranks (a gloo group, so the
                   agreement stays on the CPU): sets the agent's rank and world_size from it
                   and runs the per-step policy agreement over it at the end of every step;
                   every rank must attach with it. None: one rank (or, with several ranks and
                   no group, the agents refuse loss-scale changes)
    recipe_targets scaled FP8/FP6/FP4 recipes to count every tensor measured in full against
                   (the agent's recipe_targets option): ["mxfp8_e4m3", "nvfp4"] or
                   "mxfp8_e4m3,nvfp4", the texts `ampscope stats --target` takes; at most 8.
                   Each becomes a quantiser of the tensor in `ampscope show`. CPU tensors
                   only: tensors on a GPU are not counted against recipes
    gemm_layers, on_gemm_precision
                   per-layer precision of an FP8/FP4 run whose framework quantises the GEMMs:
                   the linear layers whose GEMMs can run in BF16 instead of the recipe, and
                   on_gemm_precision(bf16_layers, from_step), called at the start of step
                   from_step with the complete BF16 set the server chose (the rest run the
                   recipe); it returns None to accept or a str saying why not. Given together
    on_recipe      on_recipe(history_length, margin, from_step) for a run with delayed
                   scaling: the amax history length and margin (binades) from from_step on,
                   None for one the server leaves alone; None, or a str refusal. Without it
                   the server's delayed-scaling changes are refused

    Raises TypeError or ValueError naming the bad argument (the agent's own rules for run_id
    and server included), ampscope.AgentError when the agent cannot start; after that, nothing
    the monitor does raises into the loop. Monitor.warnings lists what is attached but will not
    work as a user expects (a GradScaler torch disabled), each also sent as a notice."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, "
                        f"got {type(optimizer).__name__}")
    adapter = _scaler.adapt_scaler(scaler)  # TypeError naming `scaler`
    if run_id is not None and not isinstance(run_id, str):
        raise TypeError(f"run_id must be a str, got {type(run_id).__name__}")
    if run_id is not None and not run_id:
        raise ValueError("run_id must not be empty")
    if server is not None:
        server = server_option(server)  # TypeError naming `server`
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    if recipe_targets is not None:
        recipe_targets = recipe_targets_option(recipe_targets)  # naming `recipe_targets`
    gemm_precision = _gemm_precision(gemm_layers, on_gemm_precision, on_recipe)
    if scheduler is not None and not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"scheduler must have a step() method, got {type(scheduler).__name__}")
    start_step = _count("start_step", start_step)
    optimizer_steps = start_step if optimizer_steps is None else _count("optimizer_steps",
                                                                         optimizer_steps)
    if not isinstance(master_weights, bool):
        raise TypeError(f"master_weights must be a bool, got {type(master_weights).__name__} "
                        f"{master_weights!r}")
    if compute_dtype is None:
        compute_dtype = torch.float16 if adapter is not None else torch.float32
    if compute_dtype not in _PRECISIONS:
        raise ValueError(f"compute_dtype must be torch.float16, torch.bfloat16 or torch.float32, "
                         f"got {compute_dtype}")
    precision, compute_format = _PRECISIONS[compute_dtype]
    opts = {"sample_count_roles": "all"}  # activations too: first offenders name the module
    group = None  # the agreement's group: only with several ranks
    if process_group is not None:
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("process_group given but torch.distributed is not initialised")
        world = dist.get_world_size(process_group)
        opts.update({"rank": dist.get_rank(process_group), "world_size": world,
                     "data_parallel_size": world,
                     "policy_agreement": "per_step" if world > 1 else "single"})
        group = process_group if world > 1 else None
    opts.update(options or {})
    if recipe_targets is not None:
        opts["recipe_targets"] = recipe_targets
    settings = adapter.settings() if adapter is not None else None
    warnings_ = []
    if isinstance(scaler, _scaler._gradscaler_types()) and _disabled_by_torch(scaler):
        warnings_.append(
            "torch: the GradScaler is disabled (torch turns a CUDA GradScaler off where CUDA is "
            "not available): nothing is scaled and a step with Inf/NaN gradients is not "
            "skipped; ampscope.torch.LossScaler scales and skips on the CPU too")
    agent = Agent(run_id=run_id, server=server, options=opts,
                  trainer=f"torch {torch.__version__} (ampscope.torch)", precision=precision,
                  compute_format=compute_format, scaler_settings=settings)
    named = {}
    fp32_params = set()
    for module in model.modules():
        if isinstance(module, _FP32_MODULES):
            fp32_params.update(id(p) for p in module.parameters(recurse=False))
    for name, p in model.named_parameters():
        held = _capi.FORMAT_FP32 if (id(p) in fp32_params or compute_format ==
                                     _capi.FORMAT_FP32) else None
        named[id(p)] = (utf8(name), held)
    monitor = Monitor(model, optimizer, adapter, scheduler, agent, start_step=start_step,
                      master_weights=master_weights, named_params=named,
                      process_group=group, optimizer_steps=optimizer_steps,
                      warnings=warnings_, gemm_precision=gemm_precision)
    for text in warnings_:
        monitor._notice(text)
        _warnings.warn("ampscope: " + text, RuntimeWarning, stacklevel=2)
    try:
        monitor._install()
    except Exception:
        monitor.close(0)
        raise
    _live.add(monitor)
    return monitor


def _close_all():
    for m in list(_live):
        with contextlib.suppress(Exception):
            m.close()


import atexit  # noqa: E402  (registered once the module's names exist)

atexit.register(_close_all)
