#!/usr/bin/python3
"""Fused statistics from Python: ampscope.scale_and_compute_stats (the unscale and its
statistics in one pass) against torch's unscale and ampscope.compute_stats, the sums against
math.fsum; ampscope.torch.LossScaler measuring CPU gradients in its unscale pass (the same
gradients and found_inf as without); and a monitored run whose stored reports equal, tensor for
tensor, those of the same run measured by the agent itself."""

import math
import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402
import ampscope  # noqa: E402
import ampscope._capi as capi  # noqa: E402
import ampscope.torch as amps  # noqa: E402
from ampscope.torch._scaler import adapt_scaler  # noqa: E402

FORMATS = {torch.float32: capi.FORMAT_FP32, torch.float16: capi.FORMAT_FP16,
           torch.bfloat16: capi.FORMAT_BF16}


def adversarial(dtype, n=5000, seed=0):
    """Values over many binades with zeros, NaN, Inf, the format's extremes and subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 10, (n,), generator=g).float())
    x[0], x[1], x[2], x[3] = 0.0, float("nan"), float("inf"), -float("inf")
    info = torch.finfo(dtype)
    x[4], x[5], x[6] = info.max, -info.max, info.tiny / 4
    return x.to(dtype)


class StatsTest(unittest.TestCase):
    def test_scale_and_compute_stats_is_the_unscale_and_its_statistics(self):
        for dtype, fmt in FORMATS.items():
            for inv in (1.0 / 1024.0, 1.0, 4.0):
                with self.subTest(dtype=dtype, inv=inv):
                    grad = adversarial(dtype)
                    want = grad.float().mul_(torch.tensor(inv, dtype=torch.float32)).to(dtype)
                    target = (capi.FORMAT_FP16, 10)
                    stats = ampscope.scale_and_compute_stats(grad.data_ptr(), grad.numel(), fmt,
                                                             inv, [target])
                    self.assertTrue(torch.equal(grad.view(torch.int16 if dtype != torch.float32
                                                          else torch.int32),
                                                want.view(torch.int16 if dtype != torch.float32
                                                          else torch.int32)))
                    ref = ampscope.compute_stats(grad.data_ptr(), grad.numel(), fmt, [target])
                    for field in ("numel", "zeros", "nan", "pos_inf", "neg_inf", "max_abs",
                                  "min_abs_nonzero", "sum"):
                        self.assertEqual(getattr(stats, field), getattr(ref, field), field)
                    self.assertEqual(stats.histogram(), ref.histogram())
                    self.assertEqual(stats.targets(), ref.targets())
                    self.assertEqual(stats.targets()[0][0], target)
                    finite = [v for v in grad.float().tolist() if math.isfinite(v)]
                    self.assertEqual(stats.sum, math.fsum(finite))  # exactly rounded

    def test_a_sum_that_cancels_is_exact(self):
        x = torch.tensor([3.4e38, 1.0, -3.4e38, 2.5, 193868.5], dtype=torch.float32)
        stats = ampscope.compute_stats(x.data_ptr(), x.numel(), capi.FORMAT_FP32)
        self.assertEqual(stats.sum, 193872.0)

    def test_bad_arguments_raise(self):
        x = torch.zeros(4)
        with self.assertRaisesRegex(ValueError, "dtype"):
            ampscope.compute_stats(x.data_ptr(), 4, capi.FORMAT_E2M1)  # FP4 is no storage
        with self.assertRaisesRegex(ValueError, "fp32, fp16 or bf16"):  # FP8 is not unscaled
            ampscope.scale_and_compute_stats(x.data_ptr(), 4, capi.FORMAT_E4M3, 0.5)


class RecordingHooks:
    """A scaler's hooks that want every gradient measured against fp16@10."""

    def __init__(self):
        self.stats = {}

    def unscale_stats_target(self, param):
        return (capi.FORMAT_FP16, 10)

    def on_unscaled_stats(self, param, stats):
        self.stats[id(param)] = stats


