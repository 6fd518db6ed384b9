#!/usr/bin/env python3
"""Closed-loop policies compared over several seeds (docs/policy.md): loss scaling, and the
per-layer precision of FP8/FP4 runs.

    policy_eval.py --build-dir BUILD --out-dir DIR [--profile smoke|short|full] [--fragment F]
                   [--seeds N] [--first-seed K] [--jobs N] [--scenarios S,S...]

Runs ampscope-train (the agent attached) against ampscope-server under every scenario (or those
--scenarios names) with the policies the profile gives it, on several seeds; on one seed every
policy trains from the same weights on the same batches, so runs are compared seed by seed
(paired). The loss-scale scenarios train in amp-fp16:

  policies   gradscaler     local dynamic scaler (PyTorch GradScaler semantics), server observe
             hysteresis     local Megatron-style scaler, server observe
             static         a fixed scale (2^16, or the scenario's initial scale), server observe
             headroom       server --policy headroom (the local dynamic scaler as safety net)
             headroom-fp32  the same with --fp32-fallback
             headroom-live  headroom without lockstep: the live, asynchronous loop
  scenarios  defaults, init-2p24 (initial scale 2^24), grad-shrink (gradients shrinking
             geometrically over training), overflow-spikes (a logits-gradient overflow every K
             steps), activation-overflow (an overflow in the forward activation h1.attn.scores
             every K steps: Inf in FP16, finite once h1.attn.core computes in FP32), long
             (>= 5,000 steps on a real English text, the Jargon File from Debian's jargon-text)

The fp-recipes scenario trains on the same Jargon File under FP8/FP4 recipes, with the trainer's
default static loss scale 1:

  policies   bf16           --precision amp-bf16, the reference, server observe
             mxfp8, nvfp4   the recipe on every linear layer's GEMMs, server observe
             mxfp8-policy,  the recipe with the server's per-layer precision (--gemm-precision):
             nvfp4-policy   the engine moves a layer's GEMMs to BF16 when its quantisers keep
                            underflowing, saturating or losing SQNR, and back when what-if
                            counts of the recipe stay clean

Every policy but headroom-live runs with the agent option policy_lockstep=on: before step s the
agent waits for the server's Ack of step s-1, so the server's decisions take effect at the same
steps on every run and the figures regenerate exactly. headroom-live, on the long scenario,
shows how far the live loop strays from that.

Every run but the long and fp-recipes ones takes full statistics of every activation and weight
gradient every step (--sample-full-every 1; long, fp-recipes: the agent's default sampling,
which reports every quantiser on every step), read back from the server with
ampscope_policy_eval_extract. A step's underflow ratio is the share of the gradient values that
pass through FP16 which are lost there at the scale in use (the extractor says how each gradient
is counted once). A skip is avoidable when no overflow was injected at that step. fp-recipes
compares final validation losses to bf16's on the same seed, counts the layer-steps each arm ran
in its recipe (StepReport.bf16_gemms), and lists every layer the policy moved with the reason
the server gave.

Writes DIR/runs.json (every figure of every run, the per-scenario summaries, the derived
figures), DIR/table.md (summary first, then the goals, then per-seed rows; then fp-recipes'
goals and tables), DIR/*.png
(gnuplot), the per-step series (*.dat in the series folder of DIR's work folder) and, with
--fragment, the flat results keys for bench/merge_results.py. Exit status 1 when a run did not
complete (every run is still tried), 2 on a setup problem (binaries, corpus). Only the standard
library: it runs under Debian 12's /usr/bin/python3.
"""

import argparse
import concurrent.futures
import gzip
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

LOSS_SCALE_SCENARIOS = ("defaults", "init-2p24", "grad-shrink", "overflow-spikes",
                        "activation-overflow", "long")
FP_SCENARIO = "fp-recipes"
SCENARIOS = LOSS_SCALE_SCENARIOS + (FP_SCENARIO,)
HEADROOM_LOCKSTEP = ("headroom", "headroom-fp32")  # the deterministic server policies
STATIC_SCALE = 65536.0  # the static policy's fixed scale: GradScaler's initial scale
INIT_TOO_HIGH = 16777216.0  # 2^24
UNDERFLOW_STEP_THRESHOLD = 0.01  # "steps whose gradient underflow ratio exceeds 1%"
OVERFLOW_ACTIVATION = "h1.attn.scores"  # computed by h1.attn.core: needs >= 2 layers

TARGET_SKIP_REDUCTION = 10.0
TARGET_UNDERFLOW_REDUCTION = 2.0
TARGET_VAL_LOSS_DELTA = 0.0  # headroom - gradscaler, final validation loss, mean over seeds
TARGET_SKIPS_AFTER_DECISION = 0

# Two-sided 95% quantiles of Student's t, t(0.975; df), for df = 1..30 (beyond: 1.96).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

# fp-recipes: each policy's --precision; the gaps are to bf16 on the same seed.
FP_PRECISION = {"bf16": "amp-bf16", "mxfp8": "mxfp8", "nvfp4": "nvfp4", "mxfp8-policy": "mxfp8",
                "nvfp4-policy": "nvfp4"}
FP_POLICIES = tuple(FP_PRECISION)
FP_REFERENCE = "bf16"
FP_RECIPES = ("mxfp8", "nvfp4")  # each with its "-policy" arm
# Measured more often than the trainer's default (16): the policy decides on the mean of 16
# measured steps, so every 4th step lets it decide within 64 steps (docs/policy.md).
FP_LOSS_COST_EVERY = 4
# The linear layers of each transformer block whose GEMMs a recipe quantises (docs/trainer.md,
# "FP8 and FP4 recipes"): the unit the per-layer precision moves.
GEMMS_PER_BLOCK = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
# "Closes most of the gap while keeping most GEMMs in the recipe": the policy arm's paired gap to
# bf16 is at most half the recipe's, with more than half of the layer-steps in the recipe.
TARGET_GAP_CLOSED_SHARE = 0.5
TARGET_LOW_PRECISION_GEMM_SHARE = 0.5

# Model, seeds, steps and policies per profile. smoke: the ctest (a tiny model, two seeds, about
# a minute). short: ./run bench, about 25 minutes on 2 cores for the loss-scale scenarios and
# 17 more for fp-recipes (999 s measured with other builds running alongside). full: longer.
SMALL_MODEL = ["--width", "64", "--heads", "2", "--layers", "2", "--context", "64", "--batch", "8"]
LOCAL_AND_HEADROOM = ("gradscaler", "hysteresis", "static", "headroom")
# The short profile's 25 minutes leave static out where it only repeats GradScaler's start.
DYNAMIC_AND_HEADROOM = ("gradscaler", "hysteresis", "headroom")
FALLBACK = ("gradscaler", "headroom", "headroom-fp32")
LONG = ("gradscaler", "headroom", "headroom-live")
PROFILES = {
    "smoke": {
        "model": ["--width", "32", "--heads", "2", "--layers", "2", "--context", "32",
                  "--batch", "4"],
        "seeds": 2,
        "scenarios": {"defaults": (30, LOCAL_AND_HEADROOM), "init-2p24": (30, LOCAL_AND_HEADROOM),
                      "grad-shrink": (30, LOCAL_AND_HEADROOM),
                      "overflow-spikes": (30, LOCAL_AND_HEADROOM + ("headroom-fp32",)),
                      "activation-overflow": (40, FALLBACK), "long": (60, LONG),
                      FP_SCENARIO: (24, FP_POLICIES)},
        "spike_every": 10,
        "activation_overflow_every": 4,
        "eval_batches": 2,
        # A tiny run cannot show a costly layer under the server's defaults: a loss cost of
        # any positive mean over 2 measured steps (every 4th step) moves a layer, so that the
        # loop is exercised within 24 steps; the counts' limits (which decide for layers without
        # a loss cost) as strict: every nvfp4 GEMM input loses about 5% of its values to zero.
        "gemm_server_args": ["--gemm-min-loss-cost", "1e-12", "--gemm-loss-cost-reports", "2",
                             "--gemm-loss-cost-z", "0", "--gemm-max-underflow", "0.03",
                             "--gemm-window", "4", "--gemm-min-reports", "2"],
        "fp_eval_batches": 2,
    },
    "short": {
        "model": SMALL_MODEL,
        "seeds": 5,
        "scenarios": {"defaults": (300, DYNAMIC_AND_HEADROOM),
                      "init-2p24": (300, LOCAL_AND_HEADROOM),
                      "grad-shrink": (600, DYNAMIC_AND_HEADROOM),
                      "overflow-spikes": (400, LOCAL_AND_HEADROOM + ("headroom-fp32",)),
                      "activation-overflow": (400, FALLBACK), "long": (5000, LONG),
                      FP_SCENARIO: (2000, FP_POLICIES)},
        "spike_every": 50,
        "activation_overflow_every": 5,
        "eval_batches": 8,
        "gemm_server_args": [],
        "fp_eval_batches": 32,
        "fp_seeds": 3,
    },
    "full": {
        "model": SMALL_MODEL,
        "seeds": 8,
        "scenarios": {"defaults": (2000, LOCAL_AND_HEADROOM),
                      "init-2p24": (2000, LOCAL_AND_HEADROOM),
                      "grad-shrink": (3000, LOCAL_AND_HEADROOM),
                      "overflow-spikes": (2000, LOCAL_AND_HEADROOM + ("headroom-fp32",)),
                      "activation-overflow": (2000, FALLBACK), "long": (10000, LONG),
                      FP_SCENARIO: (5000, FP_POLICIES)},
        "spike_every": 100,
        "activation_overflow_every": 5,
        "eval_batches": 16,
        "gemm_server_args": [],
        "fp_eval_batches": 64,
        "fp_seeds": 5,
    },
}
# fp-recipes: fp_seeds (default: the profile's seeds) and fp_eval_batches validation batches at
# the end (paired gaps of a few hundredths need more than eval_batches); gemm_server_args go to
# the per-layer precision's server. nvfp4 steps take about 8x amp-bf16's on this CPU emulation
# (46 against 6 ms for the small model on one thread), hence fewer seeds than the others.
# activation_overflow_every: the server's FP32 fallback recommends a tensor that overflowed in
# at least 4 of its last 16 reported steps (--fp32-min-reports, --fp32-window), so an overflow
# every 5th step or more often: an activation that has outgrown FP16 overflows again and again.

# The shrinking-gradients schedule: the gradient multiplier moves geometrically from 1 at the
# first step to this at the last.
GRAD_SHRINK_END = 2.0 ** -20

