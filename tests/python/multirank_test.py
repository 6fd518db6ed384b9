#!/usr/bin/python3
"""ampscope-train on two data-parallel ranks (mpirun -np 2, Open MPI) against one real
ampscope-server: the per-step policy agreement end to end.

  - headroom policy, delivery to rank 1 delayed: every step both ranks use the same scale and
    report the same scale after, found_inf, skip and policy seq; every decision is applied by
    both ranks at the same step; the server counts no divergence;
  - the negative control (policy_agreement=independent): rank 1 refuses what came late, the
    ranks part, and the server counts and shows the divergence;
  - the server killed mid-run and restarted: both ranks fall back to their local scaler on the
    same step, and every step of both ranks is stored once;
  - a NaN injected on rank 1 only: both ranks skip that step, and rank 1's report names the
    first offender before anything of rank 0's.

Skips (77) when mpirun is not installed."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402

TRAIN = os.environ.get("AMPSCOPE_TRAIN_BIN", "")
MPIRUN = shutil.which("mpirun")
# A small model: the test is about the agreement, not the learning; its steps (several ms) keep
# the run going while the policy's decisions travel.
MODEL = ["--layers", "2", "--width", "64", "--heads", "2", "--context", "32", "--batch", "8",
         "--eval-every", "0", "--quiet", "--threads", "1"]
DELAY = ["--agent", "policy_receive_delay_ms=300"]  # rank 1's decisions count 300 ms late


def mpirun_prefix():
    args = [MPIRUN, "--oversubscribe"]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    return args


class MultiRankTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-multirank-")
        self.tmp = self._tmp.name
        self.addCleanup(self._tmp.cleanup)

    def server(self, *args, metrics=False):
        s = amps_testing.Server(self.tmp, *args, metrics=metrics).start()
        self.addCleanup(s.stop, False)
        return s

    def train(self, server, run_id, steps, common=(), rank1=(), wait=True):
        """mpirun -np 2 (MPMD: rank 1 may get extra flags); returns the Popen when not waiting."""
        base = [TRAIN, *MODEL, "--steps", str(steps), "--server", server.address,
                "--run-id", run_id, "--spool-dir", os.path.join(self.tmp, "spool"),
                "--sample-full-every", "5", *common]
        cmd = [*mpirun_prefix(), "-np", "1", *base, ":", "-np", "1", *base, *rank1]
        log = open(os.path.join(self.tmp, run_id + ".log"), "wb")
        self.addCleanup(log.close)
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        if not wait:
            return p
        self.finish(p, run_id)
        return None

    def finish(self, p, run_id):
        rc = p.wait(timeout=600)
        self.assertEqual(rc, 0, self.log(run_id))

    def log(self, run_id):
        with open(os.path.join(self.tmp, run_id + ".log"), errors="replace") as f:
            return f.read()

    def by_step(self, server, run_id):
        steps = {}
        for r in server.reports(run_id):
            self.assertNotIn(r["rank"], steps.get(r["step"], {}), "a step stored twice")
            steps.setdefault(r["step"], {})[r["rank"]] = r
        return steps

    def assert_ranks_agree(self, steps, n):
        self.assertEqual(sorted(steps), list(range(n)))
        for s, ranks in steps.items():
            self.assertEqual(set(ranks), {0, 1}, f"step {s}")
            for field in ("loss_scale", "scale_after", "found_inf", "skipped", "policy_seq"):
                self.assertEqual(ranks[0][field], ranks[1][field], f"step {s} {field}")

    def test_a_delayed_rank_applies_every_decision_together(self):
        server = self.server("--policy", "headroom", "--policy-lead-steps", "1")
        steps = 200
        self.train(server, "agree", steps, common=["--init-scale", "16777216"], rank1=DELAY)
        by_step = self.by_step(server, "agree")
        self.assert_ranks_agree(by_step, steps)
        show = server.cli("show", "agree", "--limit", "1000")
        decisions = show["policy_updates"]
        self.assertTrue(decisions, "the headroom policy decided nothing")
        late = 0
        for d in decisions:
            apps = {a["rank"]: a for a in d["applications"]}
            if not apps:
                continue  # decided after the last step
            self.assertEqual(set(apps), {0, 1}, d)
            self.assertEqual(apps[0]["step"], apps[1]["step"], d)
            self.assertEqual(apps[0]["applied"], apps[1]["applied"], d)
            late += apps[0]["step"] > d["effective_from_step"]
        self.assertGreater(late, 0, "the delay never made a decision late")
        self.assertFalse(show.get("rank_divergence"), show.get("rank_divergence"))

    def test_without_agreement_the_ranks_diverge_and_the_server_says_so(self):
        # Lead steps enough for rank 0's decisions to arrive in time; rank 1 holds them 3 s
        # longer, so on a busy machine too rank 0 applies what rank 1 has not yet received.
        server = self.server("--policy", "headroom", "--policy-lead-steps", "10", metrics=True)
        steps = 200
        self.train(server, "apart", steps,
                   common=["--init-scale", "16777216", "--agent", "policy_agreement=independent"],
                   rank1=["--agent", "policy_receive_delay_ms=3000"])
        by_step = self.by_step(server, "apart")
        differ = [s for s, r in by_step.items()
                  if len(r) == 2 and r[0]["loss_scale"] != r[1]["loss_scale"]]
        self.assertTrue(differ, "the negative control did not diverge\n" + self.log("apart"))
        show = server.cli("show", "apart", "--limit", "1000")
        divergence = show.get("rank_divergence")
        self.assertTrue(divergence, "the server did not report the divergence")
        fields = {d["field"] for d in divergence}
        self.assertIn("loss_scale", fields)
        first = min(d["step"] for d in divergence if d["field"] == "loss_scale")
        self.assertEqual(first, min(differ))
        # What the AmpscopeRankDivergence alert fires on: one count per step and field.
        counted = server.metric("ampscope_rank_divergence_total", run="apart", field="loss_scale")
        self.assertEqual(counted, len([d for d in divergence if d["field"] == "loss_scale"]))

    def test_server_killed_both_ranks_fall_back_on_the_same_step(self):
        server = self.server("--policy", "static-params", "--static-loss-scale", "1024",
                             "--static-growth-interval", "1000000")
        steps = 600
        p = self.train(server, "fallback", steps,
                       common=["--agent", "policy_fallback_after_ms=300"], wait=False)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            try:
                apps = [a for d in server.cli("show", "fallback", "--limit", "1000")["policy_updates"]
                        for a in d["applications"] if a["applied"]]
            except RuntimeError:
                apps = []
            if len(apps) == 2:
                break
            time.sleep(0.2)
        self.assertIsNone(p.poll(), "training ended before the policy applied")
        server.kill()
        time.sleep(1.5)
        server.start()
        self.finish(p, "fallback")
        by_step = self.by_step(server, "fallback")
        self.assert_ranks_agree(by_step, steps)
        back = {}
        for a in server.cli("show", "fallback", "--limit", "1000")["agents"]:
            for n in a["notices"]:
                m = re.search(r"configuration is back from step (\d+)", n)
                if m:
                    back[a["rank"]] = int(m.group(1))
        self.assertEqual(set(back), {0, 1}, self.log("fallback"))
        self.assertEqual(back[0], back[1])

    def test_a_nan_on_rank_1_skips_the_step_on_both(self):
        server = self.server()
        self.train(server, "nan", 12, common=["--inject-nan", "h0.mlp.fc@5", "--inject-rank", "1",
                                              "--sample-count-roles", "all"])
        by_step = self.by_step(server, "nan")
        self.assert_ranks_agree(by_step, 12)
        self.assertTrue(by_step[5][0]["skipped"] and by_step[5][1]["skipped"])
        self.assertFalse(any(by_step[s][0]["skipped"] for s in by_step if s != 5))
        first1 = by_step[5][1]["first_offender"]
        self.assertIsNotNone(first1)
        self.assertEqual(first1["tensor"], "h0.mlp.fc")
        first0 = by_step[5][0]["first_offender"]
        if first0 is not None:  # rank 0 meets the NaN only in the all-reduced gradients
            self.assertGreater(first0["order"], first1["order"])


if __name__ == "__main__":
    if not MPIRUN:
        print("mpirun not found: install openmpi-bin (./run setup)")
        sys.exit(77)
    unittest.main()
