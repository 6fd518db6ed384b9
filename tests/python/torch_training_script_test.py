#!/usr/bin/python3
"""An ordinary PyTorch training script (ordinary_training.py: its own loop, validation under
eval() and no_grad(), nn.MultiheadAttention, ModuleDict keys that are not ASCII, gradient
accumulation, clipping, an LR scheduler, torch.save(model) and a full checkpoint every epoch,
an EMA copy by copy.deepcopy that runs forwards) attached to a real ampscope-server, run in two
processes: two epochs, then a resume from the checkpoint for a third. Every step is stored
exactly once, the optimizer-step count continues over the resume, and the non-ASCII tensor
names are stored and shown as written."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ordinary_training.py")
UNICODE_MODULE = "encoder.mlp.température.线性"
STEPS_PER_EPOCH = 5
NAN_AT = 7


class TrainingScriptTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-script-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        self.server = amps_testing.Server(self.tmp).start()
        self.addCleanup(self.server.stop)

    def run_script(self, *args):
        r = subprocess.run([sys.executable, SCRIPT, "--server", self.server.address,
                            "--run-id", "ordinary", "--out", self.tmp,
                            "--steps-per-epoch", str(STEPS_PER_EPOCH), *args],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_an_ordinary_script_attached_and_resumed(self):
        first = self.run_script("--epochs", "2", "--nan-at", str(NAN_AT))
        second = self.run_script("--epochs", "1", "--resume")
        for out in (first, second):
            self.assertTrue(out["acknowledged"], out)
            self.assertEqual([n for n in out["notices"] if n.startswith("torch:")], [],
                             "no hook failed")
            self.assertEqual(out["warnings"], [])
            self.assertEqual(out["ema_forwards"], out["steps"] - (0 if out is first else 10))
        total = 3 * STEPS_PER_EPOCH
        self.assertEqual(second["steps"], total)

        reports = self.server.reports("ordinary")
        steps = [r["step"] for r in reports]
        self.assertEqual(sorted(steps), list(range(total)), "every step stored exactly once")
        self.assertEqual(len(steps), total)
        shown = self.server.cli("show", "ordinary")
        self.assertEqual(shown["steps"], total)
        self.assertEqual(shown["duplicate_reports"], 0)
        self.assertEqual(shown["rejected_reports"], 0)

        by_step = {r["step"]: r for r in reports}
        # The skipped step: no optimizer step, the learning rate held, and the count of
        # optimizer steps continues in the resumed process.
        self.assertEqual([s for s in steps if by_step[s]["skipped"]], [NAN_AT])
        self.assertEqual([by_step[s]["optimizer_steps"] for s in range(total)],
                         [s + 1 if s < NAN_AT else s for s in range(total)])
        self.assertEqual(first["lrs"][str(NAN_AT)], first["lrs"][str(NAN_AT - 1)])
        self.assertEqual(second["optimizer_steps"], total - 1)

        # Names as PyTorch gives them: the attention's own parameters (it is not a leaf), the
        # micro-batches of the accumulation, and the ModuleDict keys, as written.
        names = {t["name"] for t in by_step[0]["tensors"]}
        for expected in ("encoder.attn.in_proj_weight", "encoder.attn.out_proj.weight",
                         "encoder.norm1", UNICODE_MODULE, UNICODE_MODULE + ".grad",
                         UNICODE_MODULE + ".weight", "loss"):
            self.assertIn(expected, names)
        self.assertEqual({t["micro_step"] for t in by_step[0]["tensors"]
                          if t["name"] == UNICODE_MODULE}, {0, 1})
        self.assertEqual([(o["step"], o["tensor"]) for o in shown["first_offenders"]],
                         [(NAN_AT, UNICODE_MODULE)])
        text = subprocess.run([os.environ["AMPSCOPE_CLI_BIN"], "show", "ordinary", "--server",
                               self.server.address], capture_output=True, timeout=60)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn(UNICODE_MODULE.encode(), text.stdout, "shown as written, in UTF-8")


if __name__ == "__main__":
    unittest.main(verbosity=2)
