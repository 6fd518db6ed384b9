"""Derived figures and the table of the trainer benchmark.

`trainer_report.py TRAINER_FRAGMENT OUT_FRAGMENT` reads what trainer_bench.py wrote, writes
`trainer_vs_torch_speedup_fp32` and `trainer_vs_torch_speedup_bf16` (ampscope tokens/s over
PyTorch tokens/s; bf16 is ampscope's amp-bf16 against torch's bf16 autocast) and whether the
target is met to OUT_FRAGMENT, and prints the table. It never fails on a missed target; a
missing PyTorch figure gives null and shows as "n/a".
"""

import json
import sys

MODES = ("fp32", "bf16")
TARGET_TORCH_SPEEDUP = 1.0  # ampscope tokens/s / PyTorch tokens/s, same model, batch, threads


def derive(r):
    out = {"trainer_target_torch_speedup": TARGET_TORCH_SPEEDUP}
    for m in MODES:
        ours, theirs = r.get(f"trainer_tokens_per_s_{m}"), r.get(f"trainer_torch_tokens_per_s_{m}")
        speedup = ours / theirs if ours and theirs else None
        out[f"trainer_vs_torch_speedup_{m}"] = speedup
        out[f"trainer_torch_target_met_{m}"] = (
            None if speedup is None else speedup >= TARGET_TORCH_SPEEDUP)
    return out


def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def speedup(value):
    return "n/a" if value is None else f"{value:.2f}x"


def print_table(r, d):
    model, timing = r["trainer_model"], r["trainer_timing"]
    print()
    print(f"ampscope trainer benchmark  {r['trainer_timestamp']}  "
          f"({r.get('trainer_build_type', '?')} build)")
    print(f"  cpu {r['cpu_model']}, {r['trainer_threads']} threads on both sides, torch "
          f"{r.get('trainer_torch_version', 'n/a')} (OMP_WAIT_POLICY="
          f"{r['trainer_torch_omp_wait_policy']})")
    print(f"  model: vocab {model['vocab']}, context {model['context']}, width {model['width']}, "
          f"{model['heads']} heads, {model['layers']} layers, {model['parameters']} parameters; "
          f"batch {r['trainer_batch']} x {r['trainer_context']} = {r['trainer_tokens_per_step']} "
          "tokens per step")
    print(f"  tokens/s: median of {timing['rounds']} rounds x {timing['windows_per_run']} windows "
          f"of {timing['steps_per_window']} steps, after {timing['warmup_steps']} warm-up steps "
          "per run; ampscope and torch runs alternate")
    load = max(r["trainer_load_average_1min_start"], r["trainer_load_average_1min_end"])
    if load > 0.5:
        print(f"  note: load average {r['trainer_load_average_1min_start']:.1f} -> "
              f"{r['trainer_load_average_1min_end']:.1f} on {r['cpu_logical_cores']} logical "
              "cores; other work was running and every figure is noisy")
    print()
    head = (f"  {'mode':4} | {'ampscope tok/s':>14} | {'torch tok/s':>11} | {'speedup':>7} "
            f"{'>=1.0':>5}")
    print(head)
    print("  " + "-" * (len(head) - 2))
    for m in MODES:
        met = d[f"trainer_torch_target_met_{m}"]
        print(f"  {m:4} | {fmt(r.get(f'trainer_tokens_per_s_{m}'), '14.0f')} | "
              f"{fmt(r.get(f'trainer_torch_tokens_per_s_{m}'), '11.0f'):>11} | "
              f"{speedup(d[f'trainer_vs_torch_speedup_{m}']):>7} "
              f"{'n/a' if met is None else ('yes' if met else 'NO'):>5}")
    print("  (bf16: ampscope amp-bf16 against torch.autocast('cpu', dtype=torch.bfloat16))")
    for m in MODES:
        if f"trainer_compare_tokens_per_s_{m}" in r:
            print(f"  compare build {m}: {r[f'trainer_compare_tokens_per_s_{m}']:.0f} tok/s; "
                  f"this build / compare = {r[f'trainer_vs_compare_speedup_{m}']:.2f}x")
    for key in sorted(r):
        if key.startswith("trainer_torch_error"):
            print(f"  {key}: {r[key]}")
    print()


def main():
    if len(sys.argv) != 3:
        print("usage: trainer_report.py TRAINER_FRAGMENT OUT_FRAGMENT", file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        print(f"trainer_report.py: cannot read {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    if "trainer_tokens_per_s_fp32" not in r:
        print(f"trainer_report.py: no trainer results in {sys.argv[1]}", file=sys.stderr)
        return 1
    d = derive(r)
    with open(sys.argv[2], "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")
    print_table(r, d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
