"""Derived figures and the table of the statistics benchmark.

`stats_report.py STATS_FRAGMENT TORCH_FRAGMENT OUT_FRAGMENT` reads what ampscope_stats_bench
and peers/torch_stats.py wrote, writes the figures that need both (the PyTorch speedups, whether
the targets are met) to OUT_FRAGMENT and prints the table. It never fails on a missed target;
a missing PyTorch figure shows as "n/a".
"""

import json
import sys

DTYPES = ("fp32", "fp16", "bf16")
TARGET_BANDWIDTH_RATIO = 0.5  # of the memory-read speed of the same buffer
TARGET_TORCH_SPEEDUP = 100.0  # PyTorch time / ampscope time, same-size tensor


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def derive(stats, torch):
    out = {"stats_target_bandwidth_ratio": TARGET_BANDWIDTH_RATIO,
           "stats_target_torch_speedup": TARGET_TORCH_SPEEDUP}
    for d in DTYPES:
        out[f"stats_bandwidth_target_met_{d}"] = (
            stats[f"stats_bandwidth_ratio_{d}"] >= TARGET_BANDWIDTH_RATIO)
        torch_ms = torch.get(f"torch_ms_per_call_{d}")
        speedup = torch_ms / stats[f"stats_ms_per_call_{d}"] if torch_ms else None
        out[f"stats_vs_torch_speedup_{d}"] = speedup
        out[f"stats_torch_target_met_{d}"] = (
            None if speedup is None else speedup >= TARGET_TORCH_SPEEDUP)
    return out


def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def yes_no(flag):
    return "n/a" if flag is None else ("yes" if flag else "NO")


def print_table(stats, torch, derived):
    mib = stats["stats_buffer_bytes"] / (1 << 20)
    print()
    print(f"ampscope statistics benchmark  {stats['stats_timestamp']}  "
          f"({stats.get('stats_build_type', '?')} build)")
    print(f"  cpu {stats['cpu_model']}, {stats['stats_threads']} threads, simd "
          f"{stats['stats_simd_level']} (max {stats['stats_simd_max_supported']}), "
          f"{mib:g} MiB per buffer, targets {stats['stats_targets']}")
    print(f"  ampscope: median of {stats['stats_timed_calls']} calls after "
          f"{stats['stats_warmup_calls']} warm-up, read and stats interleaved; torch "
          f"{torch.get('torch_version', 'n/a')}: {torch.get('torch_timing', 'not run')}")
    print("  GB/s = 1e9 bytes of input read per second; ratio = stats GB/s / memory-read GB/s")
    load = stats.get("stats_load_average_1min", -1)
    if load > 0.5:
        print(f"  note: load average {load:.1f} at start on {stats['cpu_logical_cores']} logical "
              "cores; other work was running and every figure is noisy")
    print()
    head = (f"  {'dtype':5} | {'read ms':>8} {'GB/s':>7} | {'stats ms':>8} {'GB/s':>7} | "
            f"{'ratio':>5} {'>=0.5':>5} | {'torch ms':>9} {'GB/s':>7} | {'speedup':>8} "
            f"{'>=100x':>6}")
    print(head)
    print("  " + "-" * (len(head) - 2))
    for d in DTYPES:
        print(f"  {d:5} | {stats[f'memory_read_ms_per_call_{d}']:8.2f} "
              f"{stats[f'memory_read_gbps_{d}']:7.2f} | {stats[f'stats_ms_per_call_{d}']:8.2f} "
              f"{stats[f'stats_gbps_{d}']:7.2f} | {stats[f'stats_bandwidth_ratio_{d}']:5.2f} "
              f"{yes_no(derived[f'stats_bandwidth_target_met_{d}']):>5} | "
              f"{fmt(torch.get(f'torch_ms_per_call_{d}'), '9.1f'):>9} "
              f"{fmt(torch.get(f'torch_gbps_{d}'), '7.3f'):>7} | "
              f"{fmt(derived[f'stats_vs_torch_speedup_{d}'], '7.0f') + 'x':>8} "
              f"{yes_no(derived[f'stats_torch_target_met_{d}']):>6}")
    print("  ratio from the fastest calls instead of the medians: " + ", ".join(
        f"{d} {stats[f'stats_bandwidth_ratio_best_{d}']:.2f}" for d in DTYPES))
    levels = ["scalar", "avx2", "avx512"]
    levels = levels[:levels.index(stats["stats_simd_level"]) + 1]
    print()
    print(f"  compute_stats by SIMD level (GB/s, median of {stats['stats_simd_timed_calls']} "
          "calls per level, levels interleaved on the same buffer):")
    print(f"  {'dtype':5} | " + " ".join(f"{lv:>8}" for lv in levels) +
          f" | {stats['stats_simd_level']}/scalar")
    for d in DTYPES:
        print(f"  {d:5} | " + " ".join(f"{stats[f'stats_gbps_{d}_{lv}']:8.2f}" for lv in levels) +
              f" | {stats[f'stats_vector_speedup_{d}']:6.1f}x")
    print()
    print(f"  fp32 without targets: {stats['stats_ms_per_call_fp32_no_targets']:.2f} ms/call, "
          f"{stats['stats_gbps_fp32_no_targets']:.2f} GB/s (the table above includes the targets)")
    if "stats_mx_recipe" in stats:
        print(f"  recipe_counts {stats['stats_mx_recipe']} (rows of {stats['stats_mx_row_length']}, "
              f"{stats['stats_mx_threads']} thread): " + ", ".join(
                  f"{d} {stats[f'stats_gbps_{d}_mx']:.2f} GB/s" for d in DTYPES))
    for d in DTYPES:
        if f"torch_error_{d}" in torch:
            print(f"  torch {d}: {torch[f'torch_error_{d}']}")
    if "torch_error" in torch:
        print(f"  torch: {torch['torch_error']}")
    print()


def main():
    if len(sys.argv) != 4:
        print("usage: stats_report.py STATS_FRAGMENT TORCH_FRAGMENT OUT_FRAGMENT",
              file=sys.stderr)
        return 2
    stats, torch = load(sys.argv[1]), load(sys.argv[2])
    if "stats_bandwidth_ratio_fp32" not in stats:
        print(f"stats_report.py: no statistics results in {sys.argv[1]}", file=sys.stderr)
        return 1
    derived = derive(stats, torch)
    with open(sys.argv[3], "w") as f:
        json.dump(derived, f, indent=2, sort_keys=True)
        f.write("\n")
    print_table(stats, torch, derived)
    return 0


if __name__ == "__main__":
    sys.exit(main())
