#!/usr/bin/python3
"""ampscope.torch's loss scalers (python/ampscope/torch/_scaler.py).

  - LossScaler moves through the same scales as the built-in trainer's ScalerHandle, step for
    step and float for float (the trainer's side printed by scaler_trajectory, built next to
    this script): dynamic, hysteresis and static rules, bounds, long runs with growth, policy
    changes at given steps (their reasons too), Megatron-LM's defaults;
  - its state_dict resumes exactly;
  - scale/unscale_/step/update on a small CPU model with FP32 and BF16 gradients (and FP16,
    0-dim and sparse gradients by hand): exact unscaled values, skipped steps on Inf/NaN, the
    errors GradScaler raises;
  - the adapters: a LossScaler's, a disabled torch.cuda.amp.GradScaler's, and an enabled
    GradScaler's (a real one on CUDA; without CUDA, torch.cuda.amp.GradScaler's own Python code
    on CPU tensors with its two CUDA-only kernels replaced by transcriptions of PyTorch's CUDA
    code, since torch 1.13 has no CPU GradScaler); hooks, changes, bounds, and hooks that raise.
The CUDA parts are skipped with a message on a machine without a GPU.

Run by ctest (tests/python/CMakeLists.txt) with PYTHONPATH=python/, AMPSCOPE_AGENT_LIBRARY and
AMPSCOPE_TEST_TOOLS set.
"""

import copy
import json
import math
import os
import pickle
import random
import subprocess
import threading
import unittest
import warnings
from unittest import mock

import torch

from ampscope import _capi
from ampscope.torch import _scaler
from ampscope.torch._scaler import F32_MAX, LossScaler, adapt_scaler

TOOL = os.path.join(os.environ.get("AMPSCOPE_TEST_TOOLS", ""), "scaler_trajectory")
CUDA = torch.cuda.is_available()
NO_CUDA = "no CUDA device on this machine: the CUDA part is not run"


def f32(x):
    return _scaler._f32(x)


