#!/usr/bin/python3
"""ampscope.torch on two data-parallel ranks: two processes joined by torch.distributed (gloo,
CPU), each training a small transformer data-parallel (gradients averaged with an all-reduce after
backward, as DistributedDataParallel does) with ampscope.torch.LossScaler and attached with attach(..., process_group=...) to one real
ampscope-server whose policy pushes a loss scale.

Delivery to rank 1 is delayed (the agent's policy_receive_delay_ms fault injection), so rank 0
holds the update several steps before rank 1 does. With the per-step agreement both ranks
apply it at the same step (late, together), and their loss scales agree on every step. The
negative control (policy_agreement=independent, the single-rank behaviour on each rank) lets
rank 0 apply the update while rank 1 refuses it as late: their scales part, and the server
shows the divergence on exactly those steps."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402

STEPS = 24
DELAY_MS = 1500  # rank 1's updates count as received this long after they arrived


def worker(rank, world, rendezvous, server, run_id, agreement, out_path, spool):
    """One rank: data-parallel training with the monitor attached over a gloo group."""
    import torch
    import torch.distributed as dist
    import ampscope.torch as amps

    # A file rendezvous: no port to choose, so no race with other tests for a free one.
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank,
                            world_size=world)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = amps_testing.tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = amps.LossScaler(init_scale=65536.0)
    options = {"spool_dir": spool, "sample_full_every": 0}
    if agreement != "per_step":
        options.update({"rank": rank, "world_size": world, "policy_agreement": agreement})
    if rank == 1:
        options["policy_receive_delay_ms"] = DELAY_MS
    mon = amps.attach(model, opt, scaler, run_id=run_id, server=server,
                      compute_dtype=torch.bfloat16, options=options,
                      process_group=dist.group.WORLD if agreement == "per_step" else None)
    data = amps_testing.batches(seed=rank)  # each rank its own share of the data
    scales = []
    for _ in range(STEPS):
        x, y = next(data)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        scales.append(scaler.get_scale())
        scaler.scale(loss).backward()
        for p in model.parameters():  # what DistributedDataParallel's hooks do
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        mon.flush(2)  # each report reaches the server before the next step: decisions come early
        time.sleep(0.15)
    counters = mon.counters()
    ok = mon.close(20)
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "scales": scales, "policy_log": mon.policy_log,
                   "counters": counters, "closed": ok, "notices": mon.notices()}, f)
    dist.destroy_process_group()


class DistributedTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-torch-dist-")
        self.tmp = self._tmp.name
        self.server = amps_testing.Server(
            self.tmp, "--policy", "static-params", "--static-loss-scale", "256",
            "--policy-lead-steps", "1").start()
        self.addCleanup(self.server.stop)
        self.addCleanup(self._tmp.cleanup)

    @staticmethod
    def _end(proc):
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def run_ranks(self, run_id, agreement):
        rendezvous = os.path.join(self.tmp, f"rendezvous-{run_id}")
        procs, outs = [], []
        for rank in range(2):
            out = os.path.join(self.tmp, f"{run_id}-{rank}.json")
            outs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", str(rank), "2",
                 rendezvous, self.server.address, run_id, agreement, out,
                 os.path.join(self.tmp, f"spool-{run_id}-{rank}")]))
            # A rank that fails leaves the other waiting for it: never outlive the test.
            self.addCleanup(self._end, procs[-1])
        for p in procs:
            self.assertEqual(p.wait(timeout=300), 0)
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
        return results

    def test_a_late_rank_makes_both_apply_together(self):
        r0, r1 = self.run_ranks("agree", "per_step")
        for r in (r0, r1):
            self.assertTrue(r["closed"], r["notices"])
            self.assertEqual(len(r["policy_log"]), 1, r)
            self.assertEqual(r["counters"]["policies_applied"], 1, r)
        self.assertEqual(r0["policy_log"], r1["policy_log"])
        self.assertEqual(r0["scales"], r1["scales"])
        step = r0["policy_log"][0]["step"]
        self.assertEqual(r0["scales"][step], 256.0)
        self.assertNotEqual(r0["scales"][step - 1], 256.0)
        # The server saw the same scale from both ranks on every step, and the decision's
        # effective step had passed by the time rank 1 held it: applied late, together.
        reports = self.server.reports("agree")
        by_step = {}
        for rep in reports:
            by_step.setdefault(rep["step"], {})[rep["rank"]] = rep
        self.assertEqual(len(by_step), STEPS)
        for s, ranks in by_step.items():
            self.assertEqual(set(ranks), {0, 1}, s)
            self.assertEqual(ranks[0]["loss_scale"], ranks[1]["loss_scale"], s)
            self.assertEqual(ranks[0]["policy_seq"], ranks[1]["policy_seq"], s)
        show = self.server.cli("show", "agree")
        decisions = show["policy_updates"]
        self.assertEqual(len(decisions), 1, decisions)
        self.assertGreater(step, decisions[0]["effective_from_step"])
        self.assertEqual(show["rank_divergence"], [])

    def test_without_agreement_the_ranks_part(self):
        r0, r1 = self.run_ranks("apart", "independent")
        self.assertEqual(len(r0["policy_log"]), 1, r0)
        self.assertEqual(r1["counters"]["policies_applied"], 0, r1)
        self.assertEqual(r1["counters"]["policies_refused"], 1, r1)
        self.assertNotEqual(r0["scales"], r1["scales"])
        # The server merged the two ranks' steps and counted where their scales differ.
        apart = [s for s, (a, b) in enumerate(zip(r0["scales"], r1["scales"])) if a != b]
        divergence = self.server.cli("show", "apart", "--limit", "1000")["rank_divergence"]
        loss_scale = sorted(d["step"] for d in divergence if d["field"] == "loss_scale")
        self.assertEqual(loss_scale, apart, divergence)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(int(a[0]), int(a[1]), a[2], a[3], a[4], a[5], a[6], a[7])
    else:
        unittest.main()
