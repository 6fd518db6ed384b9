#!/usr/bin/python3
"""FP8/FP4 quantisers and per-layer precision from PyTorch (C ABI 7, the loss cost ABI 8).

Checks: ampscope.count_recipe through the C ABI equals `ampscope stats FILE.npy --json --target`
field for field (FP32 data, and FP8 E4M3 storage as raw uint8 bytes: torch 1.13 has no float8);
Monitor.observe_quantizer's entries, counted by the agent and summed by the server, equal the
CLI's counts times the steps; bad arguments are refused with TypeError/ValueError naming them;
against ampscope-server with its GEMM-precision policy, a layer whose quantiser underflows is
moved to BF16 and a clean one is not: on_gemm_precision is called with it at exactly the step the
update governs from, and the step's report has the update applied; an amax past a delayed
scale's reach halves the amax history through on_recipe at its step."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402
import ampscope  # noqa: E402
import ampscope._capi as capi  # noqa: E402
import ampscope.torch as amps  # noqa: E402

RECIPES = ["mxfp8_e4m3", "mxfp4", "nvfp4", "e4m3:current", "e5m2:current:margin=1",
           "e4m3:tile=1x128", "e4m3:tile=128x128", "e4m3:scale=0.5", "mxfp8_e4m3:ceil",
           "mxfp4:block=32x1"]
SUMMED = ["values", "nonfinite", "underflow", "subnormal", "saturated", "overflow", "blocks",
          "zero_blocks", "saturated_blocks", "nan_blocks"]


def cli_counts(path, recipes, dtype=None):
    """`ampscope stats PATH --json --target R ...`: {recipe as given: the CLI's counts}."""
    args = [os.environ["AMPSCOPE_CLI_BIN"], "stats", path, "--json"]
    if dtype is not None:
        args += ["--dtype", dtype]
    for r in recipes:
        args += ["--target", r]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(zip(recipes, json.loads(out)["recipes"]))


def activation(seed=0):
    """A (16, 200) FP32 activation over many binades, with an outlier column and a zero row: each
    recipe underflows, saturates or leaves blocks empty somewhere. Rows of 200 end in blocks cut
    short (32, 16 and 128 do not divide it), so counting in other rows would count otherwise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 200, generator=g) * torch.pow(2.0, torch.randint(-20, 6, (16, 200),
                                                                        generator=g).float())
    x[:, 7] *= 4096.0
    x[3] = 0.0
    return x


def fp8_bytes():
    """Every E4M3 byte pattern four times, as a (16, 64) uint8 tensor."""
    return torch.arange(256, dtype=torch.int32).repeat(4).to(torch.uint8).reshape(16, 64)


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-quantizer-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()


class CountsTest(TempDirTest):
    def assert_counts_equal(self, ours, cli, what):
        for k in SUMMED + ["amax", "signal_sq", "error_sq", "tensor_scale"]:
            self.assertEqual(ours[k], cli[k], f"{what}: {k}")
        self.assertEqual(ours["scale_histogram"], cli["scale_histogram"], what)

    def test_counts_through_the_c_abi_equal_the_cli(self):
        x = activation()
        path = os.path.join(self.tmp, "x.npy")
        numpy.save(path, x.numpy())
        expected = cli_counts(path, RECIPES)
        for r in RECIPES:
            ours = ampscope.count_recipe(x.data_ptr(), x.numel(), capi.FORMAT_FP32, x.shape[-1],
                                         r)
            self.assert_counts_equal(ours, expected[r], r)
        # The data makes the comparison mean something.
        self.assertGreater(expected["mxfp4"]["underflow"], 0)
        self.assertGreater(expected["mxfp8_e4m3"]["saturated"], 0)
        self.assertGreater(expected["nvfp4"]["zero_blocks"], 0)
        # Rows matter: the same values as one row count otherwise.
        one_row = ampscope.count_recipe(x.data_ptr(), x.numel(), capi.FORMAT_FP32, 0, "mxfp4")
        self.assertNotEqual(one_row["blocks"], expected["mxfp4"]["blocks"])

    def test_fp8_storage_as_raw_bytes_equals_the_cli(self):
        b = fp8_bytes()
        path = os.path.join(self.tmp, "b.npy")
        numpy.save(path, b.numpy())
        recipes = ["e5m2:current", "mxfp4", "nvfp4"]
        expected = cli_counts(path, recipes, dtype="e4m3")
        for r in recipes:
            ours = ampscope.count_recipe(b.data_ptr(), b.numel(), capi.FORMAT_E4M3, 64, r)
            self.assert_counts_equal(ours, expected[r], r)
            self.assertEqual(ours["nonfinite"], 8, "E4M3's two NaN patterns, four times")

    def test_count_recipe_refusals_say_why(self):
        x = activation()
        for args, message in (((capi.FORMAT_FP32, 200, "mxfp9"), "'mxfp9' is not a recipe"),
                              ((capi.FORMAT_E2M1, 200, "mxfp4"), "dtype"),
                              ((capi.FORMAT_FP32, 300, "mxfp4"), "300")):
            with self.assertRaisesRegex(ValueError, message):
                ampscope.count_recipe(x.data_ptr(), x.numel(), *args)


class MonitorQuantizerTest(TempDirTest):
    def server(self, *args):
        s = amps_testing.Server(self.tmp, *args).start()
        self.addCleanup(s.stop)
        return s

    def attach(self, server, run_id, **kw):
        model = torch.nn.Linear(256, 8)
        scaler = kw.pop("scaler", None)
        options = {"spool_dir": os.path.join(self.tmp, "spool-" + run_id)}
        options.update(kw.pop("options", {}))
        mon = amps.attach(model, None, scaler, run_id=run_id, server=server.address,
                          options=options, **kw)
        self.addCleanup(mon.close, 0)
        return mon

    def test_observed_quantizers_equal_the_cli_summed_over_the_steps(self):
        server = self.server()
        recorded = []
        mon = self.attach(server, "quantizers", gemm_layers=["fc", "proj"],
                          on_gemm_precision=lambda layers, step: None)
        x, b = activation(), fp8_bytes()
        steps = 3
        self.assertFalse(mon.observe_quantizer(x, "mxfp4", "fc.input", layer="fc"),
                         "outside a step nothing is recorded")
        for step in range(steps):
            with mon.step(step):
                recorded.append(mon.observe_quantizer(x, "mxfp4", "fc.input", layer="fc"))
                recorded.append(mon.observe_quantizer(
                    b, "nvfp4", "proj.input", layer="proj", dtype="e4m3", what_if=True,
                    loss_cost=0.001 * (step + 1)))
                recorded.append(mon.observe_quantizer(
                    x.t(), "e4m3:scale=0.5", "fc.weight", role="weight",
                    amax_history=torch.tensor([1.0, 2.0, 0.5])))
        self.assertEqual(recorded, [True] * 3 * steps)
        self.assertTrue(mon.close(20), mon.notices())

        x_path, b_path, w_path = (os.path.join(self.tmp, n) for n in ("x.npy", "b.npy", "w.npy"))
        numpy.save(x_path, x.numpy())
        numpy.save(b_path, b.numpy())
        numpy.save(w_path, x.t().contiguous().numpy())
        expected = {("fc.input", "activation"): cli_counts(x_path, ["mxfp4"])["mxfp4"],
                    ("proj.input", "activation"): cli_counts(b_path, ["nvfp4"],
                                                             dtype="e4m3")["nvfp4"],
                    ("fc.weight", "weight"): cli_counts(w_path, ["e4m3:scale=0.5"])[
                        "e4m3:scale=0.5"]}
        quantizers = {(q["name"], q["role"]): q
                      for q in server.cli("show", "quantizers")["quantizers"]}
        self.assertEqual(sorted(quantizers), sorted(expected))
        for key, cli in expected.items():
            q = quantizers[key]
            self.assertEqual(q["recipe"], cli["recipe"], key)
            self.assertEqual(q["samples"], steps, key)
            for k in SUMMED:
                self.assertEqual(q[k], steps * cli[k], f"{key}: {k}")
            self.assertEqual(q["amax"], cli["amax"], key)
        self.assertGreater(expected[("fc.input", "activation")]["underflow"], 0)
        # The loss cost given (C ABI 8): its count, mean and spread over the run.
        cost = quantizers[("proj.input", "activation")]
        self.assertEqual(cost["loss_cost_samples"], steps)
        self.assertAlmostEqual(cost["loss_cost_mean"], 0.002, places=12)
        self.assertAlmostEqual(cost["loss_cost_stddev"], 0.001, places=12)
        self.assertNotIn("loss_cost_samples", quantizers[("fc.input", "activation")])

    def test_bad_arguments_are_refused_naming_them(self):
        server = self.server()
        mon = self.attach(server, "refusals", gemm_layers=["fc"],
                          on_gemm_precision=lambda layers, step: None)
        x = activation()
        with mon.step(0):
            for call, error, message in (
                    (lambda: mon.observe_quantizer(x, "mxfp9", "a"), ValueError,
                     "'mxfp9' is not a recipe"),
                    (lambda: mon.observe_quantizer(x, "mxfp4", "a", layer="lm_head"), ValueError,
                     "lm_head"),
                    (lambda: mon.observe_quantizer(fp8_bytes(), "mxfp4", "a"), ValueError,
                     "dtype must be 'e4m3' or 'e5m2'"),
                    (lambda: mon.observe_quantizer(x, "mxfp4", "a", dtype="e4m3"), ValueError,
                     "uint8"),
                    (lambda: mon.observe_quantizer(x.double(), "mxfp4", "a"), TypeError,
                     "float64"),
                    (lambda: mon.observe_quantizer(x.numpy(), "mxfp4", "a"), TypeError,
                     "torch.Tensor"),
                    (lambda: mon.observe_quantizer(x, "mxfp4", "a", role="gradient"),
                     ValueError, "role"),
                    (lambda: mon.observe_quantizer(x, "mxfp4", "a", loss_cost=float("nan")),
                     ValueError, "loss_cost must be finite"),
                    (lambda: mon.observe_quantizer(x, "mxfp4", "a", loss_cost="0.1"),
                     TypeError, "loss_cost must be a float")):
                with self.assertRaisesRegex(error, message):
                    call()
        # Outside a step the recipe is still checked (the data is not read).
        with self.assertRaisesRegex(ValueError, "'nvfp5' is not a recipe"):
            mon.observe_quantizer(x, "nvfp5", "a")
        for kw, error, message in (
                ({"gemm_layers": ["fc"]}, TypeError, "on_gemm_precision"),
                ({"gemm_layers": ["fc", "fc"], "on_gemm_precision": print}, ValueError, "twice"),
                ({"gemm_layers": "fc", "on_gemm_precision": print}, TypeError, "gemm_layers"),
                ({"on_recipe": 3}, TypeError, "on_recipe")):
            with self.assertRaisesRegex(error, message):
                amps.attach(torch.nn.Linear(4, 4), run_id="bad", server="127.0.0.1:1", **kw)

    def gemm_server(self):
        # static-params needs a scaler field: its growth interval goes to a LossScaler.
        return self.server("--policy", "static-params", "--static-growth-interval", "1000",
                           "--gemm-precision", "--gemm-window", "2", "--gemm-min-reports", "1",
                           "--gemm-max-bf16-share", "1", "--gemm-spike-reports", "1",
                           "--policy-lead-steps", "3")

    def test_a_bf16_decision_reaches_on_gemm_precision_at_its_step(self):
        server = self.gemm_server()
        calls = []

        def on_gemm_precision(layers, from_step):
            calls.append((list(layers), from_step))

        mon = self.attach(server, "gemms", gemm_layers=["fc", "proj"],
                          on_gemm_precision=on_gemm_precision, scaler=amps.LossScaler())
        tiny = torch.full((4, 64), 2.0 ** -20)  # below e4m3:scale=1's smallest subnormal
        # Gaussian values: e4m3:current loses none of them (policy.md's figures).
        clean = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
        for step in range(30):
            with mon.step(step):
                bf16 = "fc" in mon.bf16_gemms
                mon.observe_quantizer(tiny, "e4m3:scale=1", "fc.input", layer="fc",
                                      what_if=bf16)
                mon.observe_quantizer(clean, "e4m3:current", "proj.input", layer="proj")
            mon.flush(5)
            if calls and step >= calls[0][1] + 1:
                break
        self.assertTrue(mon.close(20), mon.notices())
        self.assertTrue(calls, mon.policy_log)
        layers, from_step = calls[0]
        self.assertEqual(layers, ["fc"])
        self.assertIn({"step": from_step, "bf16_gemms": ["fc"], "refused": None},
                      mon.policy_log)
        self.assertEqual(mon.bf16_gemms, ["fc"])
        decided = server.cli("show", "gemms")["policy_updates"]
        moved = [d for d in decided if d.get("bf16_gemms") == ["fc"]]
        self.assertTrue(moved, decided)
        self.assertEqual(moved[0]["effective_from_step"], from_step)
        # The update the server decided is the one applied, at the step it governs from.
        reports = {r["step"]: r for r in server.reports("gemms")}
        outcomes = {o["policy_id"]: o for o in reports[from_step]["policy_outcomes"]}
        self.assertIn(moved[0]["policy_id"], outcomes, reports[from_step]["policy_outcomes"])
        self.assertTrue(outcomes[moved[0]["policy_id"]]["applied"])
        # Each step's report names its BF16 GEMMs (tail --json): none before, fc from then on.
        self.assertEqual(reports[from_step - 1]["bf16_gemms"], [])
        self.assertEqual(reports[from_step]["bf16_gemms"], ["fc"])


    def test_a_delayed_scaling_change_reaches_on_recipe_at_its_step(self):
        server = self.gemm_server()
        calls = []

        def on_recipe(history_length, margin, from_step):
            calls.append((history_length, margin, from_step))

        mon = self.attach(server, "delayed", gemm_layers=["fc"],
                          on_gemm_precision=lambda layers, step: None, on_recipe=on_recipe,
                          scaler=amps.LossScaler(), options={"sample_full_every": 1})
        # One value past the delayed scale's reach (448 / 1): a spike, with 16 steps of history.
        x = torch.ones(4, 64)
        x[0, 0] = 1000.0
        for step in range(30):
            with mon.step(step):
                mon.observe_quantizer(x, "e4m3:scale=1", "h.input", amax_history=[1.0] * 16)
            mon.flush(5)
            if calls:
                break
        self.assertTrue(mon.close(20), mon.notices())
        self.assertTrue(calls, mon.policy_log)
        self.assertEqual(calls[0][:2], (8, None), "the history halved, the margin left alone")
        from_step = calls[0][2]
        self.assertIn({"step": from_step, "recipe": {"amax_history_length": 8}, "refused": None},
                      mon.policy_log)
        decided = [d for d in server.cli("show", "delayed")["policy_updates"]
                   if d.get("amax_history_length") == 8]
        self.assertTrue(decided)
        self.assertEqual(decided[0]["effective_from_step"], from_step)


if __name__ == "__main__":
    unittest.main()