def trainer_trajectory(spec):
    """The built-in trainer's ScalerHandle over spec (scaler_trajectory)."""
    if not os.path.exists(TOOL):
        raise AssertionError(f"{TOOL} is missing: build the scaler_trajectory target")
    proc = subprocess.run([TOOL], input=json.dumps(spec), capture_output=True, text=True,
                          check=False, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"scaler_trajectory failed ({proc.returncode}): "
                             f"{proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout)


def rule_args(spec):
    return dict(init_scale=spec["init_scale"], growth_factor=spec["growth_factor"],
                backoff_factor=spec["backoff_factor"], growth_interval=spec["growth_interval"],
                kind=spec["kind"], hysteresis=spec["hysteresis"],
                min_scale=spec["min_scale"], max_scale=spec["max_scale"])


def spec_of(kind, found_inf, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
            growth_interval=2000, hysteresis=2, min_scale=0.0, max_scale=F32_MAX, changes=()):
    return dict(kind=kind, init_scale=init_scale, growth_factor=growth_factor,
                backoff_factor=backoff_factor, growth_interval=growth_interval,
                hysteresis=hysteresis, min_scale=min_scale, max_scale=max_scale,
                found_inf=found_inf,
                changes=[{"step": s, "fields": f} for s, f in changes])


def random_found(n, p, seed):
    rng = random.Random(seed)
    return "".join("1" if rng.random() < p else "0" for _ in range(n))


def drive(scaler, found_inf, changes=(), apply_change=None, device="cpu", start=0,
          hysteresis=True):
    """Runs `scaler` (LossScaler or GradScaler) over found_inf through its public API, one
    parameter whose gradient is the scale itself (so the scale used is read from what scale()
    multiplied by); returns the trajectory and the changes' reasons as scaler_trajectory
    prints them."""
    apply_change = apply_change or getattr(scaler, "apply_change", None)
    by_step = {}
    for step, fields in changes:
        by_step.setdefault(step, []).append(fields)
    p = torch.nn.Parameter(torch.ones(1, device=device))
    opt = torch.optim.SGD([p], lr=0.0)
    steps, reasons = [], []
    for i, bad in enumerate(found_inf, start):
        for fields in by_step.get(i, ()):
            reasons.append({"step": i, "reason": apply_change(fields) or ""})
        opt.zero_grad(set_to_none=True)
        scaler.scale(p.sum()).sum().backward()
        used = p.grad.item()
        if bad == "1":
            p.grad.fill_(math.nan if i % 2 else math.inf)
        scaler.step(opt)
        scaler.update()
        row = {"scale": used, "scale_after": scaler.get_scale(),
               "growth_tracker": scaler._get_growth_tracker()}
        if hysteresis:
            row["hysteresis_tracker"] = scaler.state_dict()["hysteresis_tracker"]
        steps.append(row)
    return {"steps": steps, "changes": reasons}


class TrajectoryCase(unittest.TestCase):
    def assertSameTrajectory(self, got, want):
        self.assertEqual(len(got["steps"]), len(want["steps"]))
        for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
            if g != w:
                self.fail(f"step {i}: {g} != trainer's {w}")
        self.assertEqual(got["changes"], want["changes"])

    def compare(self, spec, changes=()):
        """LossScaler vs the trainer on spec; returns the trajectory."""
        spec = dict(spec, changes=[{"step": s, "fields": f} for s, f in changes])
        want = trainer_trajectory(spec)
        got = drive(LossScaler(**rule_args(spec)), spec["found_inf"], changes)
        self.assertSameTrajectory(got, want)
        return want["steps"]


class LossScalerTrajectoryTest(TrajectoryCase):
    """LossScaler == the built-in trainer's scaler, exactly, on every step."""

    def test_dynamic(self):
        steps = self.compare(spec_of("dynamic", random_found(400, 0.15, 1), growth_interval=3))
        afters = [s["scale_after"] for s in steps]
        self.assertLess(min(afters), 2.0 ** 16)
        self.assertGreater(max(afters), 2.0 ** 16)

    def test_dynamic_bounds(self):
        found = "1" * 12 + "0" * 40 + random_found(200, 0.3, 2)
        steps = self.compare(spec_of("dynamic", found, init_scale=2.0 ** 12, growth_interval=2,
                                     min_scale=2.0 ** 8, max_scale=2.0 ** 14))
        afters = [s["scale_after"] for s in steps]
        self.assertEqual(min(afters), 2.0 ** 8)   # backoffs stopped at the floor
        self.assertEqual(max(afters), 2.0 ** 14)  # growth stopped at the ceiling

    def test_dynamic_bound_not_a_power_of_two(self):
        # Growth that would pass max_scale is not taken (the scale stays below the ceiling).
        steps = self.compare(spec_of("dynamic", "0" * 20 + "1" * 5, init_scale=3.0,
                                     growth_interval=1, min_scale=1.0, max_scale=100.0))
        self.assertEqual(max(s["scale_after"] for s in steps), 96.0)
        self.assertEqual(steps[-1]["scale_after"], 3.0)

    def test_odd_factors_round_in_fp64_then_fp32(self):
        self.compare(spec_of("dynamic", random_found(300, 0.3, 3), init_scale=0.1,
                             growth_factor=1.7, backoff_factor=0.37, growth_interval=1))

    def test_dynamic_growth_to_fp32_overflow_is_not_taken(self):
        steps = self.compare(spec_of("dynamic", "0" * 8, init_scale=2.0 ** 120,
                                     growth_factor=16.0, growth_interval=1))
        self.assertEqual(steps[-1]["scale_after"], 2.0 ** 124)

    def test_hysteresis(self):
        found = random_found(500, 0.2, 4) + "1111" + "0" * 30
        steps = self.compare(spec_of("hysteresis", found, init_scale=2.0 ** 32,
                                     growth_interval=4, hysteresis=3, min_scale=1.0,
                                     max_scale=2.0 ** 40))
        trackers = {s["hysteresis_tracker"] for s in steps}
        self.assertTrue({0, 1, 2, 3} <= trackers, trackers)

    def test_hysteresis_floor_and_ceiling(self):
        found = "1" * 30 + "0" * 40
        steps = self.compare(spec_of("hysteresis", found, init_scale=8.0, growth_interval=1,
                                     hysteresis=2, min_scale=1.0, max_scale=2.0 ** 20))
        afters = [s["scale_after"] for s in steps]
        self.assertEqual(min(afters), 1.0)
        self.assertEqual(afters[-1], 2.0 ** 20)  # clamped to max_scale

    def test_hysteresis_growth_past_fp32_is_max_scale(self):
        steps = self.compare(spec_of("hysteresis", "0" * 4, init_scale=2.0 ** 126,
                                     growth_interval=1, min_scale=1.0))
        self.assertEqual(steps[-1]["scale_after"], F32_MAX)

    def test_static(self):
        steps = self.compare(spec_of("static", random_found(100, 0.3, 5), init_scale=1000.0))
        self.assertEqual({s["scale_after"] for s in steps}, {1000.0})

    def test_long_runs_with_growth(self):
        found = ["0"] * 10000
        found[2500] = found[7000] = "1"
        steps = self.compare(spec_of("dynamic", "".join(found)))
        self.assertEqual(steps[1999]["scale_after"], 2.0 ** 17)
        self.assertEqual(steps[2500]["scale_after"], 2.0 ** 16)
        self.assertEqual(steps[6500]["scale_after"], 2.0 ** 18)
        self.assertEqual(steps[-1]["scale_after"], 2.0 ** 18)
        found = ["0"] * 6000
        found[1500] = found[1501] = found[3200] = "1"
        steps = self.compare(spec_of("hysteresis", "".join(found), init_scale=2.0 ** 32,
                                     growth_interval=1000, min_scale=1.0))
        self.assertEqual(steps[999]["scale_after"], 2.0 ** 33)
        self.assertEqual(steps[1501]["scale_after"], 2.0 ** 32)  # the second overflow
        self.assertEqual(steps[3200]["hysteresis_tracker"], 1)
        self.assertEqual(steps[-1]["scale_after"], 2.0 ** 35)

    def test_megatron_defaults_are_the_trainers(self):
        found = random_found(3000, 0.001, 6)
        spec = {"kind": "hysteresis", "found_inf": found}
        want = trainer_trajectory(spec)
        scaler = LossScaler.megatron()
        self.assertEqual((scaler.kind, scaler.get_scale(), scaler.get_growth_factor(),
                          scaler.get_backoff_factor(), scaler.get_growth_interval(),
                          scaler.get_hysteresis(), scaler.get_min_scale(),
                          scaler.get_max_scale()),
                         ("hysteresis", 2.0 ** 32, 2.0, 0.5, 1000, 2, 1.0, F32_MAX))
        self.assertSameTrajectory(drive(scaler, found), want)
        over = LossScaler.megatron(growth_interval=10, min_scale=4.0)
        self.assertEqual((over.get_growth_interval(), over.get_min_scale(), over.kind),
                         (10, 4.0, "hysteresis"))

    def test_changes_at_steps_dynamic(self):
        changes = [
            (0, {"growth_interval": 4}),
            (10, {"scale": 2.0 ** 20}),
            (20, {"growth_interval": 5}),
            (30, {"backoff_factor": 1.5}),                       # refused
            (40, {"min_scale": 2.0 ** 10, "max_scale": 2.0 ** 22}),
            (50, {"max_scale": 1.0}),                            # refused: scale above it
            (60, {"growth_factor": 4.0, "backoff_factor": 0.25}),
            (70, {"scale": 2.0 ** 30}),                          # refused: above max_scale
            (80, {"hysteresis": 5}),
            (90, {"scale": 3000.5, "growth_interval": 2}),
            (90, {"growth_factor": 1.0}),                        # refused
        ]
        steps = self.compare(spec_of("dynamic", random_found(150, 0.2, 7)), changes)
        self.assertEqual(steps[10]["scale"], 2.0 ** 20)
        self.assertEqual(steps[90]["scale"], 3000.5)

    def test_changes_at_steps_hysteresis(self):
        changes = [
            (5, {"hysteresis": 1}),
            (25, {"hysteresis": 4}),
            (40, {"scale": 3.0}),
            (60, {"growth_interval": 0}),                        # refused
            (61, {"min_scale": 8.0}),                            # refused if the scale is below
            (70, {"min_scale": 0.5, "scale": 0.75}),
        ]
        self.compare(spec_of("hysteresis", random_found(120, 0.3, 8), init_scale=2.0 ** 10,
                             growth_interval=3, min_scale=1.0), changes)

    def test_changes_static(self):
        changes = [(3, {"scale": 77.0}), (6, {"backoff_factor": 0.0}), (9, {"min_scale": 100.0})]
        steps = self.compare(spec_of("static", "0101010101010", init_scale=8.0), changes)
        self.assertEqual(steps[-1]["scale_after"], 77.0)


class StateDictTest(TrajectoryCase):
    def resume(self, spec, cut):
        """The trainer's whole run == a LossScaler's first `cut` steps, then a fresh LossScaler
        loaded from its state_dict (through JSON) for the rest; returns the state_dict."""
        want = trainer_trajectory(spec)
        first = LossScaler(**rule_args(spec))
        head = drive(first, spec["found_inf"][:cut])
        sd = json.loads(json.dumps(first.state_dict()))
        resumed = LossScaler()  # different kind and settings until loaded
        resumed.load_state_dict(sd)
        self.assertEqual(resumed.state_dict(), first.state_dict())
        tail = drive(resumed, spec["found_inf"][cut:], start=cut)
        also = drive(first, spec["found_inf"][cut:], start=cut)
        self.assertEqual(tail, also)
        self.assertSameTrajectory({"steps": head["steps"] + tail["steps"], "changes": []}, want)
        return sd

    def test_hysteresis_resumes_mid_window(self):
        found = "0000000" + "1" + "000000" + "1" * 3 + random_found(200, 0.2, 9)
        spec = spec_of("hysteresis", found, init_scale=2.0 ** 20, growth_interval=10,
                       hysteresis=3, min_scale=2.0, max_scale=2.0 ** 30)
        sd = self.resume(spec, 14)
        # Cut where both trackers are mid-way, so that both are really carried over.
        self.assertEqual(sd["hysteresis_tracker"], 2)
        self.assertEqual(sd["_growth_tracker"], 6)
        self.assertEqual((sd["kind"], sd["hysteresis"], sd["min_scale"], sd["max_scale"]),
                         ("hysteresis", 3, 2.0, 2.0 ** 30))

    def test_dynamic_resumes_mid_interval(self):
        spec = spec_of("dynamic", "0" * 50 + random_found(300, 0.05, 10), init_scale=3.0,
                       growth_factor=1.5, backoff_factor=0.6, growth_interval=7)
        sd = self.resume(spec, 40)
        self.assertEqual(sd["_growth_tracker"], 40 % 7)
        self.assertEqual(set(sd), {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                   "_growth_tracker", "kind", "hysteresis",
                                   "hysteresis_tracker", "min_scale", "max_scale"})

    def test_pickle_and_gradscaler_state_dict(self):
        a = LossScaler(init_scale=96.0, growth_interval=3, kind="hysteresis", min_scale=1.0)
        drive(a, "0010")
        b = pickle.loads(pickle.dumps(a))
        self.assertEqual(b.state_dict(), a.state_dict())
        self.assertEqual(drive(b, "0110100"), drive(a, "0110100"))
        # A GradScaler's five keys: the rest keeps this scaler's values.
        c = LossScaler(kind="hysteresis", hysteresis=4, min_scale=2.0)
        c.load_state_dict({"scale": 1024.0, "growth_factor": 3.0, "backoff_factor": 0.25,
                           "growth_interval": 9, "_growth_tracker": 5})
        sd = c.state_dict()
        self.assertEqual((sd["scale"], sd["growth_factor"], sd["backoff_factor"],
                          sd["growth_interval"], sd["_growth_tracker"], sd["kind"],
                          sd["hysteresis"], sd["hysteresis_tracker"], sd["min_scale"]),
                         (1024.0, 3.0, 0.25, 9, 5, "hysteresis", 4, 4, 2.0))
        with self.assertRaisesRegex(ValueError, "growth_factor must be finite and > 1"):
            c.load_state_dict(dict(sd, growth_factor=1.0))
        self.assertEqual(c.state_dict(), sd)
        with self.assertRaisesRegex(RuntimeError, "state dict is empty"):
            c.load_state_dict({})


def grads_of(optimizer):
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


def small_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).to(dtype)


