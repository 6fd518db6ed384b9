"""The PyTorch monitor's overhead: a torch training step with and without ampscope.torch.attach().

    PYTHONPATH=python AMPSCOPE_AGENT_LIBRARY=BUILD/agent/libampscope_agent.so \\
        /usr/bin/python3 bench/torch_agent_bench.py --server-bin BUILD/server/ampscope-server \\
        --out FRAGMENT.json [--rounds 12] [--steps-per-block 8] [--warmup-steps 2] [model flags]

One process, one model: ampscope-train's GPT as PyTorch writes it (bench/peers/torch_gpt.py:
token and position embeddings, pre-LN blocks of causal multi-head attention and a GELU MLP,
final LayerNorm, LM head tied to the embedding) trained on the CPU with AdamW,
bf16 autocast and ampscope.torch.LossScaler, in the loop a user writes (autocast forward,
scaler.scale(loss).backward(), scaler.unscale_, clip_grad_norm_, scaler.step, scaler.update).
A real ampscope-server (its own SQLite store in a temporary directory) receives the reports.

--precision auto (the default) is bf16 autocast where the CPU has the AVX-512 subsets
(avx512bw, avx512vl, avx512dq) that PyTorch's oneDNN needs for bf16 matmuls, and FP32 (the same
loop, autocast disabled, the monitor told compute_dtype=torch.float32) where it does not: there
PyTorch 1.13 falls back to a scalar bf16 GEMM that makes this model's step about 15 times
slower (seconds instead of tens of milliseconds), which would hide any monitor overhead. The
precision used is recorded (torch_agent_bench_precision).

Each round runs one block per configuration, in an order that rotates from round to round:
  without   no monitor
  default   a monitor at the agent's default sampling (attach(..., options={}))
  full      full statistics on every step (options={"sample_full_every": "1"})
A monitored block attaches a fresh monitor, runs --warmup-steps untimed steps (the first step
of a monitor is a full-statistics step; the connection to the server is made), then
--steps-per-block timed steps, then closes the monitor (flushing to the server); attach, the
warm-up and close are outside the timed region. The block without the monitor has the same
untimed warm-up. The training itself goes on across blocks (same model, optimizer and scaler).

Figures: for each round, ratio = the monitored block's time / the unmonitored block's time in
the same round; the overhead ratio is the median of these paired ratios over the rounds (a
drift of a shared machine hits both blocks of a pair alike, and one disturbed round does not
move the median). The ratio of the median block times is written alongside (as the C++ agent
bench computes it). The monitor's time on the training thread per step is the agent's counter
`training_thread_s` over the timed steps only (counters read before and after them): the time
inside the agent's C calls (begin_step, observe, end_step), not the Python hooks around them,
which the wall-clock ratio includes. The same paired medians are also computed from CPU time
(time.thread_time of the thread running the loop, and time.process_time of the process), which
time spent descheduled does not disturb (a CPU whose speed changes still does).

Each monitor's run starts at step 0, so the default monitor's timed steps are its steps W to
W+N-1 (W warm-up, N per block), none of them a multiple of sample_full_every (100) as long as
W+N <= 100: a long run pays one full step in 100 on top (about 1/100 of the full
configuration's extra time), which these blocks leave out.

Threads: --threads for torch.set_num_threads and OPENBLAS_NUM_THREADS; 0 (the default) is all
logical cores but one, which is left to the agent's own threads and to ampscope-server (a real
deployment runs the server elsewhere; on 2 cores a 2-thread torch shares them with both and
the figures measure that contention more than the monitor). OMP_WAIT_POLICY=PASSIVE unless the
environment sets it (as bench/trainer_bench.py does for the PyTorch peer).

The agent's AMPSCOPE_* environment variables are cleared (all but AMPSCOPE_AGENT_LIBRARY and
the programs' paths), so that the two monitored configurations differ only in
sample_full_every; --agent-option KEY=VALUE sets an agent option for both.

Writes one JSON fragment of flat torch_agent_* keys; exits 1 (and writes nothing) on failure,
and with --require-acked also when a monitor closed with reports the server had not
acknowledged.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

# The machine facts the trainer benchmark records, and ampscope-train's GPT as PyTorch writes it
# (the trainer benchmark's peer).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from trainer_bench import cpu_model, load_average  # noqa: E402
from torch_gpt import build_model  # noqa: E402

# Kept from the environment: the library's path and the benchmark's own programs.
_KEEP_ENV = ("AMPSCOPE_AGENT_LIBRARY", "AMPSCOPE_SERVER_BIN", "AMPSCOPE_CLI_BIN")
CONFIGS = ("without", "default", "full")


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def choose_precision(requested):
    """(precision, why) for --precision: bf16 | fp32 | auto."""
    if requested != "auto":
        return requested, "requested"
    if {"avx512bw", "avx512vl", "avx512dq"} <= cpu_flags():
        return "bf16", "auto: the CPU has AVX-512 (oneDNN bf16 matmuls)"
    return "fp32", ("auto: the CPU lacks avx512bw/vl/dq, so PyTorch's bf16 matmuls would fall "
                    "back to a slow scalar GEMM")


def parse_agent_options(items):
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--agent-option takes KEY=VALUE, got {item!r}")
        options[key] = value
    return options


def run(args, torch, amps, server, tmp):
    F = torch.nn.functional
    torch.manual_seed(args.seed)
    model = build_model(torch, args.vocab, args.context, args.width, args.heads, args.layers)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    scaler = amps.LossScaler(init_scale=args.init_scale)
    pool = torch.randint(args.vocab, (8, args.batch, args.context + 1),
                         generator=torch.Generator().manual_seed(args.seed))
    state = {"i": 0, "losses": []}
    bf16 = args.precision == "bf16"
    compute_dtype = torch.bfloat16 if bf16 else torch.float32

    def step():
        batch = pool[state["i"] % pool.shape[0]]
        state["i"] += 1
        inputs, targets = batch[:, :-1], batch[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        state["losses"].append(loss.detach())

    base_options = parse_agent_options(args.agent_option)
    base_options["spool_dir"] = os.path.join(tmp, "spool")
    options = {"default": dict(base_options),
               "full": dict(base_options, sample_full_every="1")}
    blocks = {c: [] for c in CONFIGS}  # seconds per timed block
    thread_cpu = {c: [] for c in CONFIGS}  # CPU seconds of this (the training) thread
    process_cpu = {c: [] for c in CONFIGS}  # CPU seconds of the process, every thread
    thread_s = {"default": [], "full": []}  # training_thread_s of the timed steps
    steps_counted = {"default": 0, "full": 0}
    unacked = {"default": 0, "full": 0}
    dropped = {"default": 0, "full": 0}
    notices = set()

    def block(config, r):
        mon = None
        if config != "without":
            mon = amps.attach(model, optimizer, scaler, run_id=f"torch-bench-{config}-{r}",
                              server=server.address, options=options[config],
                              compute_dtype=compute_dtype)
        try:
            for _ in range(args.warmup_steps):
                step()
            c0 = mon.counters() if mon is not None else None
            start = time.perf_counter()
            cpu0, proc0 = time.thread_time(), time.process_time()
            for _ in range(args.steps_per_block):
                step()
            seconds = time.perf_counter() - start
            thread_cpu[config].append(time.thread_time() - cpu0)
            process_cpu[config].append(time.process_time() - proc0)
            if mon is not None:
                c1 = mon.counters()
                thread_s[config].append(c1["training_thread_s"] - c0["training_thread_s"])
                steps_counted[config] += c1["steps"] - c0["steps"]
                dropped[config] += c1["dropped_reports"] + c1["dropped_tensors"]
                notices.update(mon.notices())
        finally:
            if mon is not None and not mon.close(args.close_timeout_s):
                unacked[config] += 1
        blocks[config].append(seconds)

    for _ in range(args.warmup_steps + 3):  # the allocator, autocast's caches, AdamW's state
        step()
    for r in range(args.rounds):
        order = CONFIGS[r % 3:] + CONFIGS[:r % 3]
        for config in order:
            block(config, r)
        n = args.steps_per_block
        print(f"  round {r + 1}/{args.rounds}: ms per step " + ", ".join(
            f"{c} {blocks[c][-1] / n * 1e3:.1f}" for c in CONFIGS), flush=True)

    losses = torch.stack(state["losses"]).float()
    if not bool(torch.isfinite(losses).all()):
        raise RuntimeError("a non-finite loss: the timing would include skipped steps")
    for config in ("default", "full"):
        expected = args.rounds * args.steps_per_block
        if steps_counted[config] != expected:
            raise RuntimeError(f"the {config} monitor counted {steps_counted[config]} timed "
                               f"steps, expected {expected} (step detection)")
    return {"blocks": blocks, "thread_cpu": thread_cpu, "process_cpu": process_cpu,
            "thread_s": thread_s, "unacked": unacked, "dropped": dropped,
            "notices": sorted(notices), "first_loss": float(losses[0]),
            "last_loss": float(losses[-1]), "final_scale": scaler.get_scale(),
            "parameters": sum(p.numel() for p in model.parameters())}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server-bin", default=os.environ.get("AMPSCOPE_SERVER_BIN"),
                   help="ampscope-server (default: $AMPSCOPE_SERVER_BIN)")
    p.add_argument("--out", required=True, help="JSON fragment to write")
    p.add_argument("--rounds", type=int, default=12, help="rounds, each one block per config")
    p.add_argument("--steps-per-block", type=int, default=8, help="timed steps per block")
    p.add_argument("--warmup-steps", type=int, default=2,
                   help="untimed steps at the start of every block")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="bf16 autocast or FP32 (auto: bf16 where the CPU has AVX-512)")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--init-scale", type=float, default=2.0**16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0,
                   help="torch and OpenBLAS threads (0: all logical cores but one)")
    p.add_argument("--close-timeout-s", type=float, default=10.0,
                   help="how long closing a monitor waits for the server's acknowledgements")
    p.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an agent option for both monitored configurations (repeatable)")
    p.add_argument("--require-acked", action="store_true",
                   help="fail unless the server acknowledged every report (the smoke test)")
    args = p.parse_args()
    if not args.server_bin:
        p.error("--server-bin (or AMPSCOPE_SERVER_BIN) is required")
    if min(args.rounds, args.steps_per_block) < 1 or args.warmup_steps < 1:
        p.error("--rounds and --steps-per-block must be >= 1, --warmup-steps >= 1 (the first "
                "step of a monitor is a full-statistics step)")
    if args.threads <= 0:
        args.threads = max(1, (len(os.sched_getaffinity(0)) or os.cpu_count() or 1) - 1)
    args.precision, precision_why = choose_precision(args.precision)

    # Before torch loads: its OpenMP and OpenBLAS read these once.
    wait_policy = os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    cleared = sorted(k for k in os.environ if k.startswith("AMPSCOPE_") and k not in _KEEP_ENV)
    for k in cleared:
        del os.environ[k]

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load_start = load_average()
    tmp = tempfile.mkdtemp(prefix="ampscope-torch-agent-bench-")
    server = None
    try:
        import torch
        import ampscope
        import ampscope.torch as amps
        torch.set_num_threads(args.threads)
        server = ampscope.LocalServer(args.server_bin, workdir=os.path.join(tmp, "server"))
        os.makedirs(server.workdir)
        server.start()
        result = run(args, torch, amps, server, tmp)
    except Exception as e:
        print(f"torch_agent_bench.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    if args.require_acked and sum(result["unacked"].values()):
        print(f"torch_agent_bench.py: {sum(result['unacked'].values())} monitors closed with "
              "reports the server had not acknowledged", file=sys.stderr)
        return 1
    blocks, n = result["blocks"], args.steps_per_block
    def paired_ratios(times):
        return {c: [m / w for m, w in zip(times[c], times["without"])]
                for c in ("default", "full")}

    paired = paired_ratios(blocks)
    paired_thread = paired_ratios(result["thread_cpu"])
    paired_process = paired_ratios(result["process_cpu"])
    step_s = {c: statistics.median(blocks[c]) / n for c in CONFIGS}
    timed_steps = args.rounds * n
    model_desc = (f"gpt vocab {args.vocab} context {args.context} width {args.width} heads "
                  f"{args.heads} layers {args.layers} batch {args.batch} "
                  f"({result['parameters']} parameters), AdamW, "
                  f"{'bf16 autocast' if args.precision == 'bf16' else 'fp32 (no autocast)'}, "
                  f"ampscope.torch.LossScaler, cpu, {args.threads} threads")
    f = {
        "torch_agent_overhead_ratio_default": statistics.median(paired["default"]),
        "torch_agent_overhead_ratio_full": statistics.median(paired["full"]),
        "torch_agent_step_s_without": step_s["without"],
        "torch_agent_step_s_default": step_s["default"],
        "torch_agent_step_s_full": step_s["full"],
        "torch_agent_training_thread_s_per_step_default":
            sum(result["thread_s"]["default"]) / timed_steps,
        "torch_agent_training_thread_s_per_step_full":
            sum(result["thread_s"]["full"]) / timed_steps,
        "torch_agent_bench_model": model_desc,
        "torch_agent_bench_rounds": args.rounds,
        "torch_agent_bench_cpu": cpu_model(),
        "torch_agent_bench_steps_per_block": n,
        "torch_agent_bench_warmup_steps": args.warmup_steps,
        "torch_agent_bench_threads": args.threads,
        "torch_agent_bench_precision": args.precision,
        "torch_agent_bench_precision_why": precision_why,
        "torch_agent_bench_omp_wait_policy": wait_policy,
        "torch_agent_bench_torch_version": torch.__version__,
        "torch_agent_bench_cpu_logical_cores": os.cpu_count(),
        "torch_agent_bench_timestamp": started,
        "torch_agent_bench_load_average_1min_start": load_start,
        "torch_agent_bench_load_average_1min_end": load_average(),
        "torch_agent_bench_figure": "median over rounds of (monitored block time / unmonitored "
                                    "block time of the same round)",
        "torch_agent_overhead_ratio_of_medians_default": step_s["default"] / step_s["without"],
        "torch_agent_overhead_ratio_of_medians_full": step_s["full"] / step_s["without"],
        "torch_agent_overhead_ratios_default": [round(x, 4) for x in paired["default"]],
        "torch_agent_overhead_ratios_full": [round(x, 4) for x in paired["full"]],
        # The same paired medians from CPU time instead of wall-clock time: of the thread that
        # runs the loop (time descheduled does not count; with --threads 1 the whole step's
        # compute and the monitor's synchronous work), and of the whole process (adds the
        # agent's worker and sender threads and torch's other threads).
        "torch_agent_thread_cpu_ratio_default": statistics.median(paired_thread["default"]),
        "torch_agent_thread_cpu_ratio_full": statistics.median(paired_thread["full"]),
        "torch_agent_process_cpu_ratio_default": statistics.median(paired_process["default"]),
        "torch_agent_process_cpu_ratio_full": statistics.median(paired_process["full"]),
        "torch_agent_thread_cpu_s_per_step_without":
            statistics.median(result["thread_cpu"]["without"]) / n,
        "torch_agent_bench_monitors_not_fully_acked": sum(result["unacked"].values()),
        "torch_agent_bench_dropped": sum(result["dropped"].values()),
        "torch_agent_bench_notices": result["notices"],
        "torch_agent_bench_loss_first_last": [round(result["first_loss"], 4),
                                              round(result["last_loss"], 4)],
        "torch_agent_bench_cleared_env": cleared,
        # A scale that moved would have made the step after it a full-statistics step.
        "torch_agent_bench_scale_initial_final": [args.init_scale, result["final_scale"]],
        "torch_agent_error": None,  # replaces the error of a failed earlier run in results.json
    }
    if args.agent_option:
        f["torch_agent_bench_agent_options"] = args.agent_option
    with open(args.out, "w") as out:
        json.dump(f, out, indent=2, sort_keys=True)
        out.write("\n")
    print(f"pytorch monitor overhead: default {f['torch_agent_overhead_ratio_default']:.3f}, "
          f"full {f['torch_agent_overhead_ratio_full']:.3f} (training thread's CPU time: "
          f"{f['torch_agent_thread_cpu_ratio_default']:.3f}, "
          f"{f['torch_agent_thread_cpu_ratio_full']:.3f}; step "
          f"{step_s['without'] * 1e3:.1f} ms without the monitor; agent on the training thread "
          f"{f['torch_agent_training_thread_s_per_step_default'] * 1e3:.2f} / "
          f"{f['torch_agent_training_thread_s_per_step_full'] * 1e3:.2f} ms per step; "
          f"{args.precision}, {cpu_model()}, {args.threads} threads, torch "
          f"{torch.__version__})")
    for note in result["notices"]:
        print(f"  monitor notice: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
