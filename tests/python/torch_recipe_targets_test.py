#!/usr/bin/python3
"""ampscope.torch with recipe_targets: a small real PyTorch transformer trained on the CPU with
full statistics every step, its tensors counted against MXFP8 (E4M3) and NVFP4 by the agent.

Checks: `ampscope show --json` lists a quantiser "TENSOR [RECIPE]" for the model's tensors and
both recipes; for one weight the stored counts equal `ampscope stats FILE.npy --json --target
RECIPE` of the same tensor saved at each step (the CLI's own recipe_counts, summed over the
steps as the server sums samples); bad recipe_targets raise naming the argument."""

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
import ampscope.torch as amps  # noqa: E402

RECIPES = ["mxfp8_e4m3", "nvfp4"]
SUMMED = ["values", "nonfinite", "underflow", "subnormal", "saturated", "overflow", "blocks",
          "zero_blocks", "saturated_blocks", "nan_blocks"]


def cli_recipe_counts(path):
    """`ampscope stats PATH --json --target R` for every recipe: {recipe: counts}."""
    args = [os.environ["AMPSCOPE_CLI_BIN"], "stats", path, "--json"]
    for r in RECIPES:
        args += ["--target", r]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    return {c["recipe"]: c for c in json.loads(out)["recipes"]}


class RecipeTargetsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-recipes-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_show_lists_recipe_counts_equal_to_the_cli(self):
        server = amps_testing.Server(self.tmp).start()
        self.addCleanup(server.stop)
        torch.manual_seed(0)
        model = amps_testing.tiny_gpt()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = amps_testing.batches(0)
        mon = amps.attach(model, opt, None, run_id="recipes", server=server.address,
                          master_weights=True, recipe_targets=RECIPES,
                          options={"spool_dir": os.path.join(self.tmp, "spool"),
                                   "sample_full_every": 1})
        self.addCleanup(mon.close, 0)
        name, weight = next((n, p) for n, p in model.named_parameters()
                            if n.endswith("fc.weight"))
        self.assertEqual(weight.dim(), 2)
        steps = 3
        expected = {r: {k: 0 for k in SUMMED} for r in RECIPES}
        amax = {r: 0.0 for r in RECIPES}
        for step in range(steps):
            # The weight as the agent measures it at the start of the step.
            path = os.path.join(self.tmp, f"weight{step}.npy")
            numpy.save(path, weight.detach().numpy().copy())
            for r, c in cli_recipe_counts(path).items():
                for k in SUMMED:
                    expected[r][k] += c[k]
                amax[r] = max(amax[r], c["amax"])
            opt.zero_grad(set_to_none=True)
            x, y = next(data)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            mon.loss(loss)
            loss.backward()
            opt.step()
        self.assertTrue(mon.close(20), mon.notices())

        quantizers = server.cli("show", "recipes")["quantizers"]
        by_key = {(q["name"], q["role"]): q for q in quantizers}
        # Every tensor measured (weights, gradients, activations) with both recipes.
        for role in ("master_weight", "weight_grad", "activation"):
            for r in RECIPES:
                self.assertTrue(any(q["role"] == role and q["recipe"] == r for q in quantizers),
                                f"no {role} quantiser for {r}: {sorted(by_key)}")
        for r in RECIPES:
            q = by_key.get((f"{name} [{r}]", "master_weight"))
            self.assertIsNotNone(q, f"{name} [{r}] not in {sorted(by_key)}")
            self.assertEqual(q["recipe"], r)
            self.assertEqual(q["phase"], "step_start")
            self.assertEqual(q["samples"], steps)
            self.assertEqual(q["last_step"], steps - 1)
            self.assertGreater(expected[r]["values"], 0)
            for k in SUMMED:
                self.assertEqual(q[k], expected[r][k], f"{r} {k}")
            self.assertEqual(q["amax"], amax[r])
        # The data makes the comparison mean something: NVFP4 loses values of this weight.
        self.assertGreater(expected["nvfp4"]["underflow"] + expected["nvfp4"]["saturated"], 0)

    def test_bad_recipe_targets_raise_naming_the_argument(self):
        model = torch.nn.Linear(4, 4)
        for bad, error in (("mxfp8_e4m3,mxfp9", ValueError), (["nvfp4", "e4m3:nonsense"],
                                                             ValueError),
                           (["nvfp4", "nvfp4"], ValueError), ([1], TypeError),
                           (["a,b"], ValueError)):
            with self.assertRaises(error) as caught:
                amps.attach(model, None, None, run_id="bad", server="127.0.0.1:1",
                            recipe_targets=bad)
            self.assertIn("recipe_targets", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
