#!/usr/bin/env python3
"""Closed-loop loss-scale policies compared (docs/policy.md).

    policy_eval.py --build-dir BUILD --out-dir DIR [--profile smoke|short|full] [--fragment F]

Runs ampscope-train (amp-fp16, the agent attached) against ampscope-server under every scenario
with every policy, same seed and model, one run at a time:

  policies   gradscaler     local dynamic scaler (PyTorch GradScaler semantics), server observe
             hysteresis     local Megatron-style scaler, server observe
             static         a fixed scale (2^16, or the scenario's initial scale), server observe
             headroom       server --policy headroom (the local dynamic scaler as safety net)
             headroom-fp32  the same with --fp32-fallback
  scenarios  defaults, init-2p24 (initial scale 2^24), grad-shrink (gradients shrinking
             geometrically over training), overflow-spikes (an overflow injected every K steps),
             long (>= 5,000 steps in the short and full profiles)

Every run measures the same way: full statistics of every activation and weight gradient every
step (--sample-full-every 1), read back from the server with ampscope_policy_eval_extract. The
underflow of a step is the share of those gradient values lost to FP16 at the scale in use:
FP32-held weight gradients count what their FP16 target count says underflows, FP16-held
activation gradients count their zeros (an underflowed value is stored as 0; the model's own
exact zeros are a small floor every policy shares).

Writes DIR/runs.json (every figure of every run), DIR/table.md, DIR/*.png (gnuplot), the
per-step series DIR/series/*.dat and, with --fragment, the flat results keys for
bench/merge_results.py. Exit status 1 when a run did not complete (every run is still tried).
Only the standard library: it runs under Debian 12's /usr/bin/python3.
"""

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

POLICIES = ("gradscaler", "hysteresis", "static", "headroom", "headroom-fp32")
SCENARIOS = ("defaults", "init-2p24", "grad-shrink", "overflow-spikes", "long")
STATIC_SCALE = 65536.0  # the static policy's fixed scale: GradScaler's initial scale
INIT_TOO_HIGH = 16777216.0  # 2^24
UNDERFLOW_STEP_THRESHOLD = 0.01  # "steps whose gradient underflow ratio exceeds 1%"

TARGET_SKIP_REDUCTION = 10.0
TARGET_UNDERFLOW_REDUCTION = 2.0
TARGET_VAL_LOSS_DELTA = 0.01

# Model and steps per profile. smoke: the ctest (a tiny model, seconds in all; its steps are so
# short that the server's decisions often arrive after their effective step). short: ./run
# bench. full: longer scenarios.
SMALL_MODEL = ["--width", "64", "--heads", "2", "--layers", "2", "--context", "64", "--batch", "8"]
PROFILES = {
    "smoke": {
        "model": ["--width", "32", "--heads", "2", "--layers", "2", "--context", "32",
                  "--batch", "4"],
        "steps": {"defaults": 30, "init-2p24": 30, "grad-shrink": 30, "overflow-spikes": 30,
                  "long": 60},
        "spike_every": 10,
        "eval_batches": 2,
    },
    "short": {
        "model": SMALL_MODEL,
        "steps": {"defaults": 300, "init-2p24": 300, "grad-shrink": 600, "overflow-spikes": 400,
                  "long": 5000},
        "spike_every": 50,
        "eval_batches": 8,
    },
    "full": {
        "model": SMALL_MODEL,
        "steps": {"defaults": 2000, "init-2p24": 2000, "grad-shrink": 3000,
                  "overflow-spikes": 2000, "long": 10000},
        "spike_every": 100,
        "eval_batches": 16,
    },
}
# The shrinking-gradients schedule: the gradient multiplier moves geometrically from 1 at the
# first step to this at the last.
GRAD_SHRINK_END = 2.0 ** -20


def scenario_flags(scenario, policy, profile):
    steps = profile["steps"][scenario]
    flags = ["--steps", str(steps)]
    if scenario == "init-2p24" and policy != "static":  # static: its one scale, policy_flags
        flags += ["--init-scale", repr(INIT_TOO_HIGH)]
    elif scenario == "grad-shrink":
        flags += ["--grad-shrink", "1", "--grad-shrink-end", repr(GRAD_SHRINK_END)]
    elif scenario == "overflow-spikes":
        flags += ["--inject-overflow-every", str(profile["spike_every"])]
    return flags


def injected_steps(scenario, profile):
    if scenario != "overflow-spikes":
        return set()
    k, n = profile["spike_every"], profile["steps"][scenario]
    return set(range(k, n, k))