class RealModelTest(unittest.TestCase):
    def run_model(self, dtype):
        model = small_model(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = LossScaler(init_scale=3000.0, growth_interval=2)  # 1/3000 is not exact
        x = torch.randn(5, 8).to(dtype)

        def backward():
            opt.zero_grad(set_to_none=True)
            loss = model(x).float().pow(2).mean()
            scaled = scaler.scale(loss)
            self.assertEqual(scaled.dtype, torch.float32)
            scaled.backward()

        # A clean step with an explicit unscale_: exact unscaled values, the step taken.
        backward()
        scaled = [g.clone() for g in grads_of(opt)]
        self.assertTrue(all(g.dtype == dtype for g in scaled))
        scaler.unscale_(opt)
        inv = f32(1.0 / 3000.0)
        for got, s in zip(grads_of(opt), scaled):
            self.assertTrue(torch.equal(got, (s.float() * inv).to(dtype)))
        with self.assertRaisesRegex(RuntimeError, "unscale_\\(\\) has already been called"):
            scaler.unscale_(opt)
        before = [p.detach().clone() for p in model.parameters()]
        self.assertIsNone(scaler.step(opt))  # SGD.step returns None
        self.assertFalse(scaler.last_step_skipped)
        self.assertFalse(all(torch.equal(a, p) for a, p in zip(before, model.parameters())))
        with self.assertRaisesRegex(RuntimeError, "step\\(\\) has already been called"):
            scaler.step(opt)
        with self.assertRaisesRegex(RuntimeError, "unscale_\\(\\) is being called after step"):
            scaler.unscale_(opt)
        scaler.update()
        self.assertFalse(scaler.found_inf())
        self.assertEqual(scaler.get_scale(), 3000.0)

        # Inf, then NaN, in one gradient (step() unscales): skipped, parameters untouched,
        # the scale backed off.
        for bad, scale_after in ((math.inf, 1500.0), (math.nan, 750.0)):
            backward()
            grads_of(opt)[1].view(-1)[3] = bad
            before = [p.detach().clone() for p in model.parameters()]
            self.assertIsNone(scaler.step(opt))
            self.assertTrue(scaler.last_step_skipped)
            for a, p in zip(before, model.parameters()):
                self.assertTrue(torch.equal(a, p))
            scaler.update()
            self.assertTrue(scaler.found_inf())
            self.assertEqual(scaler.get_scale(), scale_after)

        # A clean step through step() alone: unscaled by 1/750 exactly, then stepped.
        backward()
        scaled = [g.clone() for g in grads_of(opt)]
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        inv = f32(1.0 / 750.0)
        for got, s in zip(grads_of(opt), scaled):
            self.assertTrue(torch.equal(got, (s.float() * inv).to(dtype)))
        for a, p in zip(before, model.parameters()):
            self.assertFalse(torch.equal(p.detach(), a))
        scaler.update()
        self.assertFalse(scaler.found_inf())

    def test_fp32_model(self):
        self.run_model(torch.float32)

    def test_bf16_model(self):
        self.run_model(torch.bfloat16)

    def test_fp16_zero_dim_and_sparse_gradients(self):
        scaler = LossScaler(init_scale=768.0)
        inv = f32(1.0 / 768.0)
        half = torch.nn.Parameter(torch.zeros(6, dtype=torch.float16))
        half.grad = torch.tensor([1.0, -700.0, 65504.0, 3e-3, 0.0, 12345.0], dtype=torch.float16)
        scalar = torch.nn.Parameter(torch.tensor(2.0))
        scalar.grad = torch.tensor(1000.0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = torch.optim.SGD([half, scalar, emb.weight], lr=1.0)
        scaler.scale(emb(torch.tensor([1, 4, 4, 7])).sum()).backward()
        self.assertTrue(emb.weight.grad.is_sparse)
        expect_half = (half.grad.float() * inv).half()
        expect_sparse = emb.weight.grad._values().clone() * inv
        scaler.unscale_(opt)
        self.assertTrue(torch.equal(half.grad, expect_half))
        self.assertEqual(scalar.grad.shape, torch.Size([]))
        self.assertEqual(scalar.grad.item(), f32(1000.0 * inv))
        self.assertTrue(torch.equal(emb.weight.grad._values(), expect_sparse))
        self.assertTrue(torch.equal(emb.weight.grad._values(),
                                    torch.full_like(expect_sparse, 1.0)))
        scaler.step(opt)
        self.assertFalse(scaler.last_step_skipped)
        scaler.update()
        # FP16 overflow seen in the scaled values.
        half.grad = torch.tensor([1.0, math.inf, 0, 0, 0, 0], dtype=torch.float16)
        scalar.grad = None
        emb.weight.grad = None
        before = half.detach().clone()
        scaler.step(opt)
        self.assertTrue(scaler.last_step_skipped)
        self.assertTrue(torch.equal(half.detach(), before))
        scaler.update()
        self.assertEqual(scaler.get_scale(), 384.0)

    def test_two_optimizers_found_inf_is_their_or(self):
        a = torch.nn.Parameter(torch.ones(3))
        b = torch.nn.Parameter(torch.ones(3))
        oa, ob = torch.optim.SGD([a], lr=0.5), torch.optim.SGD([b], lr=0.5)
        scaler = LossScaler(init_scale=16.0)
        scaler.scale(a.sum() + b.sum()).backward()
        a.grad[0] = math.inf  # in the first optimizer stepped: the last one's is clean
        scaler.step(oa)
        self.assertTrue(scaler.last_step_skipped)
        scaler.step(ob)
        self.assertFalse(scaler.last_step_skipped)
        self.assertTrue(torch.equal(a.detach(), torch.ones(3)))
        self.assertTrue(torch.equal(b.detach(), torch.full((3,), 0.5)))
        scaler.update()
        self.assertTrue(scaler.found_inf())
        self.assertEqual(scaler.get_scale(), 8.0)

    def test_scale_outputs_like_gradscaler(self):
        scaler = LossScaler(init_scale=4.0)
        loss = torch.tensor(1.5, dtype=torch.bfloat16)
        out = scaler.scale(loss)
        self.assertEqual((out.shape, out.dtype, out.item()), (torch.Size([1]), torch.float32, 6.0))
        nested = scaler.scale([torch.ones(2), (torch.ones(1), [torch.full((1,), 2.0)])])
        self.assertIsInstance(nested, list)
        self.assertIsInstance(nested[1], tuple)
        self.assertEqual(nested[0].tolist(), [4.0, 4.0])
        self.assertEqual(nested[1][1][0].tolist(), [8.0])
        lazy = scaler.scale(t for t in [torch.ones(1)])
        self.assertEqual([t.item() for t in lazy], [4.0])
        with self.assertRaisesRegex(ValueError, "outputs must be a Tensor"):
            scaler.scale([1.0])
        # A tensor handed out stays as it was when the scale changes.
        kept = scaler._scale_on(torch.device("cpu"))
        scaler.apply_change({"scale": 2.0})
        self.assertEqual(scaler.scale(torch.ones(1)).item(), 2.0)
        self.assertEqual(kept.item(), 4.0)

    def test_update_errors_and_new_scale(self):
        scaler = LossScaler(init_scale=64.0, growth_interval=3)
        with self.assertRaisesRegex(AssertionError, "No inf checks were recorded"):
            scaler.update()
        p = torch.nn.Parameter(torch.ones(1))
        opt = torch.optim.SGD([p], lr=0.0)
        with self.assertRaisesRegex(AssertionError, "No inf checks were recorded for this"):
            scaler.step(opt)  # no gradient at all
        drive(scaler, "00")
        self.assertEqual(scaler._get_growth_tracker(), 2)
        scaler.scale(p.sum()).backward()
        scaler.step(opt)
        scaler.update(new_scale=100.0)
        self.assertEqual((scaler.get_scale(), scaler._get_growth_tracker()), (100.0, 2))
        opt.zero_grad()
        scaler.scale(p.sum()).backward()
        scaler.step(opt)
        scaler.update(torch.tensor([0.1]))
        self.assertEqual(scaler.get_scale(), f32(0.1))

    def test_disabled_is_a_pass_through(self):
        scaler = LossScaler(enabled=False)
        loss = torch.tensor(3.0)
        self.assertIs(scaler.scale(loss), loss)

        class Opt:
            param_groups = []
            calls = 0

            def step(self, *args, **kwargs):
                Opt.calls += 1
                return ("stepped", args, kwargs)

        opt = Opt()
        scaler.unscale_(opt)
        scaler.unscale_(opt)  # no error when disabled, as GradScaler
        self.assertEqual(scaler.step(opt, 1, lr=2), ("stepped", (1,), {"lr": 2}))
        scaler.update()
        self.assertEqual((scaler.get_scale(), scaler.state_dict(), scaler.is_enabled()),
                         (1.0, {}, False))
        scaler.load_state_dict({})
        self.assertEqual(scaler.apply_change({"scale": 2.0}), "the LossScaler is disabled")
        self.assertEqual(Opt.calls, 1)


class ValidationTest(unittest.TestCase):
    def test_constructor(self):
        for kw, reason in (
                (dict(growth_factor=1.0), "growth_factor must be finite and > 1, got 1"),
                (dict(backoff_factor=0.0), "backoff_factor must be in (0, 1), got 0"),
                (dict(growth_interval=0), "growth_interval must be >= 1, got 0"),
                (dict(hysteresis=0), "hysteresis must be >= 1, got 0"),
                (dict(init_scale=0.0), "scale must be finite and > 0"),
                (dict(init_scale=10.0, min_scale=16.0), "scale 10 outside [min_scale 16"),
                (dict(kind="exotic"), "kind must be one of static, dynamic, hysteresis")):
            with self.subTest(kw=kw):
                with self.assertRaises(ValueError) as cm:
                    LossScaler(**kw)
                self.assertIn(reason, str(cm.exception))

    def test_apply_change_refusals_change_nothing(self):
        scaler = LossScaler(init_scale=512.0, growth_interval=4, kind="hysteresis",
                            hysteresis=3, min_scale=1.0)
        drive(scaler, "00111")
        sd = scaler.state_dict()
        self.assertEqual((sd["scale"], sd["hysteresis_tracker"]), (256.0, 0))
        for fields, reason in (
                ({"backoff_factor": 1.5}, "backoff_factor must be in (0, 1), got 1.5"),
                ({"growth_factor": 0.5, "scale": 4.0},
                 "growth_factor must be finite and > 1, got 0.5"),
                ({"scale": math.nan}, "scale must be finite and > 0"),
                ({"scale": 1e39}, "scale must be finite and > 0"),  # beyond FP32
                ({"scale": 10 ** 400}, "scale must be finite and > 0"),  # beyond FP64
                ({"max_scale": 100.0}, "scale 256 outside [min_scale 1, max_scale 100]"),
                ({"growth_interval": 2.5}, "growth_interval must be an integer, got 2.5"),
                ({"hysteresis": 2 ** 40}, "hysteresis must fit in 32 bits"),
                ({"growth_factor": "2"}, "growth_factor must be a number"),
                ({"loss_scale": 2.0}, "unknown scaler field 'loss_scale'")):
            with self.subTest(fields=fields):
                got = scaler.apply_change(fields)
                self.assertIsNotNone(got)
                self.assertTrue(got.startswith(reason), got)
                self.assertEqual(scaler.state_dict(), sd)
        with self.assertRaisesRegex(ValueError, "growth_factor must be finite and > 1"):
            scaler.set_growth_factor(1.0)
        self.assertEqual(scaler.state_dict(), sd)
        # Accepted: applied, the trackers restarted as the rule says.
        self.assertIsNone(scaler.apply_change({"scale": 100.0}))
        self.assertEqual((scaler.get_scale(), scaler._get_growth_tracker(),
                          scaler.state_dict()["hysteresis_tracker"]), (100.0, 0, 3))
        drive(scaler, "00")
        scaler.set_growth_interval(9)
        self.assertEqual((scaler.get_growth_interval(), scaler._get_growth_tracker()), (9, 0))
        scaler.set_backoff_factor(0.125)
        self.assertEqual(scaler.get_backoff_factor(), 0.125)


class Recorder:
    """Hooks that record what they are called with (gradients copied as they are then)."""

    def __init__(self):
        self.events = []
        self.errors = []

    def names(self):
        return [e[0] for e in self.events]

    def on_scale(self, loss, scale):
        self.events.append(("on_scale", loss.detach().float().reshape(-1)[0].item(), scale))

    def before_unscale(self, optimizer, scale):
        self.events.append(("before_unscale", optimizer, scale,
                            [g.clone() for g in grads_of(optimizer)]))

    def after_unscale(self, optimizer):
        self.events.append(("after_unscale", optimizer, [g.clone() for g in grads_of(optimizer)]))

    def after_step(self, optimizer, skipped):
        self.events.append(("after_step", optimizer, skipped))

    def on_update(self, found_inf, scale_before, scale_after):
        self.events.append(("on_update", found_inf, scale_before, scale_after))

    def on_error(self, where, exc):
        self.errors.append((where, exc))


class Raising:
    """Hooks that all raise."""

    def __init__(self):
        self.errors = []

    def _raise(self, *args):
        raise RuntimeError("hook failed")

    on_scale = before_unscale = after_unscale = after_step = on_update = _raise

    def on_error(self, where, exc):
        self.errors.append((where, str(exc)))


class Partial:
    """Hooks with one method only, and no on_error."""

    def __init__(self):
        self.updates = 0

    def on_update(self, *args):
        self.updates += 1
        raise ValueError("and nobody to tell")


HOOK_NAMES = ["on_scale", "before_unscale", "after_unscale", "after_step", "on_update"]


def train(scaler, steps, device="cpu", explicit_unscale=(), bad=(), seed=0):
    """A few steps of a small FP32 model through `scaler`; returns the parameters and the scale
    after each step."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(6, 4, device=device)
    scales = []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        scaler.scale(model(x).pow(2).mean()).backward()
        if i in bad:
            model.weight.grad[0, 0] = math.inf
        if i in explicit_unscale:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().cpu().clone() for p in model.parameters()], scales, opt


class AdapterCommon:
    """Adapter tests run for each kind of enabled scaler (subclasses say how to make one)."""

    device = "cpu"

    def make(self, **kw):
        raise NotImplementedError

    def test_settings_and_current_scale(self):
        scaler = self.make(init_scale=1024.0, growth_interval=2)
        adapter = adapt_scaler(scaler)
        self.assertTrue(adapter.enabled)
        s = adapter.settings()
        self.assertEqual(s["kind"], _capi.SCALER_DYNAMIC)
        self.assertEqual((s["scale"], s["growth_factor"], s["backoff_factor"],
                          s["growth_interval"], s["hysteresis"], s["min_scale"],
                          s["max_scale"]), (1024.0, 2.0, 0.5, 2, 0, 0.0, 0.0))
        adapter.install(Recorder())
        try:
            _, scales, _ = train(scaler, 4, device=self.device, bad=(3,))
            self.assertEqual(scales, [1024.0, 2048.0, 2048.0, 1024.0])
            seen = []
            t = threading.Thread(target=lambda: seen.append(adapter.current_scale()))
            t.start()
            t.join()
            self.assertEqual(seen, [1024.0])
            self.assertIsNone(adapter.apply_change({"scale": 5.0}))
            self.assertEqual((adapter.current_scale(), adapter.settings()["scale"]), (5.0, 5.0))
        finally:
            adapter.uninstall()

    def test_hooks_see_scaled_then_unscaled_gradients(self):
        scaler = self.make(init_scale=4096.0, growth_interval=100)
        rec = Recorder()
        adapter = adapt_scaler(scaler)
        adapter.install(rec)
        try:
            _, scales, opt = train(scaler, 3, device=self.device, explicit_unscale=(1,),
                                   bad=(2,))
        finally:
            adapter.uninstall()
        self.assertEqual(rec.names(), HOOK_NAMES * 3)
        self.assertEqual(rec.errors, [])
        inv = f32(1.0 / 4096.0)
        for i in range(3):
            on_scale, before, after, stepped, updated = rec.events[5 * i:5 * i + 5]
            self.assertEqual(on_scale[2], 4096.0)
            self.assertIs(before[1], opt)
            self.assertEqual(before[2], 4096.0)
            for s, u in zip(before[3], after[2]):
                if i == 2 and not torch.isfinite(s).all():
                    continue
                self.assertTrue(torch.equal(u, s * inv))
            self.assertEqual(stepped[1:], (opt, i == 2))
            self.assertEqual(updated[1:], (i == 2, 4096.0, 2048.0 if i == 2 else 4096.0))
        self.assertEqual(scales, [4096.0, 4096.0, 2048.0])
        # Uninstalled: no more calls.
        train(scaler, 1, device=self.device)
        self.assertEqual(len(rec.events), 15)

    def test_refused_calls_call_no_hooks(self):
        scaler = self.make(init_scale=8.0)
        rec = Recorder()
        adapter = adapt_scaler(scaler)
        adapter.install(rec)
        try:
            p = torch.nn.Parameter(torch.ones(2, device=self.device))
            opt = torch.optim.SGD([p], lr=1.0)
            scaler.scale(p.sum()).backward()
            scaler.unscale_(opt)
            with self.assertRaisesRegex(RuntimeError, "unscale_\\(\\) has already been called"):
                scaler.unscale_(opt)
            scaler.step(opt)
            with self.assertRaisesRegex(RuntimeError, "step\\(\\) has already been called"):
                scaler.step(opt)
            scaler.update()
        finally:
            adapter.uninstall()
        self.assertEqual(rec.names(), HOOK_NAMES)

    def test_hook_exceptions_never_reach_the_loop(self):
        plain = self.make(init_scale=256.0, growth_interval=2)
        want = train(plain, 5, device=self.device, explicit_unscale=(1,), bad=(2,))
        for hooks in (Raising(), Partial()):
            scaler = self.make(init_scale=256.0, growth_interval=2)
            adapter = adapt_scaler(scaler)
            adapter.install(hooks)
            try:
                got = train(scaler, 5, device=self.device, explicit_unscale=(1,), bad=(2,))
            finally:
                adapter.uninstall()
            self.assertEqual(got[1], want[1])
            for a, b in zip(got[0], want[0]):
                self.assertTrue(torch.equal(a, b))
            if isinstance(hooks, Raising):
                self.assertEqual([w for w, _ in hooks.errors], HOOK_NAMES * 5)
                self.assertEqual({m for _, m in hooks.errors}, {"hook failed"})
            else:
                self.assertEqual(hooks.updates, 5)

    def test_apply_change(self):
        scaler = self.make(init_scale=1024.0, growth_interval=3)
        adapter = adapt_scaler(scaler)
        adapter.install(Recorder())
        try:
            train(scaler, 2, device=self.device)
            self.assertEqual(scaler._get_growth_tracker(), 2)
            before = adapter.settings()
            self.assertEqual(adapter.apply_change({"backoff_factor": 1.5}),
                             "backoff_factor must be in (0, 1), got 1.5")
            self.assertEqual(adapter.apply_change({"growth_factor": 1.0, "scale": 8.0}),
                             "growth_factor must be finite and > 1, got 1")
            self.assertEqual(adapter.apply_change({"min_scale": 2048.0}),
                             "scale 1024 outside [min_scale 2048, max_scale 3.40282e+38]")
            self.assertEqual(adapter.settings(), before)
            self.assertEqual((scaler.get_scale(), scaler._get_growth_tracker()), (1024.0, 2))
            self.assertIsNone(adapter.apply_change({"scale": 300.0}))
            self.assertEqual((scaler.get_scale(), scaler._get_growth_tracker(),
                              adapter.current_scale()), (300.0, 0, 300.0))
            train(scaler, 1, device=self.device)
            self.assertEqual(scaler._get_growth_tracker(), 1)
            self.assertIsNone(adapter.apply_change({"growth_interval": 5, "growth_factor": 4.0,
                                                    "backoff_factor": 0.25}))
            self.assertEqual((scaler.get_growth_interval(), scaler.get_growth_factor(),
                              scaler.get_backoff_factor(), scaler._get_growth_tracker()),
                             (5, 4.0, 0.25, 0))
            self.assertIsNone(adapter.apply_change({"min_scale": 100.0, "max_scale": 1000.0}))
            s = adapter.settings()
            self.assertEqual((s["min_scale"], s["max_scale"]), (100.0, 1000.0))
        finally:
            adapter.uninstall()

    def gradscaler_trajectory_test(self, spec, changes):
        """The GradScaler through the adapter (bounds and changes applied by it) == the trainer's
        dynamic rule."""
        spec = dict(spec, changes=[{"step": s, "fields": f} for s, f in changes])
        want = trainer_trajectory(spec)
        for row in want["steps"]:
            del row["hysteresis_tracker"]
        scaler = self.make(init_scale=spec["init_scale"], growth_factor=spec["growth_factor"],
                           backoff_factor=spec["backoff_factor"],
                           growth_interval=spec["growth_interval"])
        adapter = adapt_scaler(scaler)
        rec = Recorder()
        adapter.install(rec)
        try:
            reason = adapter.apply_change({"min_scale": spec["min_scale"],
                                           "max_scale": spec["max_scale"]})
            self.assertIsNone(reason)
            got = drive(scaler, spec["found_inf"], changes, apply_change=adapter.apply_change,
                        device=self.device, hysteresis=False)
        finally:
            adapter.uninstall()
        for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
            self.assertEqual(g, w, f"step {i}")
        self.assertEqual(got["changes"], want["changes"])
        updates = [e for e in rec.events if e[0] == "on_update"]
        self.assertEqual([(u[1], u[2], u[3]) for u in updates],
                         [(f == "1", w["scale"], w["scale_after"])
                          for f, w in zip(spec["found_inf"], want["steps"])])
        return want["steps"]

    def test_bounds_and_changes_follow_the_c_rule(self):
        found = "1" * 12 + "0" * 40 + random_found(150, 0.3, 11)
        changes = [(60, {"scale": 2.0 ** 13}), (70, {"growth_interval": 3}),
                   (80, {"backoff_factor": 2.0}), (90, {"max_scale": 2.0 ** 13 + 1.0}),
                   (120, {"min_scale": 3.0, "growth_factor": 3.0})]
        steps = self.gradscaler_trajectory_test(
            spec_of("dynamic", found, init_scale=2.0 ** 12, growth_interval=2,
                    min_scale=2.0 ** 8, max_scale=3.0 * 2 ** 12), changes)
        afters = [s["scale_after"] for s in steps]
        self.assertEqual((min(afters[:60]), max(afters[:60])), (2.0 ** 8, 2.0 ** 13))

    def test_hysteresis_is_refused(self):
        adapter = adapt_scaler(self.make())
        self.assertEqual(adapter.apply_change({"hysteresis": 3, "scale": 2.0}),
                         "GradScaler has no hysteresis; use "
                         "ampscope.torch.LossScaler(kind='hysteresis')")


class LossScalerAdapterTest(AdapterCommon, unittest.TestCase):
    def make(self, **kw):
        return LossScaler(**kw)

    # A LossScaler takes hysteresis changes; its adapter is native.
    test_hysteresis_is_refused = None
    test_bounds_and_changes_follow_the_c_rule = None

    def test_native(self):
        scaler = LossScaler.megatron(growth_interval=3)
        adapter = adapt_scaler(scaler)
        s = adapter.settings()
        self.assertEqual((s["kind"], s["scale"], s["hysteresis"], s["min_scale"],
                          s["max_scale"]), (_capi.SCALER_HYSTERESIS, 2.0 ** 32, 2, 1.0, 0.0))
        self.assertIsNone(adapter.apply_change({"hysteresis": 4}))
        self.assertEqual(scaler.get_hysteresis(), 4)
        rec = Recorder()
        adapter.install(rec)
        with self.assertRaises(RuntimeError):
            adapt_scaler(scaler).install(Recorder())
        adapter.uninstall()
        disabled = adapt_scaler(LossScaler(enabled=False))
        self.assertFalse(disabled.enabled)
        self.assertEqual(disabled.settings()["kind"], _capi.SCALER_STATIC)
        self.assertEqual(disabled.current_scale(), 1.0)
        self.assertEqual(disabled.apply_change({"scale": 2.0}), "the LossScaler is disabled")


def quiet_gradscaler(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.cuda.amp.GradScaler(**kw)


class AdaptScalerTest(unittest.TestCase):
    def test_types(self):
        self.assertIsNone(adapt_scaler(None))
        with self.assertRaises(TypeError) as cm:
            adapt_scaler(object())
        self.assertEqual(str(cm.exception),
                         "scaler must be a torch.cuda.amp.GradScaler, torch.amp.GradScaler or "
                         "ampscope.torch.LossScaler, got builtins.object")
        self.assertIsInstance(adapt_scaler(quiet_gradscaler(enabled=False)),
                              _scaler._GradScalerAdapter)
        self.assertIsInstance(adapt_scaler(LossScaler()), _scaler._LossScalerAdapter)


class DisabledGradScalerTest(unittest.TestCase):
    """A GradScaler that is disabled: the one torch 1.13 gives on a machine without CUDA."""

    def make(self):
        # Without CUDA, torch.cuda.amp.GradScaler() disables itself; with it, ask.
        return quiet_gradscaler() if not CUDA else quiet_gradscaler(enabled=False)

    def test_disabled(self):
        scaler = self.make()
        self.assertFalse(scaler.is_enabled())
        adapter = adapt_scaler(scaler)
        self.assertFalse(adapter.enabled)
        self.assertEqual(adapter.settings(), dict(
            kind=_capi.SCALER_STATIC, scale=1.0, growth_factor=0.0, backoff_factor=0.0,
            growth_interval=0, hysteresis=0, min_scale=0.0, max_scale=0.0))
        self.assertEqual(adapter.current_scale(), 1.0)
        for fields in ({"scale": 2.0}, {"hysteresis": 2}, {"backoff_factor": 7.0}):
            self.assertEqual(adapter.apply_change(fields), "the GradScaler is disabled")

    def test_hooks_and_unchanged_behaviour(self):
        want = train(self.make(), 3, explicit_unscale=(1,))
        scaler = self.make()
        rec = Recorder()
        adapter = adapt_scaler(scaler)
        adapter.install(rec)
        for name in ("scale", "unscale_", "step", "update"):
            self.assertIn(name, scaler.__dict__)
        with self.assertRaises(RuntimeError):
            adapt_scaler(scaler).install(Recorder())
        got = train(scaler, 3, explicit_unscale=(1,))
        self.assertEqual(rec.names(), HOOK_NAMES * 3)
        for e in rec.events:
            if e[0] in ("on_scale", "before_unscale"):
                self.assertEqual(e[2], 1.0)
            if e[0] == "after_step":
                self.assertFalse(e[2])
            if e[0] == "on_update":
                self.assertEqual(e[1:], (False, 1.0, 1.0))
        for a, b in zip(got[0], want[0]):
            self.assertTrue(torch.equal(a, b))
        # Pickled and copied while installed: the copies have no wrappers.
        for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
            self.assertFalse({"scale", "unscale_", "step", "update"} & set(clone.__dict__))
        adapter.uninstall()
        self.assertFalse({"scale", "unscale_", "step", "update", "load_state_dict",
                          "__getstate__"} & set(scaler.__dict__))
        train(scaler, 1)
        self.assertEqual(len(rec.events), 15)

    def test_hook_exceptions(self):
        scaler = self.make()
        hooks = Raising()
        adapter = adapt_scaler(scaler)
        adapter.install(hooks)
        try:
            got = train(scaler, 2)
        finally:
            adapter.uninstall()
        want = train(self.make(), 2)
        for a, b in zip(got[0], want[0]):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual([w for w, _ in hooks.errors], HOOK_NAMES * 2)


# torch.cuda.amp.GradScaler's own code on CPU (torch 1.13 has no CPU GradScaler): its two
# CUDA-only kernels transcribed from PyTorch's aten/src/ATen/native/cuda/AmpKernels.cu, its
# device replicator without the CUDA assertion, and scale() without it.

def _reference_unscale(grads, found_inf, inv_scale):
    inv = inv_scale.item()
    for g in grads:
        if not torch.isfinite(g).all():
            found_inf.fill_(1.0)
        if inv != 1.0:
            g.copy_((g.float() * inv_scale.reshape(())).to(g.dtype))


def _reference_update(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                      growth_interval):
    if found_inf.item():
        scale.fill_(f32(scale.item() * backoff_factor))
        growth_tracker.fill_(0)
    else:
        successful = growth_tracker.item() + 1
        if successful == growth_interval:
            new_scale = f32(scale.item() * growth_factor)
            if math.isfinite(new_scale):
                scale.fill_(new_scale)
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


class _Replicator:
    def __init__(self, master):
        self.master = master
        self._per_device_tensors = {}

    def get(self, device):
        t = self._per_device_tensors.get(device)
        if t is None:
            t = self._per_device_tensors[device] = self.master.to(device=device, copy=True)
        return t


def _cpu_gradscaler_available():
    module = getattr(torch.cuda.amp, "grad_scaler", None)
    return (module is not None and hasattr(module, "amp_definitely_not_available")
            and hasattr(module, "_MultiDeviceReplicator"))


if _cpu_gradscaler_available():
    class CpuGradScaler(torch.cuda.amp.GradScaler):
        def __init__(self, **kw):
            with mock.patch.object(torch.cuda.amp.grad_scaler, "amp_definitely_not_available",
                                   lambda: False):
                super().__init__(**kw)

        def scale(self, outputs):
            if not self._enabled:
                return outputs
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale.to(device=outputs.device)


class CpuGradScalerAdapterTest(AdapterCommon, unittest.TestCase):
    """An enabled GradScaler on CPU: torch.amp.GradScaler("cpu") where torch has one, else
    torch.cuda.amp.GradScaler's Python code with the CUDA-only kernels transcribed."""

    def setUp(self):
        self._patches = []
        amp = getattr(torch, "amp", None)
        if amp is not None and isinstance(getattr(amp, "GradScaler", None), type):
            try:
                amp.GradScaler("cpu")
                self.factory = lambda **kw: amp.GradScaler("cpu", **kw)
                return
            except Exception:  # noqa: BLE001 - no CPU support in this torch
                pass
        if not _cpu_gradscaler_available():
            self.skipTest("this torch has neither a CPU GradScaler nor 1.13's module layout")
        for target, name, value in (
                (torch, "_amp_foreach_non_finite_check_and_unscale_", _reference_unscale),
                (torch, "_amp_update_scale_", _reference_update),
                (torch.cuda.amp.grad_scaler, "_MultiDeviceReplicator", _Replicator)):
            p = mock.patch.object(target, name, value)
            p.start()
            self._patches.append(p)
        self.factory = CpuGradScaler

    def tearDown(self):
        for p in self._patches:
            p.stop()

    def make(self, **kw):
        return self.factory(**kw)

    def test_found_inf_read_before_update_clears_it(self):
        scaler = self.make(init_scale=64.0)
        a = torch.nn.Parameter(torch.ones(2))
        b = torch.nn.Parameter(torch.ones(2))
        oa, ob = torch.optim.SGD([a], lr=1.0), torch.optim.SGD([b], lr=1.0)
        rec = Recorder()
        adapter = adapt_scaler(scaler)
        adapter.install(rec)
        try:
            scaler.scale(a.sum() + b.sum()).backward()
            a.grad[1] = math.nan  # in the first optimizer: the last one's is clean
            scaler.step(oa)
            scaler.step(ob)
            scaler.update()
        finally:
            adapter.uninstall()
        steps = [e for e in rec.events if e[0] == "after_step"]
        self.assertEqual([(e[1], e[2]) for e in steps], [(oa, True), (ob, False)])
        self.assertEqual(rec.events[-1], ("on_update", True, 64.0, 32.0))
        self.assertTrue(torch.equal(a.detach(), torch.ones(2)))
        self.assertTrue(torch.equal(b.detach(), torch.zeros(2)))

    def test_load_state_dict_refreshes_the_scale(self):
        scaler = self.make(init_scale=64.0)
        adapter = adapt_scaler(scaler)
        adapter.install(Recorder())
        try:
            train(scaler, 1)
            scaler.load_state_dict(dict(scaler.state_dict(), scale=12.0))
            self.assertEqual(adapter.current_scale(), 12.0)
            self.assertEqual(train(scaler, 1)[1], [12.0])
            self.assertEqual(pickle.loads(pickle.dumps(scaler)).get_scale(), 12.0)
        finally:
            adapter.uninstall()


@unittest.skipUnless(CUDA, NO_CUDA)
class CudaGradScalerAdapterTest(AdapterCommon, unittest.TestCase):
    """The real torch.cuda.amp.GradScaler on CUDA tensors."""

    device = "cuda"

    def make(self, **kw):
        return torch.cuda.amp.GradScaler(**kw)


@unittest.skipUnless(CUDA, NO_CUDA)
class CudaLossScalerTest(unittest.TestCase):
    def test_unscale_matches_gradscaler(self):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            torch.manual_seed(1)
            grads = torch.randn(1000, device="cuda").mul_(1e3).to(dtype)
            if dtype is torch.float16:
                grads[7] = math.inf
            ours = torch.nn.Parameter(torch.zeros(1000, device="cuda", dtype=dtype))
            ours.grad = grads.clone()
            scaler = LossScaler(init_scale=3000.0)
            scaler.scale(torch.ones((), device="cuda"))
            scaler.unscale_(torch.optim.SGD([ours], lr=1.0))
            inv = f32(1.0 / 3000.0)
            finite = torch.isfinite(grads)
            expect = (grads.float() * inv).to(dtype)
            self.assertTrue(torch.equal(ours.grad[finite], expect[finite]))
            if dtype is not torch.float16:  # GradScaler refuses FP16 gradients
                theirs = torch.nn.Parameter(torch.zeros(1000, device="cuda", dtype=dtype))
                theirs.grad = grads.clone()
                gs = torch.cuda.amp.GradScaler(init_scale=3000.0)
                gs.scale(torch.ones((), device="cuda"))
                gs.unscale_(torch.optim.SGD([theirs], lr=1.0))
                self.assertTrue(torch.equal(ours.grad, theirs.grad))

    def test_trajectory_matches_gradscaler(self):
        found = random_found(300, 0.2, 12)
        a = drive(LossScaler(init_scale=2.0 ** 10, growth_interval=3), found, device="cuda",
                  hysteresis=False)
        b = drive(torch.cuda.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=3), found,
                  device="cuda", hysteresis=False)
        self.assertEqual(a, b)


if __name__ == "__main__":
    unittest.main(verbosity=2)