# The long scenario's text: the Jargon File as Debian's jargon-text ships it.
JARGON_PACKAGE = "jargon-text"
JARGON_GZ = "usr/share/doc/jargon-text/jargon.txt.gz"


class SetupError(Exception):
    pass


def steps_of(profile, scenario):
    return profile["scenarios"][scenario][0]


def policies_of(profile, scenario):
    return profile["scenarios"][scenario][1]


def scenario_flags(scenario, policy, profile, corpus):
    flags = ["--steps", str(steps_of(profile, scenario))]
    if scenario == "init-2p24" and policy != "static":  # static: its one scale, policy_flags
        flags += ["--init-scale", repr(INIT_TOO_HIGH)]
    elif scenario == "grad-shrink":
        flags += ["--grad-shrink", "1", "--grad-shrink-end", repr(GRAD_SHRINK_END)]
    elif scenario == "overflow-spikes":
        flags += ["--inject-overflow-every", str(profile["spike_every"])]
    elif scenario == "activation-overflow":
        # Forward activations counted too: with the default count roles the first offender is
        # the loss, which no layer computes, and the agent refuses such a recommendation.
        flags += ["--inject-overflow-tensor", OVERFLOW_ACTIVATION,
                  "--inject-overflow-every", str(profile["activation_overflow_every"]),
                  "--sample-count-roles", "activation,activation_grad,weight_grad,loss"]
    elif scenario in ("long", FP_SCENARIO):
        flags += ["--data", corpus]
    return flags


def injected_steps(scenario, profile):
    k = {"overflow-spikes": profile["spike_every"],
         "activation-overflow": profile["activation_overflow_every"]}.get(scenario)
    if k is None:
        return set()
    return set(range(k, steps_of(profile, scenario), k))  # the trainer's K, 2K, ...


def precision_of(policy):
    return FP_PRECISION.get(policy, "amp-fp16")


def policy_flags(policy, scenario):
    if policy in FP_PRECISION:
        # The trainer's default for these modes: a static loss scale of 1. The loss cost every
        # FP_LOSS_COST_EVERY-th step, the recipe arms' too (they report what the policy arms
        # would judge; it changes nothing they compute).
        flags = ["--agent", "policy_lockstep=on"]
        if policy != FP_REFERENCE:
            flags += ["--loss-cost-every", str(FP_LOSS_COST_EVERY)]
        return flags
    if policy == "gradscaler":
        flags = ["--scaler", "dynamic"]
    elif policy == "hysteresis":
        flags = ["--scaler", "hysteresis"]
    elif policy == "static":
        scale = INIT_TOO_HIGH if scenario == "init-2p24" else STATIC_SCALE
        flags = ["--scaler", "static", "--init-scale", repr(scale)]
    else:
        flags = ["--scaler", "dynamic"]  # headroom*: the local dynamic scaler is the safety net
    if policy != "headroom-live":
        flags += ["--agent", "policy_lockstep=on"]
    return flags


# Full statistics of every gradient every step where underflow is a figure. The long scenario
# keeps the agent's default sampling (counts every step, full statistics every 100 steps and
# around events), as a long run would, at a fifth less time per step. So does fp-recipes: the
# per-layer precision reads the quantisers, which the agent reports on every step it counts
# (every step by default) whatever the tensors' sampling level.
FULL_SAMPLING = ["--sample-full-every", "1", "--sample-full-roles", "activation_grad,weight_grad"]


def sampling_flags(scenario):
    return [] if scenario in ("long", FP_SCENARIO) else FULL_SAMPLING


def server_for(policy):
    return {"headroom": "headroom", "headroom-live": "headroom",
            "headroom-fp32": "headroom-fp32", "mxfp8-policy": "gemm",
            "nvfp4-policy": "gemm"}.get(policy, "observe")


SERVER_ARGS = {
    "observe": ["--policy", "observe"],
    "headroom": ["--policy", "headroom"],
    "headroom-fp32": ["--policy", "headroom", "--fp32-fallback"],
    # The per-layer precision decides under static-params or headroom, not observe; static-params
    # pushes the loss scale these runs already use (1), so the scale stays that of the recipe arms.
    "gemm": ["--policy", "static-params", "--static-loss-scale", "1", "--gemm-precision"],
}


def jargon_corpus(out_dir, build_dir):
    """The Jargon File as plain text in OUT_DIR/corpus: from the installed package, else from
    `apt-get download` + `dpkg-deb -x` into the build tree (images that exclude /usr/share/doc
    from installs)."""
    dest = os.path.join(out_dir, "corpus", "jargon.txt")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    unpacked = os.path.join(build_dir, "bench", "policy_eval", "jargon-text")
    for gz in ("/" + JARGON_GZ, os.path.join(unpacked, "root", JARGON_GZ)):
        if os.path.exists(gz):
            break
    else:
        gz = os.path.join(unpacked, "root", JARGON_GZ)
        why = _download_jargon(unpacked)
        if why:
            raise SetupError(
                f"the long scenario trains on the Jargon File, and neither /{JARGON_GZ} "
                f"(apt-get install {JARGON_PACKAGE}) nor the package unpacked into {unpacked} "
                f"is there: {why}")
    with gzip.open(gz, "rb") as f, open(dest, "wb") as out:
        shutil.copyfileobj(f, out)
    return dest


def _download_jargon(unpacked):
    """An error message, or None once UNPACKED/root holds the package's files."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    shutil.rmtree(unpacked, ignore_errors=True)
    os.makedirs(unpacked)
    p = subprocess.run(["apt-get", "download", JARGON_PACKAGE], cwd=unpacked, text=True,
                       capture_output=True)
    debs = [f for f in os.listdir(unpacked) if f.endswith(".deb")]
    if p.returncode != 0 or not debs:
        return f"apt-get download {JARGON_PACKAGE} failed: {p.stderr.strip() or p.returncode}"
    p = subprocess.run(["dpkg-deb", "-x", os.path.join(unpacked, debs[0]),
                        os.path.join(unpacked, "root")], text=True, capture_output=True)
    if p.returncode != 0:
        return f"dpkg-deb -x {debs[0]} failed: {p.stderr.strip()}"
    if not os.path.exists(os.path.join(unpacked, "root", JARGON_GZ)):
        return f"{debs[0]} has no {JARGON_GZ}"
    return None


class Server:
    """One ampscope-server on a free loopback port with its own store."""

    def __init__(self, binary, name, work, extra):
        self.dir = os.path.join(work, "server-" + name)
        os.makedirs(self.dir, exist_ok=True)
        ready = os.path.join(self.dir, "ready.json")
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "",
             "--http-listen", "127.0.0.1:0", "--db",
             os.path.join(self.dir, "store.db"), "--sync", "normal", "--ready-file", ready]
            + SERVER_ARGS[name] + extra,
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ampscope-server ({name}) exited with {self.proc.returncode};"
                                   f" see {self.log.name}")
            if os.path.exists(ready) and os.path.getsize(ready) > 0:
                try:
                    with open(ready) as f:
                        self.address = json.load(f)["grpc"]
                    return
                except (ValueError, KeyError):
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"ampscope-server ({name}) did not become ready; see {self.log.name}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def per_10k(count, steps):
    return 10000.0 * count / steps if steps else None


def first_decision(decisions, reports):
    """The first step the server's policy governed: the effective step of its first stored
    decision, or, when the server returned only its latest decisions, the first step at which
    the agent applied one."""
    if decisions["decisions"] and decisions["complete"]:
        return min(d["effective_from_step"] for d in decisions["decisions"])
    applied = [r["step"] for r in reports if r["policy_applied"]]
    return min(applied) if applied else None


def fp32_figures(log, decisions, skipped):
    """When layers went to FP32: the decision that asked for it and the first step the trainer
    computed them so (its log), the layers, and the skips before and after that step."""
    asked = [d for d in decisions["decisions"] if d["fp32_tensors"]]
    from_step = next((r["step"] for r in log if r.get("fp32_layers")), None)
    layers = sorted({l for r in log for l in r.get("fp32_layers", [])})
    return {
        "fp32_decision_step": asked[0]["effective_from_step"] if asked else None,
        "fp32_tensors": asked[0]["fp32_tensors"] if asked else [],
        "fp32_from_step": from_step,
        "fp32_layers": layers,
        "skipped_before_fp32": None if from_step is None else sum(1 for s in skipped
                                                                  if s < from_step),
        "skipped_after_fp32": None if from_step is None else sum(1 for s in skipped
                                                                 if s >= from_step),
    }


def summarise(log, reports, decisions, injected, wall_s, steps):
    """The per-run figures, from the trainer's log (losses, skips, step times, FP32 layers) and
    the server's reports and decisions; and the per-step series."""
    by_step = {r["step"]: r for r in reports}
    ratios = []
    series = []
    cum_skipped = 0
    for row in log:
        s = row["step"]
        cum_skipped += 1 if row["skipped"] else 0
        rep = by_step.get(s)
        ratio = None
        if rep is not None and rep["grad_numel"] > 0 and rep["grad_unmeasured"] == 0:
            ratio = (rep["grad_underflow"] + rep["grad_zeros16"]) / rep["grad_numel"]
            ratios.append(ratio)
        series.append((s, row["loss_scale"], cum_skipped, ratio, row["step_time_s"]))
    skipped = [r["step"] for r in log if r["skipped"]]
    avoidable = [s for s in skipped if s not in injected]
    n = len(log)
    first = first_decision(decisions, reports)
    last = log[-1] if log else {}
    vals = [r.get("val_loss") for r in log if r.get("val_loss") is not None]
    m = {
        "steps": n,
        "steps_wanted": steps,
        "reports": len(reports),
        "steps_measured": len(ratios),
        "skipped": len(skipped),
        "skipped_per_10k": per_10k(len(skipped), n),
        "avoidable_skipped": len(avoidable),
        "avoidable_per_10k": per_10k(len(avoidable), n),
        "avoidable_skipped_steps": avoidable,
        "injected": len(injected),
        "decisions": len(decisions["decisions"]),
        "first_decision_step": first,
        "avoidable_after_first_decision":
            None if first is None else sum(1 for s in avoidable if s >= first),
        "steps_underflow_gt_1pct": sum(1 for r in ratios if r > UNDERFLOW_STEP_THRESHOLD),
        "mean_underflow_ratio": sum(ratios) / len(ratios) if ratios else None,
        "final_train_loss": last.get("loss"),
        "final_val_loss": vals[-1] if vals else None,
        "policy_updates": sum(len(r["policy_applied"]) for r in reports),
        "scale_changes": sum(1 for r in log if r["scale_after"] != r["loss_scale"])
        + sum(1 for a, b in zip(log, log[1:]) if b["loss_scale"] != a["scale_after"]),
        "final_scale": last.get("scale_after"),
        "train_s": sum(r["step_time_s"] for r in log),
        "wall_s": wall_s,
    }
    m.update(fp32_figures(log, decisions, skipped))
    return m, series