def grads_of(dtype, poison):
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in (7, 300, 4096)]
    for i, p in enumerate(params):
        p.grad = (torch.randn(p.numel()) * 1024.0 * (i + 1)).to(dtype)
    if poison:
        params[1].grad[5] = float("nan")
    return params


class ScalerTest(unittest.TestCase):
    def test_the_fused_unscale_changes_nothing_but_measures(self):
        for dtype in FORMATS:
            for poison in (False, True):
                with self.subTest(dtype=dtype, poison=poison):
                    plain_params, fused_params = grads_of(dtype, poison), grads_of(dtype, poison)
                    plain = amps.LossScaler(init_scale=1024.0)
                    fused = amps.LossScaler(init_scale=1024.0)
                    hooks = RecordingHooks()
                    adapter = adapt_scaler(fused)
                    adapter.install(hooks)
                    plain_opt = torch.optim.SGD(plain_params, lr=0.0)
                    fused_opt = torch.optim.SGD(fused_params, lr=0.0)
                    plain.unscale_(plain_opt)
                    fused.unscale_(fused_opt)
                    for p, f in zip(plain_params, fused_params):
                        self.assertTrue(torch.equal(p.grad.float(), f.grad.float())
                                        or (poison and torch.equal(p.grad.isnan(),
                                                                   f.grad.isnan())))
                    self.assertEqual(len(hooks.stats), 3)
                    for f in fused_params:
                        ref = ampscope.compute_stats(f.grad.data_ptr(), f.grad.numel(),
                                                     FORMATS[dtype], [(capi.FORMAT_FP16, 10)])
                        got = hooks.stats[id(f)]
                        self.assertEqual(got.histogram(), ref.histogram())
                        self.assertEqual(got.targets(), ref.targets())
                        self.assertEqual(got.nan, ref.nan)
                    plain.step(plain_opt)
                    fused.step(fused_opt)
                    plain.update()
                    fused.update()
                    self.assertEqual(plain.get_scale(), fused.get_scale())
                    self.assertEqual(fused.get_scale(), 512.0 if poison else 1024.0)
                    adapter.uninstall()


class MonitorTest(unittest.TestCase):
    def train(self, server, tmp, run_id, fused):
        torch.manual_seed(0)
        model = amps_testing.tiny_gpt()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = amps_testing.batches(0)
        scaler = amps.LossScaler(init_scale=1024.0)
        mon = amps.attach(model, opt, scaler, run_id=run_id, server=server.address,
                          compute_dtype=torch.bfloat16,
                          options={"spool_dir": os.path.join(tmp, "spool-" + run_id),
                                   "sample_full_every": 2})
        if not fused:
            mon.unscale_stats_target = lambda param: None  # the agent measures them itself
        losses = []
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            x, y = next(data)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1),
                                                         y.flatten())
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
        self.assertTrue(mon.close(20), mon.notices())
        return losses, server.reports(run_id)

    def test_reports_equal_those_measured_by_the_agent(self):
        with tempfile.TemporaryDirectory(prefix="ampscope-fused-") as tmp:
            server = amps_testing.Server(tmp).start()
            try:
                plain_losses, plain = self.train(server, tmp, "plain", fused=False)
                fused_losses, fused = self.train(server, tmp, "fused", fused=True)
            finally:
                server.stop()
        self.assertEqual(plain_losses, fused_losses)  # training is bit-identical
        self.assertEqual(len(plain), 4)
        self.assertEqual(len(fused), 4)
        unscaled = 0
        for p, f in zip(plain, fused):
            self.assertEqual([t["name"] for t in p["tensors"]], [t["name"] for t in f["tensors"]])
            for a, b in zip(p["tensors"], f["tensors"]):
                if a["phase"] == "after_unscale":
                    unscaled += 1
                    self.assertEqual(a["level"], "full")
                self.assertEqual(a, b, a["name"])
        self.assertGreater(unscaled, 0)


if __name__ == "__main__":
    unittest.main()