def policy_flags(policy, scenario):
    if policy == "gradscaler":
        return ["--scaler", "dynamic"]
    if policy == "hysteresis":
        return ["--scaler", "hysteresis"]
    if policy == "static":
        scale = INIT_TOO_HIGH if scenario == "init-2p24" else STATIC_SCALE
        return ["--scaler", "static", "--init-scale", repr(scale)]
    return ["--scaler", "dynamic"]  # headroom*: the local dynamic scaler is the safety net


def server_for(policy):
    return {"headroom": "headroom", "headroom-fp32": "headroom-fp32"}.get(policy, "observe")


SERVER_ARGS = {
    "observe": ["--policy", "observe"],
    "headroom": ["--policy", "headroom"],
    "headroom-fp32": ["--policy", "headroom", "--fp32-fallback"],
}


class Server:
    """One ampscope-server on a free loopback port with its own store."""

    def __init__(self, binary, name, work, extra):
        self.dir = os.path.join(work, "server-" + name)
        os.makedirs(self.dir, exist_ok=True)
        ready = os.path.join(self.dir, "ready.json")
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--db",
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


def summarise(log, reports, injected, wall_s, steps):
    """The per-run figures, from the trainer's log (losses, skips) and the server's reports."""
    by_step = {r["step"]: r for r in reports}
    ratios = []
    series = []
    cum_skipped = 0
    for row in log:
        s = row["step"]
        cum_skipped += 1 if row["skipped"] else 0
        rep = by_step.get(s)
        ratio = None
        if rep is not None and rep["grad_numel"] > 0:
            ratio = (rep["grad_underflow"] + rep["grad_zeros16"]) / rep["grad_numel"]
            ratios.append(ratio)
        series.append((s, row["loss_scale"], cum_skipped, ratio))
    skipped = [r["step"] for r in log if r["skipped"]]
    last = log[-1] if log else {}
    vals = [r.get("val_loss") for r in log if r.get("val_loss") is not None]
    return {
        "steps": len(log),
        "steps_wanted": steps,
        "reports": len(reports),
        "steps_measured": len(ratios),
        "skipped": len(skipped),
        "avoidable_skipped": sum(1 for s in skipped if s not in injected),
        "injected": len(injected),
        "steps_underflow_gt_1pct": sum(1 for r in ratios if r > UNDERFLOW_STEP_THRESHOLD),
        "mean_underflow_ratio": sum(ratios) / len(ratios) if ratios else None,
        "final_train_loss": last.get("loss"),
        "final_val_loss": vals[-1] if vals else None,
        "policy_updates": sum(r["policy_applied"] for r in reports),
        "scale_changes": sum(1 for r in log if r["scale_after"] != r["loss_scale"])
        + sum(1 for a, b in zip(log, log[1:]) if b["loss_scale"] != a["scale_after"]),
        "final_scale": last.get("scale_after"),
        "wall_s": wall_s,
    }, series


def completed(m):
    v = m.get("final_val_loss")
    return (m.get("error") is None and m["steps"] == m["steps_wanted"]
            and m["reports"] == m["steps_wanted"] and m["steps_measured"] == m["steps_wanted"]
            and v is not None and math.isfinite(v))