def completed(m):
    """Every step trained and stored, and a final validation loss. Steps whose underflow could
    not be counted (steps_measured) are left out of the underflow figures, not a failure."""
    v = m.get("final_val_loss")
    return (m.get("error") is None and m["steps"] == m["steps_wanted"]
            and m["reports"] == m["steps_wanted"] and v is not None and math.isfinite(v))


def run_id(scenario, policy, seed):
    return f"{scenario}.{policy}.s{seed}"


def run_one(ctx, scenario, policy, seed):
    """One training run and its figures; the trainer's log stays on disk (train.jsonl)."""
    args, profile, servers, work = ctx["args"], ctx["profile"], ctx["servers"], ctx["work"]
    rid = run_id(scenario, policy, seed)
    run_dir = os.path.join(work, "runs", rid)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    log_path = os.path.join(run_dir, "train.jsonl")
    steps = steps_of(profile, scenario)
    server = servers[server_for(policy)]
    fp = scenario == FP_SCENARIO
    eval_batches = profile["fp_eval_batches"] if fp else profile["eval_batches"]
    cmd = ([args.train_bin, "--precision", precision_of(policy), "--seed", str(seed),
            "--threads", "1", "--eval-every", "0", "--eval-batches", str(eval_batches), "--quiet",
            "--log-json", log_path] + profile["model"]
           + scenario_flags(scenario, policy, profile, ctx["corpus"])
           + policy_flags(policy, scenario)
           + ["--server", server.address, "--run-id", rid,
              "--spool-dir", os.path.join(run_dir, "spool")] + sampling_flags(scenario))
    with open(os.path.join(run_dir, "command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    started = time.monotonic()
    with open(os.path.join(run_dir, "train.out"), "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    wall_s = time.monotonic() - started
    error = None if rc == 0 else f"ampscope-train exited with {rc}"
    reports_path = os.path.join(run_dir, "reports.jsonl")
    decisions_path = os.path.join(run_dir, "decisions.json")
    quantizers_path = os.path.join(run_dir, "quantizers.json")
    if error is None:
        rc = subprocess.call([args.extract_bin, "--server", server.address, "--run-id", rid,
                              "--out", reports_path, "--decisions-out", decisions_path]
                             + (["--quantizers-out", quantizers_path] if fp else []))
        if rc != 0:
            error = f"ampscope_policy_eval_extract exited with {rc}"
    log = read_jsonl(log_path) if os.path.exists(log_path) else []
    reports = read_jsonl(reports_path) if os.path.exists(reports_path) else []
    decisions = {"complete": True, "decisions": []}
    if os.path.exists(decisions_path):
        with open(decisions_path) as f:
            decisions = json.load(f)
    m, series = summarise(log, reports, decisions, injected_steps(scenario, profile), wall_s,
                          steps)
    if fp:
        quantizers = []
        if os.path.exists(quantizers_path):
            with open(quantizers_path) as f:
                quantizers = json.load(f)
        m.update(fp_figures(policy, log, reports, decisions, gemm_layers(profile), quantizers))
        m["agent_thread_share"] = agent_thread_share(os.path.join(run_dir, "train.out"))
        write_fp_series(os.path.join(work, "series", f"{rid}.fp.dat"), log, reports)
    m["seed"] = seed
    m["error"] = error
    m["completed"] = completed(m)
    if not m["completed"] and m["error"] is None:
        m["error"] = (f"incomplete: {m['steps']} steps logged, {m['reports']} reports stored "
                      f"of {steps}; final val loss {m['final_val_loss']}")
    with open(os.path.join(work, "series", f"{rid}.dat"), "w") as f:
        f.write("# step loss_scale cumulative_skipped underflow_ratio step_time_s\n")
        for s, scale, cum, ratio, t in series:
            f.write(f"{s} {scale} {cum} {'NaN' if ratio is None else repr(ratio)} {t}\n")
    _progress(ctx, scenario, policy, seed, m)
    return m


def _progress(ctx, scenario, policy, seed, m):
    mean = m["mean_underflow_ratio"]
    if scenario == FP_SCENARIO:
        share = m["low_precision_gemm_share"]
        with ctx["print_lock"]:
            print(f"  {scenario:19} {policy:13} seed {seed}  val {fmt(m['final_val_loss'], '.4f')}"
                  f"  low-precision GEMM share {fmt(share, '.3f')}  layer moves "
                  f"{len(m['layer_moves'])}  {m['wall_s']:.1f} s"
                  f"{'' if m['completed'] else '  FAILED: ' + m['error']}", flush=True)
        return
    with ctx["print_lock"]:
        print(f"  {scenario:19} {policy:13} seed {seed}  skipped {m['skipped']:4} (avoidable "
              f"{m['avoidable_skipped']:4})  underflow "
              f"{'n/a' if mean is None else f'{100 * mean:.3f}%':>8}  val "
              f"{fmt(m['final_val_loss'], '.4f')}  updates {m['policy_updates']:3}  "
              f"{m['wall_s']:.1f} s{'' if m['completed'] else '  FAILED: ' + m['error']}",
              flush=True)


def throughput_ratio(ctx, scenario, seed, fp32_run):
    """Steps per second of headroom-fp32 from its first FP32 step to the end, over headroom's
    (no fallback) on the same seed, over the steps neither run skipped (a skipped step does not
    run the optimizer): the price of computing those layers in FP32. From the trainers'
    per-step times (the two runs ran side by side)."""
    start = fp32_run["fp32_from_step"]
    if start is None:
        return None
    logs = {}
    for policy in ("headroom", "headroom-fp32"):
        path = os.path.join(ctx["work"], "runs", run_id(scenario, policy, seed), "train.jsonl")
        if not os.path.exists(path):
            return None
        logs[policy] = {r["step"]: r for r in read_jsonl(path) if r["step"] >= start}
    steps = [s for s, r in logs["headroom"].items()
             if not r["skipped"] and s in logs["headroom-fp32"]
             and not logs["headroom-fp32"][s]["skipped"]]
    times = {p: sum(logs[p][s]["step_time_s"] for s in steps) for p in logs}
    if not times["headroom-fp32"]:
        return None
    return times["headroom"] / times["headroom-fp32"]


def run_pair(ctx, scenario, seed, workers):
    """headroom and headroom-fp32 on one seed at the same time, so that the throughput they are
    compared on is measured under the same load."""
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        futures = {p: ex.submit(run_one, ctx, scenario, p, seed)
                   for p in ("headroom", "headroom-fp32")}
        runs = {p: f.result() for p, f in futures.items()}
    runs["headroom-fp32"]["throughput_ratio_after_fp32"] = throughput_ratio(
        ctx, scenario, seed, runs["headroom-fp32"])
    return runs


def run_everything(ctx, seeds, jobs):
    """Every run of the chosen scenarios, `jobs` at a time, longest scenario first; the fallback
    pairs last, each pair alone on the machine. seeds[scenario] lists its seeds. Returns
    results[scenario][policy][seed] and the time each scenario took."""
    profile = ctx["profile"]
    scenarios = list(seeds)
    results = {s: {p: {} for p in policies_of(profile, s)} for s in scenarios}
    run_seconds = {s: 0.0 for s in scenarios}
    pair = ("headroom", "headroom-fp32")
    paired = [("activation-overflow", seed) for seed in seeds.get("activation-overflow", [])
              if set(pair) <= set(policies_of(profile, "activation-overflow"))]
    pooled = [(s, p, seed)
              for s in sorted(scenarios, key=lambda s: -steps_of(profile, s))
              for p in policies_of(profile, s) for seed in seeds[s]
              if not ((s, seed) in paired and p in pair)]

    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        futures = {ex.submit(run_one, ctx, s, p, seed): (s, p, seed) for s, p, seed in pooled}
        for f in concurrent.futures.as_completed(futures):
            s, p, seed = futures[f]
            results[s][p][seed] = f.result()
            run_seconds[s] += results[s][p][seed]["wall_s"]
    for s, seed in paired:
        for p, m in run_pair(ctx, s, seed, min(2, jobs)).items():
            results[s][p][seed] = m
            run_seconds[s] += m["wall_s"]
    # Runs of all scenarios share the workers, so a scenario's wall time is its share of the
    # whole by run seconds.
    wall = time.monotonic() - ctx["t0"]
    total = sum(run_seconds.values()) or 1.0
    times = {s: {"runs": sum(len(results[s][p]) for p in results[s]), "run_s": run_seconds[s],
                 "wall_s": wall * run_seconds[s] / total}
             for s in scenarios}
    return results, times


# ---- statistics ---------------------------------------------------------------------------

def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def mean_ci95(xs):
    """Mean and Student-t 95% confidence interval [low, high] of paired differences."""
    xs = [x for x in xs if x is not None]
    n = len(xs)
    if n == 0:
        return None, None
    m = sum(xs) / n
    if n < 2:
        return m, None
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    half = t * sd / math.sqrt(n)
    return m, [m - half, m + half]


def val_deltas(results, scenario, policy, reference="gradscaler"):
    """Per seed: final val loss of `policy` minus `reference`'s on the same seed."""
    runs = results[scenario]
    if policy == reference or reference not in runs or policy not in runs:
        return {}
    out = {}
    for seed, m in runs[policy].items():
        g = runs[reference].get(seed)
        if g and m["final_val_loss"] is not None and g["final_val_loss"] is not None:
            out[seed] = m["final_val_loss"] - g["final_val_loss"]
    return out


def summarise_scenario(results, scenario):
    out = {}
    for policy, runs in results[scenario].items():
        ms = list(runs.values())
        after = [m["avoidable_after_first_decision"] for m in ms]
        deltas = val_deltas(results, scenario, policy)
        d_mean, d_ci = mean_ci95(list(deltas.values()))
        out[policy] = {
            "seeds": sorted(runs),
            "steps": ms[0]["steps_wanted"] if ms else None,
            "skipped": mean(m["skipped"] for m in ms),
            "skipped_per_10k": mean(m["skipped_per_10k"] for m in ms),
            "skipped_total": sum(m["skipped"] for m in ms),
            "avoidable_skipped": mean(m["avoidable_skipped"] for m in ms),
            "avoidable_per_10k": mean(m["avoidable_per_10k"] for m in ms),
            "avoidable_total": sum(m["avoidable_skipped"] for m in ms),
            "avoidable_after_first_decision_total":
                None if all(a is None for a in after) else sum(a or 0 for a in after),
            "mean_underflow_ratio": mean(m["mean_underflow_ratio"] for m in ms),
            "steps_underflow_gt_1pct": mean(m["steps_underflow_gt_1pct"] for m in ms),
            "final_val_loss": mean(m["final_val_loss"] for m in ms),
            "val_loss_delta_vs_gradscaler": d_mean,
            "val_loss_delta_ci95": d_ci,
            "val_loss_deltas": deltas,
            "policy_updates": mean(m["policy_updates"] for m in ms),
            "wall_s": mean(m["wall_s"] for m in ms),
            "completed": all(m["completed"] for m in ms),
        }
    return out


def met(value, ok):
    return None if value is None else bool(ok(value))


def skip_verdicts(summary):
    """Per scenario: headroom's avoidable skips (all seeds) against GradScaler's."""
    out = {}
    for s, pols in summary.items():
        if s not in LOSS_SCALE_SCENARIOS or "gradscaler" not in pols or "headroom" not in pols:
            continue
        g, h = pols["gradscaler"]["avoidable_total"], pols["headroom"]["avoidable_total"]
        verdict = "fewer" if h < g else ("tie, GradScaler 0" if g == 0 and h == 0 else
                                         "NOT fewer")
        out[s] = {"gradscaler": g, "headroom": h,
                  "gradscaler_per_10k": pols["gradscaler"]["avoidable_per_10k"],
                  "headroom_per_10k": pols["headroom"]["avoidable_per_10k"],
                  "verdict": verdict}
    return out


def live_spread(results):
    """headroom-live against headroom (lockstep) on the long scenario, seed by seed."""
    runs = results.get("long", {})
    if "headroom-live" not in runs or "headroom" not in runs:
        return {}
    rows = {}
    for seed, live in runs["headroom-live"].items():
        lock = runs["headroom"].get(seed)
        if lock is None or live["final_val_loss"] is None or lock["final_val_loss"] is None:
            continue
        rows[seed] = {"val_lockstep": lock["final_val_loss"], "val_live": live["final_val_loss"],
                      "val_abs_diff": abs(live["final_val_loss"] - lock["final_val_loss"]),
                      "skipped_lockstep": lock["skipped"], "skipped_live": live["skipped"],
                      "first_decision_lockstep": lock["first_decision_step"],
                      "first_decision_live": live["first_decision_step"],
                      "avoidable_after_first_decision_live":
                          live["avoidable_after_first_decision"],
                      "final_scale_lockstep": lock["final_scale"],
                      "final_scale_live": live["final_scale"]}
    return rows


def fallback_rows(results):
    runs = results.get("activation-overflow", {}).get("headroom-fp32", {})
    return {seed: {k: m.get(k) for k in (
        "fp32_decision_step", "fp32_tensors", "fp32_from_step", "fp32_layers",
        "skipped_before_fp32", "skipped_after_fp32", "throughput_ratio_after_fp32", "skipped",
        "injected")} for seed, m in sorted(runs.items())}


def derive(results, summary):
    """The results keys of the scenarios that ran: the loss-scale ones, then fp-recipes."""
    d = {}
    if any(s in results for s in LOSS_SCALE_SCENARIOS):
        d.update(derive_loss_scale(results, summary))
    if FP_SCENARIO in results:
        d.update(derive_fp(summary[FP_SCENARIO]))
    return d


def derive_loss_scale(results, summary):
    """The loss-scale keys; a key whose scenario did not run is None."""
    both = [s for s in LOSS_SCALE_SCENARIOS
            if s in results and "gradscaler" in results[s] and "headroom" in results[s]]
    gs_skips = sum(summary[s]["gradscaler"]["avoidable_total"] for s in both)
    hr_skips = sum(summary[s]["headroom"]["avoidable_total"] for s in both)
    gs_steps = sum(m["steps"] for s in both for m in results[s]["gradscaler"].values())
    hr_steps = sum(m["steps"] for s in both for m in results[s]["headroom"].values())
    skip_red = gs_skips / max(1, hr_skips) if both else None
    verdicts = skip_verdicts(summary)
    after = [m["avoidable_after_first_decision"] for s in results for p in HEADROOM_LOCKSTEP
             for m in results[s].get(p, {}).values()]
    after_total = None if all(a is None for a in after) else sum(a or 0 for a in after)

    shrink = summary.get("grad-shrink", {})
    gs_u = shrink.get("gradscaler", {}).get("mean_underflow_ratio")
    hr_u = shrink.get("headroom", {}).get("mean_underflow_ratio")
    under_red = gs_u / hr_u if gs_u is not None and hr_u else None

    long_gs = summary.get("long", {}).get("gradscaler", {})
    long_hr = summary.get("long", {}).get("headroom", {})
    val_delta, val_ci = (long_hr.get("val_loss_delta_vs_gradscaler"),
                         long_hr.get("val_loss_delta_ci95"))

    spread = live_spread(results)
    diffs = [r["val_abs_diff"] for r in spread.values()]
    live_after = [r["avoidable_after_first_decision_live"] for r in spread.values()]

    fb = fallback_rows(results)
    fb_after = [r["skipped_after_fp32"] for r in fb.values()]
    fb_after_total = None if not fb or any(a is None for a in fb_after) else sum(fb_after)
    fb_ratio = mean(r["throughput_ratio_after_fp32"] for r in fb.values())
    fb_layers = sorted({l for r in fb.values() for l in r["fp32_layers"]})

    return {
        "policy_skip_reduction_vs_gradscaler": skip_red,
        "policy_target_skip_reduction": TARGET_SKIP_REDUCTION,
        "policy_skip_reduction_target_met": met(skip_red, lambda v: v >= TARGET_SKIP_REDUCTION),
        "policy_eval_gradscaler_avoidable_skips": gs_skips,
        "policy_eval_headroom_avoidable_skips": hr_skips,
        "policy_eval_gradscaler_avoidable_skips_per_10k": per_10k(gs_skips, gs_steps),
        "policy_eval_headroom_avoidable_skips_per_10k": per_10k(hr_skips, hr_steps),
        "policy_skips_fewer_than_gradscaler_every_scenario_met":
            all(v["verdict"] != "NOT fewer" for v in verdicts.values()) if verdicts else None,
        "policy_skip_scenarios_gradscaler_zero":
            [s for s, v in verdicts.items() if v["gradscaler"] == 0],
        "policy_avoidable_skips_after_first_decision": after_total,
        "policy_target_avoidable_skips_after_first_decision": TARGET_SKIPS_AFTER_DECISION,
        "policy_avoidable_skips_after_first_decision_target_met":
            met(after_total, lambda v: v <= TARGET_SKIPS_AFTER_DECISION),

        "policy_underflow_reduction_vs_gradscaler": under_red,
        "policy_target_underflow_reduction": TARGET_UNDERFLOW_REDUCTION,
        "policy_underflow_reduction_target_met":
            met(under_red, lambda v: v >= TARGET_UNDERFLOW_REDUCTION),
        "policy_eval_gradscaler_mean_underflow_grad_shrink": gs_u,
        "policy_eval_headroom_mean_underflow_grad_shrink": hr_u,

        "policy_val_loss_delta_vs_gradscaler": val_delta,
        "policy_val_loss_delta_ci95": val_ci,
        "policy_val_loss_delta_seeds": len(long_hr.get("val_loss_deltas", {})),
        "policy_target_val_loss_delta": TARGET_VAL_LOSS_DELTA,
        "policy_val_loss_delta_target_met": met(val_delta, lambda v: v <= TARGET_VAL_LOSS_DELTA),
        "policy_eval_gradscaler_val_loss_long": long_gs.get("final_val_loss"),
        "policy_eval_headroom_val_loss_long": long_hr.get("final_val_loss"),

        "policy_live_val_loss_spread_mean": mean(diffs),
        "policy_live_val_loss_spread_max": max(diffs) if diffs else None,
        "policy_live_skipped_mean": mean(r["skipped_live"] for r in spread.values()),
        "policy_lockstep_skipped_mean": mean(r["skipped_lockstep"] for r in spread.values()),
        "policy_live_avoidable_skips_after_first_decision":
            None if not live_after or any(a is None for a in live_after) else sum(live_after),

        "policy_fp32_fallback_skips_before_decision":
            None if fb_after_total is None else sum(r["skipped_before_fp32"] for r in fb.values()),
        "policy_fp32_fallback_skips_after_decision": fb_after_total,
        "policy_target_fp32_fallback_skips_after_decision": 0,
        "policy_fp32_fallback_skips_after_decision_target_met":
            met(fb_after_total, lambda v: v == 0),
        "policy_fp32_fallback_throughput_ratio": fb_ratio,
        "policy_fp32_fallback_layers": fb_layers,
        "policy_fp32_fallback_from_steps": [r["fp32_from_step"] for r in fb.values()],
    }


# ---- fp-recipes: FP8/FP4 recipes and the per-layer precision ------------------------------

def gemm_layers(profile):
    """The linear layers a recipe quantises, as the trainer names them (h0.attn.qkv, ...)."""
    blocks = int(profile["model"][profile["model"].index("--layers") + 1])
    return [f"h{b}.{g}" for b in range(blocks) for g in GEMMS_PER_BLOCK]


def reason_for(layer, reason):
    """The part of a decision's reason that names `layer` (the engine joins one part per change
    with "; "), else the whole reason."""
    parts = [p for p in reason.split("; ") if f" {layer}:" in p or p.startswith(f"{layer}:")]
    return "; ".join(parts) or reason


def layer_moves(reports, decisions):
    """Every layer the policy moved (to BF16 or back to the recipe): the step its decision
    applied at, the decision's step and the reason it gave for that layer; and whether the
    trainer ran exactly each decided BF16 set from the step it applied on (StepReport.bf16_gemms)
    until the next one."""
    ran = {r["step"]: sorted(r["bf16_gemms"]) for r in reports}
    last = max(ran) if ran else -1
    sets = [d for d in decisions["decisions"] if d.get("bf16_gemms") is not None]
    moves, as_decided, before = [], True, []
    for i, d in enumerate(sets):
        now = sorted(d["bf16_gemms"])
        at = d["applied_step"]
        if at is None:
            as_decided = as_decided and d["effective_from_step"] > last  # decided too late
            continue
        for layer, to in ([(l, "bf16") for l in now if l not in before]
                          + [(l, "recipe") for l in before if l not in now]):
            moves.append({"step": at, "decided_at_step": d["decided_at_step"], "layer": layer,
                          "to": to, "reason": reason_for(layer, d["reason"])})
        nxt = next((e["applied_step"] for e in sets[i + 1:] if e["applied_step"] is not None),
                   last + 1)
        as_decided = as_decided and all(ran.get(s, now) == now for s in range(at, nxt))
        before = now
    return moves, as_decided


def quantizer_layer(q):
    """The layer a quantiser feeds: QuantizerStats.layer, else its name's stem
    (h0.mlp.fc.output_grad@wgrad -> h0.mlp.fc)."""
    return q["layer"] or q["name"].split("@")[0].rsplit(".", 1)[0]


def sqnr_db(signal_sq, error_sq):
    if not signal_sq or not error_sq:
        return None
    return 10.0 * math.log10(signal_sq / error_sq)


def quantizer_figures(quantizers):
    """Per layer, over the run's applied quantisers (what-if ones apart): the worst underflow
    share, the worst saturated (and overflowed) share and the lowest SQNR, each with the
    quantiser that had it, and the mean loss cost with its standard error and count (the
    output gradient's reports carry it); what the server's per-layer precision judges."""
    out = {}
    for q in quantizers:
        if q["what_if"] or not q["values"]:
            continue
        x = out.setdefault(quantizer_layer(q), {"underflow": (-1.0, ""), "saturated": (-1.0, ""),
                                                "sqnr_db": (math.inf, ""), "recipe": q["recipe"],
                                                "loss_cost": (None, None, 0)})
        n = q.get("loss_costs", 0)
        if n:
            mean = q["loss_cost_sum"] / n
            var = max(0.0, q["loss_cost_sq_sum"] / n - mean * mean) * n / max(1, n - 1)
            x["loss_cost"] = (mean, math.sqrt(var / n), n)
        u = q["underflow"] / q["values"]
        sat = (q["saturated"] + q["overflow"]) / q["values"]
        db = sqnr_db(q["signal_sq"], q["error_sq"])
        if u > x["underflow"][0]:
            x["underflow"] = (u, q["name"])
        if sat > x["saturated"][0]:
            x["saturated"] = (sat, q["name"])
        if db is not None and db < x["sqnr_db"][0]:
            x["sqnr_db"] = (db, q["name"])
    for x in out.values():
        if math.isinf(x["sqnr_db"][0]):
            x["sqnr_db"] = (None, "")
    return dict(sorted(out.items()))


def fp_figures(policy, log, reports, decisions, layers, quantizers):
    """One fp-recipes run: the share of layer-steps whose GEMMs ran the recipe (StepReport.
    bf16_gemms; the trainer's log must agree), the layers in the recipe at the end, the moves
    and their reasons, the steps that brought the policy quantiser evidence, and the per-layer
    quantiser statistics. The share is None for bf16, which runs no recipe."""
    n = len(layers)
    recipe = policy != FP_REFERENCE and bool(reports)
    in_bf16 = [len(r["bf16_gemms"]) for r in reports]
    logged = {r["step"]: sorted(r.get("bf16_gemms", [])) for r in log}
    moves, as_decided = layer_moves(reports, decisions)
    return {
        "gemm_layers": n,
        "low_precision_gemm_share": 1.0 - sum(in_bf16) / (n * len(reports)) if recipe else None,
        "low_precision_gemms_final": n - in_bf16[-1] if recipe else None,
        "bf16_gemms_final": reports[-1]["bf16_gemms"] if reports else [],
        "bf16_log_agrees": all(logged.get(r["step"]) == sorted(r["bf16_gemms"])
                               for r in reports),
        "steps_with_quantizers": sum(1 for r in reports
                                     if r["quantizers"] + r["quantizers_what_if"] > 0),
        "what_if_quantizers": sum(r["quantizers_what_if"] for r in reports),
        "bf16_decisions": sum(1 for d in decisions["decisions"]
                              if d.get("bf16_gemms") is not None),
        "layer_moves": moves,
        "bf16_applied_as_decided": as_decided,
        "quantizer_layers": quantizer_figures(quantizers),
    }


def agent_thread_share(train_out):
    """The share of the step time the agent took on the training thread, as ampscope-train
    prints it at exit (lockstep's wait for the server's Ack included); None if not printed."""
    with open(train_out, errors="replace") as f:
        found = re.search(r"training thread ([0-9.]+)% of step time", f.read())
    return float(found.group(1)) / 100.0 if found else None


def write_fp_series(path, log, reports):
    in_bf16 = {r["step"]: len(r["bf16_gemms"]) for r in reports}
    with open(path, "w") as f:
        f.write("# step train_loss bf16_gemm_layers\n")
        for r in log:
            f.write(f"{r['step']} {r['loss']!r} {in_bf16.get(r['step'], 'NaN')}\n")


def summarise_fp(results):
    """Per policy of fp-recipes: means over the seeds, the paired gap to bf16 and, for a
    -policy arm, the paired difference to its recipe arm, each with its 95% interval."""
    out = {}
    for policy, runs in results[FP_SCENARIO].items():
        ms = list(runs.values())
        gaps = val_deltas(results, FP_SCENARIO, policy, FP_REFERENCE)
        gap, gap_ci = mean_ci95(list(gaps.values()))
        base = policy[:-len("-policy")] if policy.endswith("-policy") else None
        deltas = val_deltas(results, FP_SCENARIO, policy, base) if base else {}
        delta, delta_ci = mean_ci95(list(deltas.values()))
        out[policy] = {
            "seeds": sorted(runs),
            "steps": ms[0]["steps_wanted"] if ms else None,
            "precision": FP_PRECISION[policy],
            "final_val_loss": mean(m["final_val_loss"] for m in ms),
            "gap_vs_bf16": gap,
            "gap_vs_bf16_ci95": gap_ci,
            "gaps_vs_bf16": gaps,
            "delta_vs_recipe": delta,
            "delta_vs_recipe_ci95": delta_ci,
            "gemm_layers": ms[0]["gemm_layers"] if ms else None,
            "low_precision_gemm_share": mean(m["low_precision_gemm_share"] for m in ms),
            "low_precision_gemms_final": mean(m["low_precision_gemms_final"] for m in ms),
            "layer_moves": sum(len(m["layer_moves"]) for m in ms),
            "bf16_decisions": mean(m["bf16_decisions"] for m in ms),
            "steps_with_quantizers_share": min((m["steps_with_quantizers"] / m["steps"]
                                                for m in ms if m["steps"]), default=None),
            "agent_thread_share": mean(m["agent_thread_share"] for m in ms),
            "step_s": mean(m["train_s"] / m["steps"] for m in ms if m["steps"]),
            "wall_s": mean(m["wall_s"] for m in ms),
            "completed": all(m["completed"] for m in ms),
        }
    return out


def gap_closed(recipe, policy):
    """The share of the recipe's gap to bf16 that its -policy arm closes; None unless the
    recipe's gap is shown (its 95% interval above 0)."""
    ci = recipe["gap_vs_bf16_ci95"]
    if recipe["gap_vs_bf16"] is None or policy["gap_vs_bf16"] is None or not ci or ci[0] <= 0:
        return None
    return 1.0 - policy["gap_vs_bf16"] / recipe["gap_vs_bf16"]


# The keys' prefix per recipe: fp4_ for nvfp4 (the keys docs/benchmarks.md lists), mxfp8_.
FP_KEY_PREFIX = {"nvfp4": "fp4", "mxfp8": "mxfp8"}


def derive_fp(fp):
    d = {"fp_target_gap_closed_share": TARGET_GAP_CLOSED_SHARE,
         "fp_target_low_precision_gemm_share": TARGET_LOW_PRECISION_GEMM_SHARE,
         "fp_eval_seeds": len(fp.get(FP_REFERENCE, {}).get("seeds", [])),
         "fp_eval_steps": fp.get(FP_REFERENCE, {}).get("steps")}
    for recipe in FP_RECIPES:
        k = FP_KEY_PREFIX[recipe]
        r, p = fp.get(recipe), fp.get(recipe + "-policy")
        if r is not None:
            d[f"{k}_val_loss_gap_vs_bf16"] = r["gap_vs_bf16"]
            d[f"{k}_val_loss_gap_vs_bf16_ci95"] = r["gap_vs_bf16_ci95"]
        if r is None or p is None:
            continue
        closed = gap_closed(r, p)
        share = p["low_precision_gemm_share"]
        n = p["gemm_layers"]
        d.update({
            f"{k}_policy_val_loss_gap_vs_bf16": p["gap_vs_bf16"],
            f"{k}_policy_val_loss_gap_vs_bf16_ci95": p["gap_vs_bf16_ci95"],
            f"{k}_policy_val_loss_delta_vs_recipe": p["delta_vs_recipe"],
            f"{k}_policy_val_loss_delta_vs_recipe_ci95": p["delta_vs_recipe_ci95"],
            f"{k}_policy_gap_closed_share": closed,
            f"{k}_policy_gap_closed_target_met":
                met(closed, lambda v: v >= TARGET_GAP_CLOSED_SHARE),
            f"{k}_policy_low_precision_gemm_share": share,
            f"{k}_policy_low_precision_gemm_share_target_met":
                met(share, lambda v: v > TARGET_LOW_PRECISION_GEMM_SHARE),
            f"{k}_policy_low_precision_gemm_final_share":
                None if p["low_precision_gemms_final"] is None or not n
                else p["low_precision_gemms_final"] / n,
            f"{k}_policy_layer_moves": p["layer_moves"],
        })
    return d


FP_SUMMARY_COLUMNS = ("policy", "precision", "seeds", "steps", "final val loss",
                      "val loss - bf16 [95% CI]", "val loss - recipe [95% CI]",
                      "low-precision GEMM share", "low-precision layers at the end",
                      "layer moves (all seeds)", "steps with quantisers", "ms per step",
                      "agent share of the step", "wall s", "completed")
FP_PER_SEED_COLUMNS = ("policy", "seed", "steps", "final train loss", "final val loss",
                       "val loss - bf16", "low-precision GEMM share", "BF16 layers at the end",
                       "layer moves", "BF16 sets as decided", "trainer log agrees",
                       "steps with quantisers", "what-if quantisers", "wall s", "completed")
FP_MOVE_COLUMNS = ("policy", "seed", "step applied", "decided at", "layer", "to",
                   "reason (the server's)")
FP_QUANTIZER_COLUMNS = ("recipe arm", "seed", "layer", "worst underflow", "worst saturated",
                        "lowest SQNR", "loss cost, nats per step (+- 2 SE; measured steps)")


def fp_summary_rows(fp):
    rows = []
    for p, x in fp.items():
        none = p == FP_REFERENCE
        rows.append([p, x["precision"], str(len(x["seeds"])), str(x["steps"]),
                     fmt(x["final_val_loss"], ".4f"),
                     "—" if none else fmt_ci(x["gap_vs_bf16"], x["gap_vs_bf16_ci95"]),
                     fmt_ci(x["delta_vs_recipe"], x["delta_vs_recipe_ci95"])
                     if p.endswith("-policy") else "—",
                     "—" if none else fmt(x["low_precision_gemm_share"], ".3f"),
                     "—" if none else f"{fmt(x['low_precision_gemms_final'], '.1f')} of "
                                      f"{x['gemm_layers']}",
                     str(x["layer_moves"]),
                     "—" if none else fmt_pct(x["steps_with_quantizers_share"]),
                     fmt(None if x["step_s"] is None else 1000 * x["step_s"], ".1f"),
                     "n/a" if x["agent_thread_share"] is None
                     else f"{100 * x['agent_thread_share']:.1f}%",
                     fmt(x["wall_s"], ".1f"), "yes" if x["completed"] else "NO"])
    return rows


def fp_per_seed_rows(results):
    rows = []
    for p, runs in results[FP_SCENARIO].items():
        gaps = val_deltas(results, FP_SCENARIO, p, FP_REFERENCE)
        for seed, m in sorted(runs.items()):
            none = p == FP_REFERENCE
            rows.append([p, str(seed), str(m["steps"]), fmt(m["final_train_loss"], ".4f"),
                         fmt(m["final_val_loss"], ".4f"),
                         "—" if none else fmt(gaps.get(seed), "+.4f"),
                         "—" if none else fmt(m["low_precision_gemm_share"], ".3f"),
                         ", ".join(m["bf16_gemms_final"]) or "—", str(len(m["layer_moves"])),
                         "yes" if m["bf16_applied_as_decided"] else "NO",
                         "yes" if m["bf16_log_agrees"] else "NO",
                         str(m["steps_with_quantizers"]), str(m["what_if_quantizers"]),
                         f"{m['wall_s']:.1f}",
                         "yes" if m["completed"] else "NO: " + m["error"]])
    return rows


def fp_move_rows(results):
    return [[p, str(seed), str(mv["step"]), str(mv["decided_at_step"]), mv["layer"], mv["to"],
             mv["reason"].replace("|", "/")]
            for p, runs in results[FP_SCENARIO].items() for seed, m in sorted(runs.items())
            for mv in m["layer_moves"]]


def fp_quantizer_rows(results, seed):
    """The recipe arms' per-layer quantiser statistics on one seed."""
    rows = []
    for p in FP_RECIPES:
        m = results[FP_SCENARIO].get(p, {}).get(seed)
        for layer, x in (m or {}).get("quantizer_layers", {}).items():
            rows.append([p, str(seed), layer,
                         f"{fmt_pct(x['underflow'][0])} ({x['underflow'][1]})",
                         f"{fmt_pct(x['saturated'][0])} ({x['saturated'][1]})",
                         f"{fmt(x['sqnr_db'][0], '.1f')} dB ({x['sqnr_db'][1]})",
                         fmt_cost(x.get("loss_cost", (None, None, 0)))])
    return rows


def fmt_cost(cost):
    mean, se, n = cost
    return "—" if mean is None else f"{mean:+.2e} +- {2 * se:.1e} ({n})"


def fp_goal_rows(d):
    rows = []
    for recipe in FP_RECIPES:
        k = FP_KEY_PREFIX[recipe]
        if f"{k}_policy_gap_closed_share" not in d:
            continue
        gap = fmt_ci(d[f"{k}_val_loss_gap_vs_bf16"], d[f"{k}_val_loss_gap_vs_bf16_ci95"])
        pgap = fmt_ci(d[f"{k}_policy_val_loss_gap_vs_bf16"],
                      d[f"{k}_policy_val_loss_gap_vs_bf16_ci95"])
        closed = d[f"{k}_policy_gap_closed_share"]
        rows.append([f"share of the {recipe} gap to bf16 the policy closes (fp-recipes, paired)",
                     f"{k}_policy_gap_closed_share",
                     f"{fmt(closed, '.2f')} (gap {recipe} {gap}; {recipe}-policy {pgap})",
                     f">= {TARGET_GAP_CLOSED_SHARE:g}",
                     verdict(d[f"{k}_policy_gap_closed_target_met"])
                     + ("" if closed is not None else " (no gap shown)")])
        rows.append([f"GEMM layer-steps {recipe}-policy kept in {recipe}",
                     f"{k}_policy_low_precision_gemm_share",
                     f"{fmt(d[f'{k}_policy_low_precision_gemm_share'], '.3f')} (at the end "
                     f"{fmt(d[f'{k}_policy_low_precision_gemm_final_share'], '.3f')}; "
                     f"{d[f'{k}_policy_layer_moves']} layer moves)",
                     f"> {TARGET_LOW_PRECISION_GEMM_SHARE:g}",
                     verdict(d[f"{k}_policy_low_precision_gemm_share_target_met"])])
    return rows


def fp_table(results, summary, d, profile, seeds):
    fp = summary[FP_SCENARIO]
    out = ["", f"## FP8/FP4 recipes and per-layer precision ({FP_SCENARIO})", "",
           f"{steps_of(profile, FP_SCENARIO)} steps on the Jargon File, seeds "
           f"{', '.join(map(str, seeds))}, {profile['fp_eval_batches']} validation batches at "
           f"the end, the agent's default sampling (quantisers reported every step), lockstep. "
           f"A -policy arm runs its recipe with ampscope-server --gemm-precision "
           f"{' '.join(profile['gemm_server_args']) or '(defaults)'}. The low-precision GEMM "
           f"share is the share of layer-steps ({len(gemm_layers(profile))} linear layers x "
           f"steps) that ran the recipe.", ""]
    out += md_table(FP_SUMMARY_COLUMNS, fp_summary_rows(fp))
    out += ["", "## FP8/FP4 per-seed runs", ""]
    out += md_table(FP_PER_SEED_COLUMNS, fp_per_seed_rows(results))
    out += ["", "## FP8/FP4 layer moves", ""]
    moves = fp_move_rows(results)
    out += md_table(FP_MOVE_COLUMNS, moves) if moves else ["No layer moved."]
    out += ["", f"## FP8/FP4 quantisers of the recipe arms, worst per layer (seed {seeds[0]})", ""]
    out += md_table(FP_QUANTIZER_COLUMNS, fp_quantizer_rows(results, seeds[0]))
    return out


def plot_fp(gnuplot, out_dir, work, fp, seed):
    """fp-recipes: the policy arms' BF16 layers per step (one seed) and the gap to bf16 per seed
    with its mean and 95% CI per arm."""
    png = os.path.join(out_dir, "fp_recipes.png")
    policies = [p for p in FP_POLICIES if p != FP_REFERENCE and p in fp]
    dat = os.path.join(work, "fp_gaps.dat")
    with open(dat, "w") as f:
        f.write("# per arm: x seed gap, then x mean low high\n")
        for i, p in enumerate(policies):
            for seed_, g in sorted(fp[p]["gaps_vs_bf16"].items()):
                f.write(f"{i + 1} {seed_} {g!r}\n")
            f.write("\n\n")
        for i, p in enumerate(policies):
            m, ci = fp[p]["gap_vs_bf16"], fp[p]["gap_vs_bf16_ci95"]
            if m is not None:
                lo, hi = ci if ci else (m, m)
                f.write(f"{i + 1.25} {m!r} {lo!r} {hi!r}\n")
    tics = ", ".join(f"'{p}' {i + 1}" for i, p in enumerate(policies))
    layers = [f"'{os.path.join(work, 'series', run_id(FP_SCENARIO, p, seed) + '.fp.dat')}' "
              f"using 1:3 with steps lw 1.5 title '{p}'"
              for p in policies if p.endswith("-policy")]
    script = [
        "set terminal pngcairo size 1500,600 font ',10'", f"set output '{png}'",
        f"set multiplot layout 1,2 title '{FP_SCENARIO}: per-layer precision'", "set grid",
        f"set title 'linear layers in BF16, seed {seed}'", "set xlabel 'step'",
        "set ylabel 'layers'", "set key top left font ',8'",
        f"set yrange [-0.2:{fp[FP_REFERENCE]['gemm_layers'] + 0.2 if FP_REFERENCE in fp else 1}]",
        "plot " + (", ".join(layers) or "0 notitle"),
        "set title 'final validation loss - bf16: per seed (points), mean with 95% CI'",
        "set xlabel ''", "set ylabel 'nats'", "set autoscale y",
        f"set xrange [0.5:{len(policies) + 0.75}]",
        f"set xtics ({tics})", "set xzeroaxis lt -1", "set offsets 0, 0, graph 0.05, graph 0.05",
        "plot " + ", ".join([f"'{dat}' index {i} using 1:3 with points pt 7 ps 1.2 notitle"
                             for i in range(len(policies))]
                            + [f"'{dat}' index {len(policies)} using 1:2:3:4 with yerrorbars "
                               f"pt 5 ps 1.2 lc rgb '#000000' title 'mean, 95% CI'"]),
        "unset multiplot",
    ]
    if _gnuplot(gnuplot, script) == 0 and os.path.exists(png):
        return png
    print(f"policy_eval.py: gnuplot failed for {png}", file=sys.stderr)
    return None


# ---- the table ----------------------------------------------------------------------------

def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def fmt_pct(v):
    return "n/a" if v is None else f"{100 * v:.3f}%"


def fmt_ci(d, ci):
    if d is None:
        return "n/a"
    return f"{d:+.4f}" + ("" if ci is None else f" [{ci[0]:+.4f}, {ci[1]:+.4f}]")


def fmt_scale(v):
    return "n/a" if not v else f"2^{math.log2(v):g}"


def md_table(columns, rows):
    return (["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


SUMMARY_COLUMNS = ("scenario", "policy", "seeds", "steps", "skipped", "skipped / 10k",
                   "avoidable", "avoidable / 10k", "avoidable after first decision (all seeds)",
                   "steps underflow > 1%", "mean underflow", "final val loss",
                   "val loss - gradscaler [95% CI]", "policy updates", "wall s", "completed")
PER_SEED_COLUMNS = ("scenario", "policy", "seed", "steps", "steps measured", "skipped",
                    "skipped / 10k", "avoidable", "avoidable / 10k", "first decision step",
                    "avoidable after first decision", "steps underflow > 1%", "mean underflow",
                    "final train loss", "final val loss", "val loss - gradscaler",
                    "policy updates", "scale changes", "final scale", "fp32 layers (from step)",
                    "wall s", "completed")
GOAL_COLUMNS = ("goal", "key", "measured", "target", "met")


def summary_rows(summary):
    rows = []
    for s in loss_scale_scenarios(summary):
        for p, x in summary[s].items():
            rows.append([s, p, str(len(x["seeds"])), str(x["steps"]), fmt(x["skipped"], ".1f"),
                         fmt(x["skipped_per_10k"], ".1f"), fmt(x["avoidable_skipped"], ".1f"),
                         fmt(x["avoidable_per_10k"], ".1f"),
                         fmt(x["avoidable_after_first_decision_total"], "d"),
                         fmt(x["steps_underflow_gt_1pct"], ".1f"),
                         fmt_pct(x["mean_underflow_ratio"]), fmt(x["final_val_loss"], ".4f"),
                         "—" if p == "gradscaler" else fmt_ci(x["val_loss_delta_vs_gradscaler"],
                                                              x["val_loss_delta_ci95"]),
                         fmt(x["policy_updates"], ".1f"), fmt(x["wall_s"], ".1f"),
                         "yes" if x["completed"] else "NO"])
    return rows


def per_seed_rows(results):
    rows = []
    for s in loss_scale_scenarios(results):
        for p, runs in results[s].items():
            deltas = val_deltas(results, s, p)
            for seed, m in sorted(runs.items()):
                layers = ("—" if not m["fp32_layers"] else
                          f"{','.join(m['fp32_layers'])} ({m['fp32_from_step']})")
                rows.append([s, p, str(seed), str(m["steps"]), str(m["steps_measured"]),
                             str(m["skipped"]),
                             fmt(m["skipped_per_10k"], ".1f"), str(m["avoidable_skipped"]),
                             fmt(m["avoidable_per_10k"], ".1f"),
                             fmt(m["first_decision_step"], "d"),
                             fmt(m["avoidable_after_first_decision"], "d"),
                             str(m["steps_underflow_gt_1pct"]), fmt_pct(m["mean_underflow_ratio"]),
                             fmt(m["final_train_loss"], ".4f"), fmt(m["final_val_loss"], ".4f"),
                             "—" if p == "gradscaler" else fmt(deltas.get(seed), "+.4f"),
                             str(m["policy_updates"]), str(m["scale_changes"]),
                             fmt_scale(m["final_scale"]), layers, f"{m['wall_s']:.1f}",
                             "yes" if m["completed"] else "NO: " + m["error"]])
    return rows


def verdict(ok):
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def goal_rows(d):
    ci = d["policy_val_loss_delta_ci95"]
    return [
        ["avoidable skips, GradScaler / headroom (all scenarios and seeds)",
         "policy_skip_reduction_vs_gradscaler",
         f"{fmt(d['policy_skip_reduction_vs_gradscaler'], '.3g')} "
         f"({d['policy_eval_gradscaler_avoidable_skips']} vs "
         f"{d['policy_eval_headroom_avoidable_skips']})", f">= {TARGET_SKIP_REDUCTION:g}",
         verdict(d["policy_skip_reduction_target_met"])],
        ["headroom skips fewer than GradScaler in every scenario",
         "policy_skips_fewer_than_gradscaler_every_scenario_met",
         "GradScaler skipped none in: "
         + (", ".join(d["policy_skip_scenarios_gradscaler_zero"]) or "—"),
         "fewer (a tie at 0 where GradScaler skips none)",
         verdict(d["policy_skips_fewer_than_gradscaler_every_scenario_met"])],
        ["avoidable skips after headroom's first decision (lockstep runs)",
         "policy_avoidable_skips_after_first_decision",
         fmt(d["policy_avoidable_skips_after_first_decision"], "d"), "0",
         verdict(d["policy_avoidable_skips_after_first_decision_target_met"])],
        ["underflow, GradScaler / headroom (grad-shrink)",
         "policy_underflow_reduction_vs_gradscaler",
         f"{fmt(d['policy_underflow_reduction_vs_gradscaler'], '.3g')} "
         f"({fmt_pct(d['policy_eval_gradscaler_mean_underflow_grad_shrink'])} vs "
         f"{fmt_pct(d['policy_eval_headroom_mean_underflow_grad_shrink'])})",
         f">= {TARGET_UNDERFLOW_REDUCTION:g}", verdict(d["policy_underflow_reduction_target_met"])],
        ["final val loss, headroom - GradScaler (long, paired, 95% CI)",
         "policy_val_loss_delta_vs_gradscaler",
         fmt_ci(d["policy_val_loss_delta_vs_gradscaler"], ci)
         + f" over {d['policy_val_loss_delta_seeds']} seeds", "<= 0 (mean)",
         verdict(d["policy_val_loss_delta_target_met"])],
        ["skips after the FP32 decision (activation-overflow, headroom-fp32)",
         "policy_fp32_fallback_skips_after_decision",
         f"{fmt(d['policy_fp32_fallback_skips_after_decision'], 'd')} (before: "
         f"{fmt(d['policy_fp32_fallback_skips_before_decision'], 'd')})", "0",
         verdict(d["policy_fp32_fallback_skips_after_decision_target_met"])],
        ["steps/s after the FP32 decision, headroom-fp32 / headroom",
         "policy_fp32_fallback_throughput_ratio",
         fmt(d["policy_fp32_fallback_throughput_ratio"], ".3f")
         + f" (FP32: {', '.join(d['policy_fp32_fallback_layers']) or 'none'})", "—", "—"],
        ["final val loss, live against lockstep, absolute difference (long, headroom)",
         "policy_live_val_loss_spread_mean",
         f"mean {fmt(d['policy_live_val_loss_spread_mean'], '.4f')}, max "
         f"{fmt(d['policy_live_val_loss_spread_max'], '.4f')}", "—", "—"],
    ]


def loss_scale_scenarios(by_scenario):
    return [s for s in LOSS_SCALE_SCENARIOS if s in by_scenario]


def write_table(path, results, summary, d, times, profile_name, profile, seeds):
    """table.md: the loss-scale sections when one of their scenarios ran, then fp-recipes'."""
    out = [f"# Policies in closed loop: profile `{profile_name}`"]
    if loss_scale_scenarios(results):
        first = loss_scale_scenarios(results)[0]
        out += loss_scale_table(results, summary, d, profile, seeds[first])
    if FP_SCENARIO in results:
        out += ["", "## FP8/FP4 goals", ""]
        out += md_table(GOAL_COLUMNS, fp_goal_rows(d))
        out += fp_table(results, summary, d, profile, seeds[FP_SCENARIO])
    out += ["", "## Time per scenario", ""]
    out += md_table(("scenario", "runs", "run seconds (sum)", "wall seconds (its share)"),
                    [[s, str(t["runs"]), f"{t['run_s']:.0f}", f"{t['wall_s']:.0f}"]
                     for s, t in times.items()])
    text = "\n".join(out) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def loss_scale_table(results, summary, d, profile, seeds):
    steps = ", ".join(f"{s} {steps_of(profile, s)}" for s in loss_scale_scenarios(results))
    out = ["",
           f"Model `{' '.join(profile['model'])}`, amp-fp16, seeds {', '.join(map(str, seeds))} "
           f"(on a seed every policy starts from the same weights and sees the same batches); "
           f"steps: {steps}; an overflow injected every {profile['spike_every']} steps "
           f"(overflow-spikes, logits gradient) and every {profile['activation_overflow_every']} "
           f"steps (activation-overflow, {OVERFLOW_ACTIVATION}); long trains on the Jargon File "
           f"with the agent's default sampling, the others on the built-in corpus with full "
           f"statistics every step. Every policy but headroom-live runs in lockstep "
           f"with the server (deterministic). Skips per 10k are per 10,000 steps. Underflow is the "
           f"mean over the steps whose every gradient could be counted (steps measured).", "",
           "## Summary (mean per run over the seeds)", ""]
    out += md_table(SUMMARY_COLUMNS, summary_rows(summary))
    out += ["", "## Goals", ""]
    out += md_table(GOAL_COLUMNS, goal_rows(d))
    out += ["", "## Avoidable skips against GradScaler, per scenario (all seeds)", ""]
    out += md_table(("scenario", "GradScaler", "headroom", "GradScaler / 10k", "headroom / 10k",
                     "headroom"),
                    [[s, str(v["gradscaler"]), str(v["headroom"]),
                      fmt(v["gradscaler_per_10k"], ".1f"), fmt(v["headroom_per_10k"], ".1f"),
                      v["verdict"]] for s, v in skip_verdicts(summary).items()])
    out += ["", "## headroom live against lockstep (long)", ""]
    out += md_table(("seed", "val loss lockstep", "val loss live", "abs(live - lockstep)",
                     "skipped lockstep", "skipped live", "first decision lockstep",
                     "first decision live", "final scale lockstep", "final scale live"),
                    [[str(seed), f"{r['val_lockstep']:.4f}", f"{r['val_live']:.4f}",
                      f"{r['val_abs_diff']:.4f}", str(r["skipped_lockstep"]),
                      str(r["skipped_live"]), fmt(r["first_decision_lockstep"], "d"),
                      fmt(r["first_decision_live"], "d"), fmt_scale(r["final_scale_lockstep"]),
                      fmt_scale(r["final_scale_live"])]
                     for seed, r in sorted(live_spread(results).items())])
    out += ["", "## FP32 fallback (activation-overflow, headroom-fp32)", ""]
    out += md_table(("seed", "decision effective step", "tensors asked", "FP32 from step",
                     "layers", "skipped before", "skipped after", "injected",
                     "steps/s vs headroom after it"),
                    [[str(seed), fmt(r["fp32_decision_step"], "d"),
                      ", ".join(r["fp32_tensors"]) or "—", fmt(r["fp32_from_step"], "d"),
                      ", ".join(r["fp32_layers"]) or "—", fmt(r["skipped_before_fp32"], "d"),
                      fmt(r["skipped_after_fp32"], "d"), str(r["injected"]),
                      fmt(r["throughput_ratio_after_fp32"], ".3f")]
                     for seed, r in fallback_rows(results).items()])
    out += ["", "## Per-seed runs", ""]
    out += md_table(PER_SEED_COLUMNS, per_seed_rows(results))
    return out


# ---- plots --------------------------------------------------------------------------------

GNUPLOT_PANELS = {
    "loss_scale": ("loss scale (log2)", "($2 > 0 ? log($2)/log(2) : NaN)"),
    "cumulative_skipped": ("cumulative skipped steps", "3"),
    "underflow": ("gradient underflow ratio (%)", "($4*100)"),
}
COLOURS = {"gradscaler": "#1f77b4", "hysteresis": "#d62728", "static": "#7f7f7f",
           "headroom": "#2ca02c", "headroom-fp32": "#9467bd", "headroom-live": "#ff7f0e"}


def plot(out_dir, work, profile, summary, seeds):
    """The plots of the scenarios that ran (each on its first seed); their paths."""
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("policy_eval.py: gnuplot not found (Debian: gnuplot-nox); no plots",
              file=sys.stderr)
        return []
    made = []
    if FP_SCENARIO in summary:
        png = plot_fp(gnuplot, out_dir, work, summary[FP_SCENARIO], seeds[FP_SCENARIO][0])
        if png:
            made.append(png)
    if not loss_scale_scenarios(summary):
        return made
    seed = seeds[loss_scale_scenarios(summary)[0]][0]
    for name, (ylabel, column) in GNUPLOT_PANELS.items():
        png = os.path.join(out_dir, f"{name}.png")
        script = [
            "set terminal pngcairo size 1500,900 font ',10'",
            f"set output '{png}'",
            f"set multiplot layout 2,3 title '{ylabel} per scenario, one line per policy, "
            f"seed {seed}'",
            "set key top right font ',8'", "set xlabel 'step'", f"set ylabel '{ylabel}'",
            "set grid",
        ]
        for scenario in loss_scale_scenarios(summary):
            script.append(f"set title '{scenario} ({steps_of(profile, scenario)} steps)'")
            parts = []
            for policy in policies_of(profile, scenario):
                dat = os.path.join(work, "series", f"{run_id(scenario, policy, seed)}.dat")
                parts.append(f"'{dat}' using 1:{column} with lines lw 1.5 "
                             f"lc rgb '{COLOURS[policy]}' title '{policy}'")
            script.append("plot " + ", ".join(parts))
        script.append("unset multiplot")
        if _gnuplot(gnuplot, script) == 0 and os.path.exists(png):
            made.append(png)
        else:
            print(f"policy_eval.py: gnuplot failed for {png}", file=sys.stderr)
    png = plot_val_deltas(gnuplot, out_dir, work, summary)
    if png:
        made.append(png)
    return made


def plot_val_deltas(gnuplot, out_dir, work, summary):
    """headroom - GradScaler final val loss per seed, one panel per scenario (each on its own
    scale), with the mean and its 95% CI."""
    png = os.path.join(out_dir, "val_loss_delta.png")
    script = [
        "set terminal pngcairo size 1500,900 font ',10'", f"set output '{png}'",
        "set multiplot layout 2,3 title 'final validation loss, headroom - GradScaler: per seed "
        "(points), mean with 95% CI (bar)'",
        "set xlabel 'seed'", "set ylabel 'val loss difference (nats)'", "set grid",
        "set key top left font ',8'", "set xzeroaxis lt -1",
    ]
    for s in loss_scale_scenarios(summary):
        x = summary[s].get("headroom")
        if x is None or not x["val_loss_deltas"]:
            continue
        deltas = sorted(x["val_loss_deltas"].items())
        dat = os.path.join(work, f"val_deltas.{s}.dat")
        with open(dat, "w") as f:
            f.write("# seed delta, then: position mean low high\n")
            for seed, d in deltas:
                f.write(f"{seed} {d!r}\n")
            m, ci = x["val_loss_delta_vs_gradscaler"], x["val_loss_delta_ci95"]
            lo, hi = ci if ci else (m, m)
            f.write(f"\n\n{len(deltas) + 1} {m!r} {lo!r} {hi!r}\n")
        tics = ", ".join([f"'{seed}' {seed}" for seed, _ in deltas]
                         + [f"'mean' {len(deltas) + 1}"])
        script += [f"set title '{s}'", f"set xrange [0.5:{len(deltas) + 1.5}]",
                   f"set xtics ({tics})", "set offsets 0, 0, graph 0.05, graph 0.05",
                   f"plot '{dat}' index 0 using 1:2 with points pt 7 ps 1.2 lc rgb '#2ca02c' "
                   f"title 'seeds', '{dat}' index 1 using 1:2:3:4 with yerrorbars pt 5 ps 1.2 "
                   f"lc rgb '#000000' title 'mean, 95% CI'"]
    script.append("unset multiplot")
    if _gnuplot(gnuplot, script) == 0 and os.path.exists(png):
        return png
    print(f"policy_eval.py: gnuplot failed for {png}", file=sys.stderr)
    return None


def _gnuplot(binary, script):
    p = subprocess.run([binary], input="\n".join(script) + "\n", text=True,
                       capture_output=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
    return p.returncode


# ---- main ---------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="short")
    ap.add_argument("--seeds", type=int, help="seeds 1..N (default: the profile's)")
    ap.add_argument("--first-seed", type=int, default=1,
                    help="seeds K..K+N-1 instead (held-out seeds for rules tuned on 1..N)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="runs at a time (default: 2, or 1 on one core)")
    ap.add_argument("--fragment", help="write the results keys here (for merge_results.py)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra ampscope-server flag for the headroom servers (repeatable)")
    ap.add_argument("--gemm-server-arg", action="append", default=[],
                    help="extra ampscope-server flag for the per-layer precision's server "
                         "(fp-recipes' -policy arms; repeatable), after the profile's")
    ap.add_argument("--scenarios", help="comma-separated scenarios to run (default: all of "
                                        f"them: {','.join(SCENARIOS)})")
    args = ap.parse_args()
    scenarios = SCENARIOS if not args.scenarios else [
        s for s in SCENARIOS if s in args.scenarios.split(",")]
    unknown = set((args.scenarios or "").split(",")) - set(SCENARIOS) - {""}
    if unknown or not scenarios:
        print(f"policy_eval.py: --scenarios: {', '.join(sorted(unknown)) or 'none given'}; the "
              f"scenarios are {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    b = args.build_dir
    args.train_bin = os.path.join(b, "trainer", "ampscope-train")
    args.server_bin = os.path.join(b, "server", "ampscope-server")
    args.extract_bin = os.path.join(b, "bench", "policy_eval", "ampscope_policy_eval_extract")
    for p in (args.train_bin, args.server_bin, args.extract_bin):
        if not os.access(p, os.X_OK):
            print(f"policy_eval.py: {p} not found; build the target ampscope_policy_eval_targets",
                  file=sys.stderr)
            return 2
    profile = dict(PROFILES[args.profile])
    profile["gemm_server_args"] = profile["gemm_server_args"] + args.gemm_server_arg
    seeds = {s: list(range(args.first_seed, args.first_seed
                           + (args.seeds or (profile.get("fp_seeds") if s == FP_SCENARIO else None)
                              or profile["seeds"])))
             for s in scenarios}
    out_dir = args.out_dir
    work = os.path.join(out_dir, "work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "series"))
    try:
        corpus = jargon_corpus(out_dir, b)
    except (SetupError, OSError) as e:
        print(f"policy_eval.py: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    ctx = {"args": args, "profile": profile, "work": work, "corpus": corpus, "t0": t0,
           "servers": {}, "print_lock": threading.Lock()}
    try:
        extra = {"headroom": args.server_arg, "headroom-fp32": args.server_arg,
                 "gemm": profile["gemm_server_args"]}
        for name in sorted({server_for(p) for s in scenarios for p in policies_of(profile, s)}):
            ctx["servers"][name] = Server(args.server_bin, name, work, extra.get(name, []))
        results, times = run_everything(ctx, seeds, max(1, args.jobs))
    finally:
        for s in ctx["servers"].values():
            s.stop()
    summary = {s: summarise_scenario(results, s) for s in loss_scale_scenarios(results)}
    if FP_SCENARIO in results:
        summary[FP_SCENARIO] = summarise_fp(results)
    d = derive(results, summary)
    d["policy_eval_profile"] = args.profile
    d["policy_eval_seeds"] = max(len(x) for x in seeds.values())
    d["policy_eval_wall_s"] = time.monotonic() - t0
    with open(os.path.join(out_dir, "runs.json"), "w") as f:
        json.dump({"profile": args.profile, "model": profile["model"],
                   "scenarios": {s: {"steps": steps_of(profile, s),
                                     "policies": list(policies_of(profile, s))}
                                 for s in scenarios},
                   "seeds": seeds, "corpus_long": corpus, "server_args": args.server_arg,
                   "gemm_server_args": profile["gemm_server_args"],
                   "jobs": args.jobs, "derived": d, "summary": summary, "times": times,
                   "live_spread": live_spread(results), "fp32_fallback": fallback_rows(results),
                   "runs": results}, f, indent=2, sort_keys=True)
        f.write("\n")
    print()
    print(write_table(os.path.join(out_dir, "table.md"), results, summary, d, times,
                      args.profile, profile, seeds))
    for png in plot(out_dir, work, profile, summary, seeds):
        print(f"plot: {png}")
    print()
    for s, t in times.items():
        print(f"time {s}: {t['runs']} runs, {t['run_s']:.0f} run-seconds, about "
              f"{t['wall_s']:.0f} s of the wall time")
    print(f"policy_eval.py: {d['policy_eval_wall_s']:.0f} s in all, {args.jobs} runs at a time")
    goals = goal_rows(d) if loss_scale_scenarios(results) else []
    for row in goals + fp_goal_rows(d):
        print(f"{row[1]}: {row[2]} (target {row[3]}: {row[4]})")
    if args.fragment:
        with open(args.fragment, "w") as f:
            json.dump(d, f, indent=2, sort_keys=True)
            f.write("\n")
    failed = [run_id(s, p, seed) for s in results for p, runs in results[s].items()
              for seed, m in runs.items() if not m["completed"]]
    if failed:
        print(f"policy_eval.py: runs that did not complete: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
