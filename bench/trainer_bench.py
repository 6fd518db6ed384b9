"""Trainer benchmark: ampscope-train's tokens/s against the same model and batch in PyTorch.

    trainer_bench.py --train-bin BUILD/trainer/ampscope-train --out FRAGMENT [options]

Runs ampscope-train (fp32 and amp-bf16) and bench/peers/torch_gpt.py (fp32 and bf16 autocast)
on the same model size, batch, context and thread count, alternating the four runs for
`--rounds` rounds so that both sides see the same machine load. Each run does `--warmup`
untimed steps, then `--windows` windows of `--window-steps` steps; a window's tokens/s is its
tokens over the sum of its step times (ampscope: `step_time_s` of --log-json, which covers the
whole optimizer step; torch: the same span timed in the peer). A side's figure is the median
of all its windows over all rounds. Writes one JSON fragment of flat `trainer_*` keys; a
missing or failing PyTorch leaves its figures out and says why (`trainer_torch_error_*`).

`--compare-bin` runs a second ampscope-train (another build, e.g. before a back-end change)
in the same rounds and reports it as `trainer_compare_*`, with the ratio of the two.

Data parallel: 2 ranks under mpirun against 1 rank (fp32, the same per-rank batch and threads
per rank, half the cores each), alternating for `--rounds` rounds, reported as
`trainer_dp1_tokens_per_s`, `trainer_dp2_tokens_per_s` (global tokens over rank 0's step times)
and `trainer_dp2_speedup`; no mpirun leaves them out and says so (`trainer_dp_error`).

The torch peer runs with OMP_WAIT_POLICY=PASSIVE unless the environment sets it: on a machine
that other work keeps busy, libgomp's default spinning makes a 2-thread torch step up to ten
times slower, which would flatter ampscope. The policy used is recorded.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODES = (("fp32", "fp32", "fp32"), ("bf16", "amp-bf16", "bf16"))  # key, ampscope, torch


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return -1.0


def run_ampscope(binary, precision, args, tmp, launcher=(), threads=None, env=None):
    """Tokens/s per window and the header facts of one ampscope-train run (under `launcher`,
    e.g. mpirun -np 2: rank 0's log, whose tokens are the global count)."""
    log = os.path.join(tmp, f"ampscope_{precision}.jsonl")
    steps = args.warmup + args.windows * args.window_steps
    cmd = [*launcher, binary, "--precision", precision, "--steps", str(steps), "--seed",
           str(args.seed), "--batch", str(args.batch), "--context", str(args.context),
           "--width", str(args.width), "--heads", str(args.heads), "--layers", str(args.layers),
           "--threads", str(threads or args.threads), "--eval-every", "0", "--eval-batches", "1",
           "--quiet", "--log-json", log]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    with open(log) as f:
        events = [json.loads(line) for line in f if line.strip()]
    if len(events) != steps:
        raise RuntimeError(f"ampscope-train logged {len(events)} steps, expected {steps}")
    if any(e["skipped"] for e in events):
        raise RuntimeError(f"ampscope-train {precision} skipped a step; the timing is not a "
                           "full optimizer step")
    timed = events[args.warmup:]
    windows = []
    for w in range(args.windows):
        chunk = timed[w * args.window_steps:(w + 1) * args.window_steps]
        windows.append(sum(e["tokens"] for e in chunk) / sum(e["step_time_s"] for e in chunk))
    header = re.search(r"(\d+) parameters, vocab (\d+)", proc.stderr)
    if header is None:
        raise RuntimeError(f"cannot read parameters and vocab from: {proc.stderr.strip()}")
    return windows, {"parameters": int(header.group(1)), "vocab": int(header.group(2)),
                     "first_loss": events[0]["loss"], "last_loss": events[-1]["loss"]}


def run_torch(precision, vocab, args, tmp, env):
    out = os.path.join(tmp, f"torch_{precision}.json")
    cmd = [args.python, args.torch_peer, "--precision", precision, "--vocab", str(vocab),
           "--context", str(args.context), "--width", str(args.width), "--heads",
           str(args.heads), "--layers", str(args.layers), "--batch", str(args.batch),
           "--threads", str(args.threads), "--seed", str(args.seed), "--warmup",
           str(args.warmup), "--windows", str(args.windows), "--window-steps",
           str(args.window_steps), "--out", out]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env,
                              timeout=args.torch_timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        with open(out) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {"error": f"the peer wrote no result (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-300:]}"}
    return result


def rounds(args, env, tmp, sides, errors, info, torch_info):
    """Alternates the runs; fills sides (side -> mode -> windows), errors, info and torch_info."""
    for r in range(args.rounds):
        for key, ours, theirs in MODES:
            windows, facts = run_ampscope(args.train_bin, ours, args, tmp)
            info.update(facts)
            sides["ampscope"].setdefault(key, []).extend(windows)
            if args.compare_bin:
                windows, _ = run_ampscope(args.compare_bin, ours, args, tmp)
                sides["compare"].setdefault(key, []).extend(windows)
            if f"torch_error_{key}" in errors:
                continue
            result = run_torch(theirs, info["vocab"], args, tmp, env)
            if "error" in result:
                errors[f"torch_error_{key}"] = result["error"]
                continue
            sides["torch"].setdefault(key, []).extend(result["tokens_per_s_windows"])
            torch_info.update(result)
            if result["parameters"] != info["parameters"]:
                errors["torch_error_parameters"] = (
                    f"the peer has {result['parameters']} parameters, ampscope "
                    f"{info['parameters']}")
        print(f"  after round {r + 1}/{args.rounds}, tokens/s: " + ", ".join(
            f"{side} {key} {statistics.median(w[key]):.0f}"
            for side, w in sides.items() for key in w), flush=True)


def data_parallel(args, tmp):
    """(dp1 windows, dp2 windows, threads per rank, error): fp32, 1 rank against mpirun -np 2."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return [], [], 0, "no mpirun on PATH"
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    threads = max(1, args.threads // 2)
    one, two = [], []
    for r in range(args.rounds):
        one.extend(run_ampscope(args.train_bin, "fp32", args, tmp, threads=threads, env=env)[0])
        two.extend(run_ampscope(args.train_bin, "fp32", args, tmp, [mpirun, "-np", "2"],
                                threads=threads, env=env)[0])
        print(f"  data parallel after round {r + 1}/{args.rounds}, tokens/s: 1 rank "
              f"{statistics.median(one):.0f}, 2 ranks {statistics.median(two):.0f}", flush=True)
    return one, two, threads, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--train-bin", required=True, help="ampscope-train to measure")
    parser.add_argument("--compare-bin", help="a second ampscope-train, reported as compare")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    parser.add_argument("--torch-peer", default=os.path.join(here, "peers", "torch_gpt.py"))
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for both sides (0: all logical cores, ampscope-train's "
                             "default)")
    # ampscope-train's default model and batch.
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per run")
    parser.add_argument("--windows", type=int, default=3, help="timed windows per run")
    parser.add_argument("--window-steps", type=int, default=4, help="steps per window")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the four runs")
    parser.add_argument("--torch-timeout-s", type=float, default=120.0)
    parser.add_argument("--build-type", default="unspecified",
                        help="CMAKE_BUILD_TYPE of --train-bin, recorded in the results")
    parser.add_argument("--out", required=True, help="JSON fragment to write")
    args = parser.parse_args()
    if args.threads <= 0:
        args.threads = os.cpu_count() or 1

    env = dict(os.environ)
    wait_policy = env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load_start = load_average()
    sides = {"ampscope": {}, "torch": {}, "compare": {}}  # side -> mode -> windows
    info, torch_info, errors = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="ampscope-trainer-bench-") as tmp:
        try:
            rounds(args, env, tmp, sides, errors, info, torch_info)
            dp1, dp2, dp_threads, dp_error = data_parallel(args, tmp)
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            print(f"trainer_bench.py: {e}", file=sys.stderr)
            return 1

    f = {
        "trainer_timestamp": started,
        "cpu_model": cpu_model(),
        "cpu_logical_cores": os.cpu_count(),
        "trainer_load_average_1min_start": load_start,
        "trainer_load_average_1min_end": load_average(),
        "trainer_threads": args.threads,
        "trainer_build_type": args.build_type,
        "trainer_model": {"vocab": info["vocab"], "context": args.context, "width": args.width,
                          "heads": args.heads, "layers": args.layers,
                          "parameters": info["parameters"]},
        "trainer_batch": args.batch,
        "trainer_context": args.context,
        "trainer_tokens_per_step": args.batch * args.context,
        "trainer_timing": {"rounds": args.rounds, "warmup_steps": args.warmup,
                           "windows_per_run": args.windows, "steps_per_window": args.window_steps,
                           "figure": "median over all windows of tokens / sum of step times"},
        "trainer_modes": {"fp32": "ampscope fp32 vs torch fp32",
                          "bf16": "ampscope amp-bf16 vs torch.autocast('cpu', bfloat16)"},
        "trainer_torch_omp_wait_policy": wait_policy,
    }
    for side, prefix in (("ampscope", "trainer"), ("torch", "trainer_torch"),
                         ("compare", "trainer_compare")):
        for key, windows in sides[side].items():
            f[f"{prefix}_tokens_per_s_{key}"] = statistics.median(windows)
            f[f"{prefix}_tokens_per_s_windows_{key}"] = [round(w, 1) for w in windows]
    if args.compare_bin:
        for key, _, _ in MODES:
            f[f"trainer_vs_compare_speedup_{key}"] = (
                f[f"trainer_tokens_per_s_{key}"] / f[f"trainer_compare_tokens_per_s_{key}"])
    if torch_info:
        f["trainer_torch_version"] = torch_info["torch_version"]
        f["trainer_torch_threads"] = torch_info["threads"]
        f["trainer_torch_openblas_threads"] = torch_info["openblas_threads"]
    if dp_error:
        f["trainer_dp_error"] = dp_error
    else:
        f["trainer_dp1_tokens_per_s"] = statistics.median(dp1)
        f["trainer_dp2_tokens_per_s"] = statistics.median(dp2)
        f["trainer_dp2_speedup"] = f["trainer_dp2_tokens_per_s"] / f["trainer_dp1_tokens_per_s"]
        f["trainer_dp_threads_per_rank"] = dp_threads
        f["trainer_dp_setup"] = ("fp32, --batch per rank as above, mpirun -np 2 against one "
                                 "process, each with trainer_dp_threads_per_rank threads")
    f.update({f"trainer_{k}": v for k, v in errors.items()})
    with open(args.out, "w") as out:
        json.dump(f, out, indent=2, sort_keys=True)
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