def run_one(args, profile, servers, scenario, policy, work):
    run_id = f"{scenario}.{policy}"
    run_dir = os.path.join(work, "runs", run_id)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    log_path = os.path.join(run_dir, "train.jsonl")
    steps = profile["steps"][scenario]
    server = servers[server_for(policy)]
    cmd = ([args.train_bin, "--precision", "amp-fp16", "--seed", str(args.seed), "--threads", "1",
            "--eval-every", "0", "--eval-batches", str(profile["eval_batches"]), "--quiet",
            "--log-json", log_path] + profile["model"] + scenario_flags(scenario, policy, profile)
           + policy_flags(policy, scenario)
           + ["--server", server.address, "--run-id", run_id,
              "--spool-dir", os.path.join(run_dir, "spool"),
              "--sample-full-every", "1", "--sample-full-roles", "activation_grad,weight_grad"])
    with open(os.path.join(run_dir, "command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    t0 = time.monotonic()
    with open(os.path.join(run_dir, "train.out"), "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    wall_s = time.monotonic() - t0
    error = None if rc == 0 else f"ampscope-train exited with {rc}"
    reports_path = os.path.join(run_dir, "reports.jsonl")
    if error is None:
        rc = subprocess.call([args.extract_bin, "--server", server.address, "--run-id", run_id,
                              "--out", reports_path])
        if rc != 0:
            error = f"ampscope_policy_eval_extract exited with {rc}"
    log = read_jsonl(log_path) if os.path.exists(log_path) else []
    reports = read_jsonl(reports_path) if os.path.exists(reports_path) else []
    m, series = summarise(log, reports, injected_steps(scenario, profile), wall_s, steps)
    m["error"] = error
    m["completed"] = completed(m)
    if not m["completed"] and m["error"] is None:
        m["error"] = (f"incomplete: {m['steps']} steps logged, {m['reports']} reports stored, "
                      f"{m['steps_measured']} measured of {steps}; final val loss "
                      f"{m['final_val_loss']}")
    with open(os.path.join(work, "series", f"{scenario}.{policy}.dat"), "w") as f:
        f.write("# step loss_scale cumulative_skipped underflow_ratio\n")
        for s, scale, cum, ratio in series:
            f.write(f"{s} {scale} {cum} {'NaN' if ratio is None else repr(ratio)}\n")
    return m


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


TABLE_COLUMNS = ("scenario", "policy", "steps", "skipped", "avoidable skipped",
                 "steps underflow > 1%", "mean underflow", "final train loss", "final val loss",
                 "policy updates", "scale changes", "final scale", "wall s", "completed")


def write_table(path, results, profile_name, profile):
    lines = [f"Profile `{profile_name}`: model `{' '.join(profile['model'])}`, amp-fp16, seed "
             f"and batches identical across policies; steps per scenario "
             + ", ".join(f"{s} {profile['steps'][s]}" for s in SCENARIOS)
             + f"; overflow injected every {profile['spike_every']} steps in overflow-spikes.",
             "",
             "| " + " | ".join(TABLE_COLUMNS) + " |",
             "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"]
    for scenario in SCENARIOS:
        for policy in POLICIES:
            m = results[scenario][policy]
            mean = m["mean_underflow_ratio"]
            cells = [scenario, policy, str(m["steps"]), str(m["skipped"]),
                     str(m["avoidable_skipped"]), str(m["steps_underflow_gt_1pct"]),
                     "n/a" if mean is None else f"{100 * mean:.3f}%",
                     fmt(m["final_train_loss"], ".4f"), fmt(m["final_val_loss"], ".4f"),
                     str(m["policy_updates"]), str(m["scale_changes"]),
                     "n/a" if not m["final_scale"] else f"2^{math.log2(m['final_scale']):g}",
                     f"{m['wall_s']:.1f}", "yes" if m["completed"] else "NO: " + m["error"]]
            lines.append("| " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def derive(results):
    gs_skips = sum(results[s]["gradscaler"]["avoidable_skipped"] for s in SCENARIOS)
    hr_skips = sum(results[s]["headroom"]["avoidable_skipped"] for s in SCENARIOS)
    skip_red = gs_skips / max(1, hr_skips)
    gs_u = results["grad-shrink"]["gradscaler"]["mean_underflow_ratio"]
    hr_u = results["grad-shrink"]["headroom"]["mean_underflow_ratio"]
    under_red = gs_u / hr_u if gs_u is not None and hr_u else None
    gs_v = results["long"]["gradscaler"]["final_val_loss"]
    hr_v = results["long"]["headroom"]["final_val_loss"]
    val_delta = (hr_v - gs_v) / gs_v if gs_v and hr_v is not None else None

    def met(value, ok):
        return None if value is None else bool(ok(value))

    return {
        "policy_skip_reduction_vs_gradscaler": skip_red,
        "policy_underflow_reduction_vs_gradscaler": under_red,
        "policy_val_loss_delta_vs_gradscaler": val_delta,
        "policy_target_skip_reduction": TARGET_SKIP_REDUCTION,
        "policy_target_underflow_reduction": TARGET_UNDERFLOW_REDUCTION,
        "policy_target_val_loss_delta": TARGET_VAL_LOSS_DELTA,
        "policy_skip_reduction_target_met": met(skip_red, lambda v: v >= TARGET_SKIP_REDUCTION),
        "policy_underflow_reduction_target_met":
            met(under_red, lambda v: v >= TARGET_UNDERFLOW_REDUCTION),
        "policy_val_loss_delta_target_met": met(val_delta, lambda v: v <= TARGET_VAL_LOSS_DELTA),
        "policy_eval_gradscaler_avoidable_skips": gs_skips,
        "policy_eval_headroom_avoidable_skips": hr_skips,
        "policy_eval_gradscaler_mean_underflow_grad_shrink": gs_u,
        "policy_eval_headroom_mean_underflow_grad_shrink": hr_u,
        "policy_eval_gradscaler_val_loss_long": gs_v,
        "policy_eval_headroom_val_loss_long": hr_v,
    }


GNUPLOT_PANELS = {
    "loss_scale": ("loss scale (log2)", "($2 > 0 ? log($2)/log(2) : NaN)"),
    "cumulative_skipped": ("cumulative skipped steps", "3"),
    "underflow": ("gradient underflow ratio (%)", "($4*100)"),
}


def plot(out_dir, work, profile):
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("policy_eval.py: gnuplot not found (Debian: gnuplot-nox); no plots",
              file=sys.stderr)
        return []
    made = []
    colours = ["#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#9467bd"]
    for name, (ylabel, column) in GNUPLOT_PANELS.items():
        png = os.path.join(out_dir, f"{name}.png")
        script = [
            "set terminal pngcairo size 1500,900 font ',10'",
            f"set output '{png}'",
            "set multiplot layout 2,3 title '" + ylabel + " per scenario, one line per policy'",
            "set key top right font ',8'",
            "set xlabel 'step'",
            f"set ylabel '{ylabel}'",
            "set grid",
        ]
        for scenario in SCENARIOS:
            script.append(f"set title '{scenario} ({profile['steps'][scenario]} steps)'")
            parts = []
            for i, policy in enumerate(POLICIES):
                dat = os.path.join(work, "series", f"{scenario}.{policy}.dat")
                parts.append(f"'{dat}' using 1:{column} with lines lw 1.5 lc rgb '{colours[i]}' "
                             f"title '{policy}'")
            script.append("plot " + ", ".join(parts))
        script.append("unset multiplot")
        rc = _gnuplot(gnuplot, script)
        if rc == 0 and os.path.exists(png):
            made.append(png)
        else:
            print(f"policy_eval.py: gnuplot failed for {png}", file=sys.stderr)
    return made


def _gnuplot(binary, script):
    p = subprocess.run([binary], input="\n".join(script) + "\n", text=True,
                       capture_output=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
    return p.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="short")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fragment", help="write the results keys here (for merge_results.py)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra ampscope-server flag for the headroom servers (repeatable)")
    args = ap.parse_args()
    b = args.build_dir
    args.train_bin = os.path.join(b, "trainer", "ampscope-train")
    args.server_bin = os.path.join(b, "server", "ampscope-server")
    args.extract_bin = os.path.join(b, "bench", "policy_eval", "ampscope_policy_eval_extract")
    for p in (args.train_bin, args.server_bin, args.extract_bin):
        if not os.access(p, os.X_OK):
            print(f"policy_eval.py: {p} not found; build the target ampscope_policy_eval_targets",
                  file=sys.stderr)
            return 2
    profile = PROFILES[args.profile]
    out_dir = args.out_dir
    work = os.path.join(out_dir, "work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "series"))
    t_start = time.monotonic()
    servers = {}
    results = {s: {} for s in SCENARIOS}
    try:
        for name in SERVER_ARGS:
            extra = args.server_arg if name.startswith("headroom") else []
            servers[name] = Server(args.server_bin, name, work, extra)
        for scenario in SCENARIOS:
            for policy in POLICIES:
                m = run_one(args, profile, servers, scenario, policy, work)
                results[scenario][policy] = m
                mean = m["mean_underflow_ratio"]
                print(f"  {scenario:15} {policy:13} skipped {m['skipped']:4} (avoidable "
                      f"{m['avoidable_skipped']:4})  underflow "
                      f"{'n/a' if mean is None else f'{100 * mean:.3f}%':>8}  val "
                      f"{fmt(m['final_val_loss'], '.4f')}  updates {m['policy_updates']:3}  "
                      f"{m['wall_s']:.1f} s{'' if m['completed'] else '  FAILED: ' + m['error']}",
                      flush=True)
    finally:
        for s in servers.values():
            s.stop()
    d = derive(results)
    d["policy_eval_profile"] = args.profile
    d["policy_eval_wall_s"] = time.monotonic() - t_start
    with open(os.path.join(out_dir, "runs.json"), "w") as f:
        json.dump({"profile": args.profile, "model": profile["model"], "steps": profile["steps"],
                   "seed": args.seed, "server_args": args.server_arg, "derived": d,
                   "runs": results}, f, indent=2, sort_keys=True)
        f.write("\n")
    print()
    print(write_table(os.path.join(out_dir, "table.md"), results, args.profile, profile))
    for png in plot(out_dir, work, profile):
        print(f"plot: {png}")
    print()
    for key, target, met in (
            ("policy_skip_reduction_vs_gradscaler", ">= 10", "policy_skip_reduction_target_met"),
            ("policy_underflow_reduction_vs_gradscaler", ">= 2",
             "policy_underflow_reduction_target_met"),
            ("policy_val_loss_delta_vs_gradscaler", "<= 0.01", "policy_val_loss_delta_target_met")):
        v, ok = d[key], d[met]
        print(f"{key}: {fmt(v, '.4g')} (target {target}: "
              f"{'n/a' if ok is None else ('met' if ok else 'NOT met')})")
    if args.fragment:
        with open(args.fragment, "w") as f:
            json.dump(d, f, indent=2, sort_keys=True)
            f.write("\n")
    failed = [f"{s}.{p}" for s in SCENARIOS for p in POLICIES if not results[s][p]["completed"]]
    if failed:
        print(f"policy_eval.py: runs that did not complete: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
