#!/usr/bin/python3
"""ampscope.torch end to end: a small real PyTorch transformer trained on the CPU under bf16
autocast with ampscope.torch.LossScaler, attached to a real ampscope-server.

Checks: every step stored exactly once (with gradient accumulation); a NaN in a named module's
output makes that module the first offender, skips the step, backs the scale off and holds the
learning rate; a PolicyUpdate applied at exactly its step; the server killed and restarted
mid-run loses nothing; an FP32 model without a scaler still reports; a failing hook becomes a
notice and training goes on; bad arguments to attach raise TypeError/ValueError naming them; a
list of servers whose first is down reaches the second."""

import math
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402
import ampscope  # noqa: E402
import ampscope.torch as amps  # noqa: E402


def train(mon, model, opt, scaler, data, steps, *, micro=1, scheduler=None, on_step=None):
    """The loop a user writes (autocast + scaler), `micro` micro-batches per step."""
    for i in range(steps):
        if on_step is not None:
            on_step(i)
        opt.zero_grad(set_to_none=True)
        for _ in range(micro):
            x, y = next(data)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                         y.flatten()) / micro
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        if scheduler is not None:
            scheduler.step()


def setup(seed=0, lr=1e-2):
    torch.manual_seed(seed)
    model = amps_testing.tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    return model, opt, amps_testing.batches(seed)


class MonitorTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-torch-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def server(self, *args):
        s = amps_testing.Server(self.tmp, *args).start()
        self.addCleanup(s.stop)
        return s

    def attach(self, server, model, opt, scaler, run_id, **kw):
        options = {"spool_dir": os.path.join(self.tmp, "spool-" + run_id)}
        options.update(kw.pop("options", {}))
        mon = amps.attach(model, opt, scaler, run_id=run_id, server=server.address,
                          compute_dtype=torch.bfloat16, options=options, **kw)
        self.addCleanup(mon.close, 0)
        return mon

    def test_every_step_stored_once_with_accumulation(self):
        server = self.server()
        model, opt, data = setup()
        scaler = amps.LossScaler(init_scale=1024.0, growth_interval=5)
        mon = self.attach(server, model, opt, scaler, "acc")
        train(mon, model, opt, scaler, data, 12, micro=2)
        self.assertTrue(mon.close(20), mon.notices())
        reports = server.reports("acc")
        self.assertEqual([r["step"] for r in reports], list(range(12)))
        first = reports[0]
        names = {t["name"] for t in first["tensors"]}
        for expected in ("blocks.0.fc", "blocks.1.qkv.grad", "lnf", "loss",
                         "blocks.0.fc.weight", "wte.weight"):
            self.assertIn(expected, names)
        micro_steps = {t["micro_step"] for t in first["tensors"]
                       if t["name"] == "blocks.0.fc"}
        self.assertEqual(micro_steps, {0, 1})
        # The scale grew after 5 clean steps, as the rule says, and the reports carry it.
        self.assertEqual(reports[4]["loss_scale"], 1024.0)
        self.assertEqual(reports[4]["scale_after"], 2048.0)
        self.assertEqual(reports[5]["loss_scale"], 2048.0)
        self.assertTrue(all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in reports))

    def test_nan_in_a_module_is_the_first_offender_and_the_step_is_skipped(self):
        server = self.server()
        model, opt, data = setup()
        scaler = amps.LossScaler(init_scale=4096.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        mon = self.attach(server, model, opt, scaler, "nan", scheduler=sched)
        inject = {"on": False}

        fc = model.blocks[1].fc
        clean_forward = fc.forward

        def poisoned_forward(x):  # the module itself produces the NaN
            out = clean_forward(x)
            if inject["on"]:
                out = out.clone()
                out[0, 0, 0] = float("nan")
            return out

        fc.forward = poisoned_forward
        params_before = {}

        def on_step(i):
            inject["on"] = i == 3
            if i == 3:
                params_before.update({n: p.detach().clone() for n, p in model.named_parameters()})
            if i == 4:
                for n, p in model.named_parameters():
                    self.assertTrue(torch.equal(p, params_before[n]), n)

        train(mon, model, opt, scaler, data, 6, scheduler=sched, on_step=on_step)
        self.assertTrue(mon.close(20), mon.notices())
        reports = {r["step"]: r for r in server.reports("nan")}
        self.assertEqual(sorted(reports), list(range(6)))
        self.assertTrue(reports[3]["skipped"])
        self.assertTrue(reports[3]["found_inf"])
        self.assertEqual(reports[3]["loss_scale"], 4096.0)
        self.assertEqual(reports[3]["scale_after"], 2048.0)
        self.assertEqual(reports[4]["loss_scale"], 2048.0)
        self.assertFalse(any(reports[s]["skipped"] for s in (0, 1, 2, 4, 5)))
        # The learning rate did not advance over the skipped step.
        self.assertEqual(reports[4]["lr"], reports[3]["lr"])
        self.assertLess(reports[3]["lr"], reports[2]["lr"])
        self.assertEqual(reports[3]["optimizer_steps"], 3)
        shown = server.cli("show", "nan")
        offenders = [(o["step"], o["tensor"], o["role"]) for o in shown["first_offenders"]]
        self.assertEqual(offenders[0], (3, "blocks.1.fc", "activation"), offenders)
        poisoned = [t for t in reports[3]["tensors"] if t["name"] == "blocks.1.fc"]
        self.assertEqual([(t["phase"], t["nan"]) for t in poisoned], [("forward", 1)])

    def test_policy_update_applies_at_exactly_its_step(self):
        server = self.server("--policy", "static-params", "--static-loss-scale", "256",
                             "--policy-lead-steps", "3")
        model, opt, data = setup()
        scaler = amps.LossScaler(init_scale=65536.0)
        mon = self.attach(server, model, opt, scaler, "policy")
        steps = 0
        while steps < 40 and not mon.policy_log:
            train(mon, model, opt, scaler, data, 1)
            steps += 1
            mon.flush(5)
        train(mon, model, opt, scaler, data, 4)
        counters = mon.counters()
        self.assertTrue(mon.close(20), mon.notices())
        self.assertTrue(mon.policy_log, "no PolicyUpdate reached the scaler")
        change = mon.policy_log[0]
        step = change["step"]
        self.assertIsNone(change["refused"])
        self.assertEqual(change["scaler"].get("scale"), 256.0)
        self.assertEqual(counters["policies_applied"], 1)
        reports = {r["step"]: r for r in server.reports("policy")}
        self.assertEqual(reports[step]["loss_scale"], 256.0)
        self.assertEqual(reports[step - 1]["loss_scale"], 65536.0)
        applied = [o for o in reports[step]["policy_outcomes"] if o["applied"]]
        self.assertEqual(len(applied), 1, reports[step]["policy_outcomes"])
        self.assertEqual(scaler.get_scale(), 256.0)

    def test_fp32_fallback_runs_the_module_outside_autocast_from_its_step(self):
        server = self.server("--policy", "headroom", "--fp32-fallback", "--fp32-min-reports", "2",
                             "--fp32-window", "4")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 32),
                                    torch.nn.Linear(32, 1))
        with torch.no_grad():
            model[1].weight.mul_(3e4)  # its outputs reach 1e5 and more: beyond FP16's 65504
        opt = torch.optim.SGD(model.parameters(), lr=1e-9)
        scaler = amps.LossScaler(init_scale=1.0)
        mon = amps.attach(model, opt, scaler, run_id="fp32-fallback", server=server.address,
                          compute_dtype=torch.float16,
                          options={"spool_dir": os.path.join(self.tmp, "spool-fb"),
                                   "sample_full_every": 1})
        self.addCleanup(mon.close, 0)
        dtypes = []  # the dtype of layer 1's output, per step
        model[1].register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
        for i in range(30):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(8, 16) * 10).float().pow(2).mean() * 1e-12
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            mon.flush(5)
            if any(c.get("fp32_layers") for c in mon.policy_log) and i >= 12:
                break
        self.assertTrue(mon.close(20), mon.notices())
        moved = [c for c in mon.policy_log if "1" in c.get("fp32_layers", [])]
        self.assertTrue(moved, mon.policy_log)
        step = moved[0]["step"]
        self.assertEqual(dtypes[step - 1], torch.bfloat16)
        self.assertTrue(all(d == torch.float32 for d in dtypes[step:]), dtypes)
        reports = {r["step"]: r for r in server.reports("fp32-fallback")}
        formats = {s: [t["dtype"] for t in r["tensors"] if t["name"] == "1"]
                   for s, r in reports.items()}
        self.assertEqual(formats[step - 1], ["bf16"])
        self.assertEqual(formats[step], ["fp32"])
        decided = server.cli("show", "fp32-fallback")["policy_updates"]
        self.assertTrue(any("1" in d["fp32_tensors"] and "fp32 fallback" in d["reason"]
                            for d in decided), decided)

    def test_server_killed_and_restarted_loses_nothing(self):
        server = self.server()
        model, opt, data = setup()
        scaler = amps.LossScaler(init_scale=1024.0)
        mon = self.attach(server, model, opt, scaler, "restart",
                          options={"sample_full_every": 3})
        train(mon, model, opt, scaler, data, 8)
        self.assertTrue(mon.flush(20))
        server.kill()
        train(mon, model, opt, scaler, data, 8)  # steps 8..15 spool while the server is gone
        server.start()
        train(mon, model, opt, scaler, data, 8)
        self.assertTrue(mon.close(30), mon.notices())
        steps = [r["step"] for r in server.reports("restart")]
        self.assertEqual(steps, list(range(24)))

    def test_fp32_model_without_a_scaler_reports(self):
        server = self.server()
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        os.environ["AMPSCOPE_SAMPLE_FULL_EVERY"] = "2"  # the agent's options, from the environment
        try:
            mon = amps.attach(model, opt, None, run_id="fp32", server=server.address,
                              master_weights=True,
                              options={"spool_dir": os.path.join(self.tmp, "spool-fp32")})
        finally:
            del os.environ["AMPSCOPE_SAMPLE_FULL_EVERY"]
        self.addCleanup(mon.close, 0)
        for _ in range(5):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            mon.loss(loss)
            loss.backward()
            opt.step()
        self.assertTrue(mon.close(20), mon.notices())
        reports = server.reports("fp32")
        self.assertEqual([r["step"] for r in reports], list(range(5)))
        names = {t["name"]: t for t in reports[0]["tensors"]}
        for expected in ("0", "1", "2", "0.grad", "0.weight", "loss"):
            self.assertIn(expected, names)
        self.assertEqual(reports[0]["loss_scale"], 1.0)
        self.assertGreater(reports[0]["loss"], 0.0)
        self.assertEqual(names["0.weight"]["role"], "weight_grad")
        self.assertEqual(names["0"]["dtype"], "fp32")
        masters = [t for t in reports[0]["tensors"] if t["role"] == "master_weight"]
        self.assertEqual({t["name"] for t in masters}, {"0.weight", "0.bias", "2.weight", "2.bias"})
        self.assertTrue(all(t["phase"] == "step_start" for t in masters))
        levels = [{t["level"] for t in r["tensors"] if t["name"] == "0.grad"} for r in reports]
        self.assertEqual(levels, [{"full"}, {"counts"}, {"full"}, {"counts"}, {"full"}])

    def test_a_failing_hook_becomes_a_notice_and_training_goes_on(self):
        server = self.server()
        model, opt, data = setup()
        scaler = amps.LossScaler(init_scale=1024.0)
        mon = self.attach(server, model, opt, scaler, "guest")

        def broken(*args, **kwargs):
            raise RuntimeError("deliberately broken")

        real = mon._observe
        mon._observe = broken
        train(mon, model, opt, scaler, data, 2)
        mon._observe = real
        train(mon, model, opt, scaler, data, 2)
        self.assertTrue(mon.close(20))
        self.assertEqual([r["step"] for r in server.reports("guest")], [0, 1, 2, 3])
        shown = server.cli("show", "guest")
        text = str(shown)
        self.assertIn("deliberately broken", text)

    def test_the_example_runs(self):
        server = self.server()
        example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                               "examples", "torch_train.py")
        env = dict(os.environ, AMPSCOPE_SPOOL_DIR=os.path.join(self.tmp, "spool-example"))
        r = subprocess.run([sys.executable, example, "--server", server.address, "--steps", "12",
                            "--nan-at", "6"], env=env, capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("all reports acknowledged", r.stdout)
        shown = server.cli("show", "torch-example")
        self.assertEqual(shown["steps"], 12)
        self.assertEqual([(o["step"], o["tensor"]) for o in shown["first_offenders"]],
                         [(6, "blocks.1.fc")])

    def test_local_server_starts_serves_and_cleans_up(self):
        with ampscope.LocalServer(os.environ["AMPSCOPE_SERVER_BIN"]) as server:
            host, port = server.address.rsplit(":", 1)
            self.assertEqual(host, "127.0.0.1")
            self.assertGreater(int(port), 0)
            workdir = server.workdir
            self.assertTrue(os.path.exists(server.db))
        self.assertFalse(os.path.exists(workdir), "its temporary folder is removed")
        self.assertIsNotNone(server.proc.poll(), "the process ended")
        with self.assertRaises(FileNotFoundError):
            env = os.environ.pop("AMPSCOPE_SERVER_BIN")
            old_path = os.environ.get("PATH", "")
            os.environ["PATH"] = self.tmp
            try:
                ampscope.LocalServer()
            finally:
                os.environ["AMPSCOPE_SERVER_BIN"] = env
                os.environ["PATH"] = old_path

    def test_bad_arguments_name_themselves(self):
        model, opt, _ = setup()
        cases = [
            (dict(model=[1]), TypeError, "model"),
            (dict(optimizer="adam"), TypeError, "optimizer"),
            (dict(scaler=object()), TypeError, "scaler"),
            (dict(run_id=""), ValueError, "run_id"),
            (dict(run_id=7), TypeError, "run_id"),
            (dict(compute_dtype=torch.int8), ValueError, "compute_dtype"),
            (dict(options={"sample_full_every": "often"}), ValueError, "sample_full_every"),
            (dict(start_step=-1), ValueError, "start_step"),
            (dict(start_step=True), TypeError, "start_step"),
            (dict(start_step=2.0), TypeError, "start_step"),
            (dict(optimizer_steps=-3), ValueError, "optimizer_steps"),
            (dict(master_weights="yes"), TypeError, "master_weights"),
            # The agent's own rules, as ValueError naming the argument (not AgentError).
            (dict(server="localhost"), ValueError, "server"),
            (dict(server="127.0.0.1:notaport"), ValueError, "server"),
            (dict(server="127.0.0.1:70000"), ValueError, "server"),
            (dict(server=":50051"), ValueError, "server"),
            (dict(server="127.0.0.1:1,localhost"), ValueError, "server: entry 2 of 2"),
            (dict(server=["127.0.0.1:1", 50051]), TypeError, "server"),
            (dict(run_id="a run/with spaces"), ValueError, "run_id"),
            (dict(run_id="r" * 129), ValueError, "run_id"),
        ]
        for overrides, error, word in cases:
            args = dict(model=model, optimizer=opt, scaler=None, run_id="bad")
            args.update(overrides)
            with self.subTest(overrides=overrides):
                with self.assertRaises(error) as ctx:
                    amps.attach(args.pop("model"), args.pop("optimizer"), args.pop("scaler"),
                                **args)
                self.assertIn(word, str(ctx.exception))
        self.assertEqual(amps._monitor._SchedulerPatch._attached, {}, "nothing left attached")
        self.assertEqual(torch.nn.modules.module._global_forward_hooks, {})

    def test_a_list_of_servers_gets_past_one_that_is_down(self):
        server = self.server()
        with socket.socket() as s:  # a port nobody listens on once closed
            s.bind(("127.0.0.1", 0))
            down = "127.0.0.1:%d" % s.getsockname()[1]
        model, opt, data = setup()
        scaler = amps.LossScaler(init_scale=1024.0)
        mon = amps.attach(model, opt, scaler, run_id="list", server=[down, server.address],
                          compute_dtype=torch.bfloat16,
                          options={"spool_dir": os.path.join(self.tmp, "spool-list"),
                                   "connect_timeout_ms": 300, "backoff_initial_ms": 100})
        self.addCleanup(mon.close, 0)
        train(mon, model, opt, scaler, data, 3)
        self.assertTrue(mon.flush(20), mon.notices())
        self.assertTrue(any("cannot connect to " + down in n for n in mon.notices()),
                        mon.notices())
        self.assertTrue(mon.close(20))
        self.assertEqual([r["step"] for r in server.reports("list")], [0, 1, 2])

    def test_numpy_integers_are_steps(self):
        import numpy as np
        server = self.server()
        model, opt, data = setup()
        scaler = amps.LossScaler(init_scale=1024.0)
        mon = self.attach(server, model, opt, scaler, "np", start_step=np.int64(5))
        train(mon, model, opt, scaler, data, 2)
        self.assertTrue(mon.close(20), mon.notices())
        self.assertEqual([r["step"] for r in server.reports("np")], [5, 6])


if __name__ == "__main__":
    unittest.main(verbosity=2)
