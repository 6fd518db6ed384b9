#!/usr/bin/python3
"""An attached object behaves like an unattached one: a model, optimizer, scaler and scheduler
pickle, save and deep-copy while a monitor is attached; a copy is not monitored; the user's own
hooks stay; a script's unclosed file is written at exit; close() leaves torch as it found it.
Also what attach() tells about a setup that cannot work (a GradScaler torch disabled), the
optimizer-step count of a resumed run, and LocalServer's stop/start/close."""

import copy
import io
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amps_testing  # noqa: E402
import ampscope  # noqa: E402
import ampscope.torch as amps  # noqa: E402

_module_hooks = torch.nn.modules.module


class Net(torch.nn.Module):
    """A model class of the script's own (pickled by reference, as users' models are)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.body(x))


SEEN = []


def user_hook(module, inputs, output):
    """A forward hook of the user's (module-level, so a model carrying it still pickles)."""
    SEEN.append(module)


def step(model, opt, scaler, x):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss


def hooks_of(model):
    return [(name, len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for name, m in model.named_modules()]


class AttachedObjectsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="ampscope-objects-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def server(self):
        s = amps_testing.Server(self.tmp).start()
        self.addCleanup(s.stop)
        return s

    def attach(self, server, model, opt, scaler, run_id, **kw):
        mon = amps.attach(model, opt, scaler, run_id=run_id,
                          server=server.address if server else None,
                          options={"spool_dir": os.path.join(self.tmp, "spool-" + run_id)},
                          **kw)
        self.addCleanup(mon.close, 0)
        return mon

    def test_model_saves_and_a_deep_copy_is_not_monitored(self):
        server = self.server()
        torch.manual_seed(0)
        model = Net()
        SEEN.clear()
        handle = model.head.register_forward_hook(user_hook)
        before = hooks_of(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = amps.LossScaler(init_scale=8.0)
        mon = self.attach(server, model, opt, scaler, "objects")
        self.assertEqual(hooks_of(model), before, "nothing is put on the user's modules")
        ema = copy.deepcopy(model)  # an EMA copy made while attached
        for i in range(4):
            step(model, opt, scaler, torch.randn(4, 8))
            ema.train()
            ema(torch.randn(4, 8))  # a training-mode forward of the copy: not a step
            with torch.no_grad():
                for pe, p in zip(ema.parameters(), model.parameters()):
                    pe.mul_(0.9).add_(p, alpha=0.1)
            buf = io.BytesIO()
            torch.save(model, buf)  # the whole model, mid-run
            buf.seek(0)
            loaded = torch.load(buf)
            self.assertEqual(hooks_of(loaded), before)
            loaded(torch.randn(2, 8))  # not monitored either
        # The user's hook ran on every forward: the model's, the EMA copy's, the loaded ones'.
        self.assertEqual(len(SEEN), 12)
        self.assertEqual(mon.optimizer_steps, 4)
        self.assertTrue(mon.close(20), mon.notices())
        reports = server.reports("objects")
        self.assertEqual([r["step"] for r in reports], [0, 1, 2, 3])
        self.assertEqual([r["optimizer_steps"] for r in reports], [1, 2, 3, 4])
        # close() leaves the user's hook and no hook of its own.
        self.assertEqual(hooks_of(model), before)
        self.assertEqual(dict(_module_hooks._global_forward_hooks), {})
        self.assertEqual(dict(_module_hooks._global_forward_pre_hooks), {})
        model(torch.randn(2, 8))
        self.assertEqual(len(SEEN), 13)
        handle.remove()
        self.assertEqual(len(pickle.loads(pickle.dumps(model)).head._forward_hooks), 0)

    def test_optimizer_scaler_and_schedulers_pickle_and_copy_while_attached(self):
        for kind in ("LambdaLR", "StepLR", "OneCycleLR"):
            with self.subTest(scheduler=kind):
                torch.manual_seed(0)
                model = Net()
                opt = torch.optim.AdamW(model.parameters(), lr=0.01)
                sched = {
                    "LambdaLR": lambda: torch.optim.lr_scheduler.LambdaLR(
                        opt, lambda s: 1.0 / (1 + s)),
                    "StepLR": lambda: torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5),
                    "OneCycleLR": lambda: torch.optim.lr_scheduler.OneCycleLR(
                        opt, max_lr=0.1, total_steps=20),
                }[kind]()
                klass = type(sched)
                own_step = klass.__dict__.get("step")
                scaler = amps.LossScaler(init_scale=8.0)
                mon = self.attach(None, model, opt, scaler, "sched-" + kind, scheduler=sched)
                for _ in range(3):
                    step(model, opt, scaler, torch.randn(4, 8))
                    sched.step()
                state = sched.state_dict()
                self.assertNotIn("step", state)
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "scaler": scaler.state_dict(), "scheduler": state}, buf)
                buf.seek(0)
                checkpoint = torch.load(buf)
                self.assertEqual(checkpoint["scheduler"]["last_epoch"], 3)
                pickle.loads(pickle.dumps(opt))
                pickle.loads(pickle.dumps(scaler))
                if kind != "LambdaLR":  # a lambda never pickles, attached or not
                    pickle.loads(pickle.dumps(sched))
                # Copies are not monitored: stepping them counts nothing and moves nothing.
                opt_copy, sched_copy = copy.deepcopy(opt), copy.deepcopy(sched)
                copy.deepcopy(scaler)
                opt_copy.step()
                sched_copy.step()
                self.assertEqual(sched.last_epoch, 3)
                self.assertEqual(mon.optimizer_steps, 3)
                # A scheduler made after attach wraps the attached optimizer's step.
                later = torch.optim.lr_scheduler.StepLR(opt, 1)
                step(model, opt, scaler, torch.randn(4, 8))
                later.step()
                self.assertEqual(mon.optimizer_steps, 4)
                self.assertTrue(mon.close(0) in (True, False))
                self.assertIs(klass.__dict__.get("step"), own_step, "the class is as it was")
                self.assertNotIn("step", vars(sched))

    def test_scaler_copies_while_attached(self):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.cuda.amp.GradScaler(init_scale=8.0)
        self.attach(None, model, opt, scaler, "gradscaler")
        step(model, opt, scaler, torch.randn(4, 8))
        for restored in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
            self.assertFalse(any(getattr(v, "_ampscope_wrapper", False)
                                 for v in vars(restored).values()))
        buf = io.BytesIO()
        torch.save(scaler.state_dict(), buf)

    def test_a_scripts_unclosed_file_is_written_at_exit(self):
        # The script keeps its last `loss` as a global: its autograd graph holds the monitor's
        # gradient hooks, and through a scheduler's lambda the script's globals held the graph,
        # a cycle through torch's C++ graph that Python cannot collect: the file object was
        # never finalised and its buffer never written.
        script = os.path.join(self.tmp, "script.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""\
                import sys
                import torch
                import ampscope.torch as amps

                log = open(sys.argv[1], "w")
                torch.manual_seed(0)
                model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                            torch.nn.Linear(8, 1))
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
                scaler = amps.LossScaler(init_scale=8.0)
                if sys.argv[2] == "attached":
                    mon = amps.attach(model, opt, scaler, run_id="exit", scheduler=sched,
                                      options={"spool_dir": sys.argv[3]})
                for i in range(4):
                    opt.zero_grad()
                    loss = model(torch.full((4, 4), 0.5)).pow(2).mean()
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                    sched.step()
                    print(f"step {i} loss {loss.item():.4f}", file=log)
                """))
        written = {}
        for mode in ("plain", "attached"):
            out = os.path.join(self.tmp, mode + ".log")
            r = subprocess.run([sys.executable, script, out, mode,
                                os.path.join(self.tmp, "spool-exit")],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                written[mode] = f.read()
        self.assertEqual(written["plain"].count("\n"), 4)
        self.assertEqual(written["attached"], written["plain"])

    @unittest.skipIf(torch.cuda.is_available(), "torch disables a CUDA GradScaler only "
                     "without CUDA")
    def test_a_gradscaler_torch_disabled_is_named(self):
        server = self.server()
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.cuda.amp.GradScaler()  # torch turns it off here: no CUDA
        self.assertFalse(scaler.is_enabled())
        with self.assertWarns(RuntimeWarning):
            mon = self.attach(server, model, opt, scaler, "disabled")
        self.assertEqual(len(mon.warnings), 1, mon.warnings)
        self.assertIn("LossScaler", mon.warnings[0])
        self.assertIn("not skipped", mon.warnings[0])
        for _ in range(2):
            step(model, opt, scaler, torch.randn(4, 8))
        notices = mon.notices()
        self.assertEqual(sum("GradScaler is disabled" in n for n in notices), 1, notices)
        self.assertTrue(mon.close(20), notices)
        self.assertIn("GradScaler is disabled", str(server.cli("show", "disabled")))
        # A LossScaler, or no scaler at all, says nothing.
        model2 = Net()
        opt2 = torch.optim.SGD(model2.parameters(), lr=0.01)
        self.assertEqual(self.attach(None, model2, opt2, amps.LossScaler(), "quiet").warnings, [])

    def test_a_resumed_run_continues_its_optimizer_steps(self):
        server = self.server()
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = amps.LossScaler(init_scale=8.0)
        mon = self.attach(server, model, opt, scaler, "resume-a", start_step=10)
        step(model, opt, scaler, torch.randn(4, 8))
        mon.close(20)
        mon = self.attach(server, model, opt, scaler, "resume-b", start_step=10,
                          optimizer_steps=7)
        step(model, opt, scaler, torch.randn(4, 8))
        mon.close(20)
        a = server.reports("resume-a")
        b = server.reports("resume-b")
        self.assertEqual([(r["step"], r["optimizer_steps"]) for r in a], [(10, 11)])
        self.assertEqual([(r["step"], r["optimizer_steps"]) for r in b], [(10, 8)])

    def test_local_server_starts_again_after_stop(self):
        server = ampscope.LocalServer(os.environ["AMPSCOPE_SERVER_BIN"]).start()
        try:
            address, db = server.address, server.db
            mon = amps.attach(Net(), None, None, run_id="kept", server=address,
                              options={"spool_dir": os.path.join(self.tmp, "spool-kept")})
            with mon.step(0):
                pass
            self.assertTrue(mon.close(20))
            server.stop()
            self.assertTrue(os.path.exists(db), "stop() keeps the store")
            server.start()
            self.assertEqual(server.address, address)
            r = subprocess.run([os.environ["AMPSCOPE_CLI_BIN"], "show", "kept", "--server",
                                server.address, "--json"], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
        finally:
            server.close()
        self.assertFalse(os.path.exists(server.workdir), "close() removes the temporary folder")
        with self.assertRaises(RuntimeError):
            server.start()


if __name__ == "__main__":
    unittest.main(verbosity=2)
