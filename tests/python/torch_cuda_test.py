#!/usr/bin/python3
"""ampscope.torch on a GPU: torch.cuda.amp.GradScaler adapted in place, CUDA tensors measured on
the agent's side stream, against a real ampscope-server. Skips (exit 77) without CUDA; runs in
bench/gpu/check.sh.

Checks: every step stored once; a NaN in a named module's output makes it the first offender,
GradScaler skips the step and halves its scale; the side-stream statistics of an activation
equal the CPU's counts of the same values (NaN, zeros, max |x|, numel); a PolicyUpdate sets the
GradScaler's scale at exactly its step."""

import os
import sys
import tempfile
import unittest

import torch

if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402
import ampscope.torch as amps  # noqa: E402


class CudaMonitorTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-cuda-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def run_loop(self, server_args, run_id, steps, nan_at=-1, capture_at=-1):
        server = amps_testing.Server(self.tmp, *server_args).start()
        self.addCleanup(server.stop)
        torch.manual_seed(0)
        model = amps_testing.tiny_gpt().cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.cuda.amp.GradScaler(init_scale=4096.0)
        mon = amps.attach(model, opt, scaler, run_id=run_id, server=server.address,
                          compute_dtype=torch.float16,
                          options={"spool_dir": os.path.join(self.tmp, "spool-" + run_id),
                                   "sample_full_every": 1})
        self.addCleanup(mon.close, 0)
        fc = model.blocks[1].fc
        clean_forward = fc.forward
        state = {"step": 0, "captured": None}

        def forward(x):
            out = clean_forward(x)
            if state["step"] == nan_at:
                out = out.clone()
                out[0, 0, 0] = float("nan")
            if state["step"] == capture_at:
                state["captured"] = out.detach().float().cpu()
            return out

        fc.forward = forward
        data = amps_testing.batches(0)
        scales = []
        for i in range(steps):
            state["step"] = i
            x, y = (t.cuda() for t in next(data))
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1),
                                                         y.flatten())
            opt.zero_grad(set_to_none=True)
            scales.append(scaler.get_scale())
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            mon.flush(5)
        self.assertTrue(mon.close(30), mon.notices())
        return server, mon, scales, state["captured"]

    def test_nan_offender_skip_and_side_stream_statistics(self):
        server, _, scales, captured = self.run_loop([], "cuda-nan", 6, nan_at=3, capture_at=1)
        reports = {r["step"]: r for r in server.reports("cuda-nan")}
        self.assertEqual(sorted(reports), list(range(6)))
        self.assertTrue(reports[3]["skipped"])
        self.assertEqual(scales[4], scales[3] / 2)
        offenders = [(o["step"], o["tensor"]) for o in server.cli("show", "cuda-nan")
                     ["first_offenders"]]
        self.assertEqual(offenders[0], (3, "blocks.1.fc"))
        t = [t for t in reports[1]["tensors"] if t["name"] == "blocks.1.fc"][0]
        self.assertEqual(t["dtype"], "fp16")
        self.assertEqual(t["numel"], captured.numel())
        self.assertEqual(t["nan"], int(torch.isnan(captured).sum()))
        self.assertEqual(t["zeros"], int((captured == 0).sum()))
        self.assertEqual(t["max_abs"], float(captured.abs().max()))

    def test_policy_sets_the_gradscaler_scale_at_its_step(self):
        server, mon, scales, _ = self.run_loop(
            ["--policy", "static-params", "--static-loss-scale", "256"], "cuda-policy", 12)
        applied = [c for c in mon.policy_log if "scale" in c.get("scaler", {})]
        self.assertTrue(applied, mon.policy_log)
        step = applied[0]["step"]
        self.assertIsNone(applied[0]["refused"])
        self.assertEqual(scales[step], 256.0)
        self.assertNotEqual(scales[step - 1], 256.0)
        reports = {r["step"]: r for r in server.reports("cuda-policy")}
        self.assertEqual(reports[step]["loss_scale"], 256.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
