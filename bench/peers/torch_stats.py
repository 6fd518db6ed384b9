"""PyTorch peer of the statistics benchmark (bench/stats_bench.cc).

Computes what ampscope::compute_stats computes -- NaN/+Inf/-Inf/zero counts, max |x| and min
nonzero |x| over finite values, FP64 sum and sum of squares, the binade histogram
bincount(floor(log2|x|)) and, for each `--targets` entry FORMAT@K, the counts of finite values
whose x * 2^K overflows, underflows or is subnormal in FORMAT (compares of |x| in FP64 against
the format's rounding thresholds) -- the way a PyTorch user would write it, on the CPU, on a
tensor of the same size and dtype holding the same kind of data (N(0, 1e-3) with the specials
of bench/gradient_data.h at the same positions; the normals come from torch's generator, so
only the special counts match the C++ run exactly). Its sums are plain FP64 sums, not the
exactly rounded ones compute_stats returns, so compute_stats still does a little more.

Timing: one warm-up call on a 1 Mi-element tensor of the same dtype (starts the thread pool and
the kernels; every full-size call allocates and page-faults its temporaries afresh anyway),
then up to `--reps` full-size calls, stopping early once `--budget-s` seconds are spent (at
least one call: a call takes seconds here); the median of the calls made is reported with
their count. Writes a JSON fragment of flat `torch_*` keys. Run it with an interpreter that has torch (Debian's
python3-torch); if torch is missing or a dtype fails, the fragment says so instead.
"""

import argparse
import json
import math
import statistics
import sys
import time

CHUNK = 1 << 16  # kGradientChunk in bench/gradient_data.h
SPECIALS = ((17, math.nan), (4242, math.inf), (9999, -math.inf), (31337, 1e5))
HIST_MIN_EXPONENT = -149
HIST_BINS = 277


def make_gradients(torch, numel, dtype, stddev=1e-3, seed=42):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g, dtype=torch.float32).mul_(stddev)
    x[512::1024] = 0.0
    for offset, value in SPECIALS:
        x[offset::CHUNK] = value
    return x.to(dtype)


# Rounding thresholds of x * 2^k in each target format (docs/numerics.md): overflow from
# `overflow` on (inclusive unless the format rounds its tie to max finite, as E4M3 does),
# underflow up to half the smallest subnormal, subnormal below min normal minus that half.
FORMATS = {
    "fp32": ((2 - 2 ** -24) * 2.0 ** 127, True, 2.0 ** -149, 2.0 ** -126),
    "fp16": (65520.0, True, 2.0 ** -24, 2.0 ** -14),
    "bf16": ((2 - 2 ** -8) * 2.0 ** 127, True, 2.0 ** -133, 2.0 ** -126),
    "e4m3": (464.0, False, 2.0 ** -9, 2.0 ** -6),
    "e5m2": (61440.0, True, 2.0 ** -16, 2.0 ** -14),
}


def parse_targets(text):
    targets = []
    for item in filter(None, text.split(",")):
        name, _, scale = item.partition("@")
        targets.append((name, int(scale or 0)))
    return targets


def target_counts(torch, magnitude_wide, name, scale_log2):
    overflow_at, inclusive, min_subnormal, min_normal = FORMATS[name]
    y = magnitude_wide * (2.0 ** scale_log2)
    overflow = (y >= overflow_at) if inclusive else (y > overflow_at)
    nonzero = y != 0
    underflow = nonzero & (y <= min_subnormal / 2)
    subnormal = (y > min_subnormal / 2) & (y < min_normal - min_subnormal / 2)
    return {"overflow": overflow.sum().item(), "underflow": underflow.sum().item(),
            "subnormal": subnormal.sum().item()}


def tensor_stats(torch, x, targets=()):
    nan = torch.isnan(x).sum().item()
    pos_inf = torch.isposinf(x).sum().item()
    neg_inf = torch.isneginf(x).sum().item()
    finite = x[torch.isfinite(x)]
    magnitude = finite.abs()
    nonzero = magnitude[magnitude != 0]
    wide = finite.double()
    # log2 is not implemented for CPU half tensors, and bf16 would round the exponent: go to fp32.
    exponents = torch.floor(torch.log2(nonzero.float())).long()
    histogram = torch.bincount(exponents - HIST_MIN_EXPONENT, minlength=HIST_BINS)
    return {
        "numel": x.numel(),
        "zeros": finite.numel() - nonzero.numel(),
        "nan": nan,
        "pos_inf": pos_inf,
        "neg_inf": neg_inf,
        "max_abs": magnitude.max().item() if magnitude.numel() else 0.0,
        "min_abs_nonzero": nonzero.min().item() if nonzero.numel() else 0.0,
        "sum": wide.sum().item(),
        "sum_sq": wide.square().sum().item(),
        "histogram_total": histogram.sum().item(),
        "targets": {f"{name}@{k}": target_counts(torch, wide.abs(), name, k)
                    for name, k in targets},
    }


def time_calls(fn, reps, budget_s):
    seconds = []
    while len(seconds) < reps and (not seconds or sum(seconds) < budget_s):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buffer-bytes", type=int, required=True, help="bytes per tensor")
    parser.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16")
    parser.add_argument("--targets", default="fp16@0,e4m3@0",
                        help="what-if targets FORMAT@K, as given to ampscope_stats_bench")
    parser.add_argument("--reps", type=int, default=3, help="most timed calls per dtype")
    parser.add_argument("--budget-s", type=float, default=20.0,
                        help="no further timed call of a dtype once this many seconds are spent")
    parser.add_argument("--out", required=True, help="JSON fragment to write")
    args = parser.parse_args()

    fragment = {}
    try:
        import torch
    except ImportError as e:
        fragment["torch_error"] = f"cannot import torch: {e}"
        print(f"torch_stats.py: {fragment['torch_error']}", file=sys.stderr)
    else:
        torch.set_num_threads(args.threads)
        targets = parse_targets(args.targets)
        fragment.update(torch_version=torch.__version__, torch_threads=torch.get_num_threads(),
                        torch_targets=args.targets,
                        torch_timing=f"median of up to {args.reps} calls within "
                                     f"{args.budget_s:g} s, after a warm-up on a small tensor")
        dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        for name in args.dtypes.split(","):
            dtype = dtypes[name]
            try:
                numel = args.buffer_bytes // element_size(torch, dtype)
                tensor_stats(torch, make_gradients(torch, min(numel, 1 << 20), dtype), targets)
                x = make_gradients(torch, numel, dtype)
                check = {}
                seconds = time_calls(lambda: check.update(tensor_stats(torch, x, targets)),
                                     args.reps, args.budget_s)
                median = statistics.median(seconds)
                del x
            except Exception as e:  # a dtype torch cannot do is a finding, not a crash
                fragment[f"torch_error_{name}"] = f"{type(e).__name__}: {e}"
                print(f"  torch {name}: failed: {e}", flush=True)
                continue
            fragment[f"torch_ms_per_call_{name}"] = median * 1e3
            fragment[f"torch_gbps_{name}"] = args.buffer_bytes / median / 1e9
            fragment[f"torch_timed_calls_{name}"] = len(seconds)
            fragment[f"torch_check_{name}"] = check
            print(f"  torch {name:4} {median * 1e3:10.2f} ms/call  "
                  f"{args.buffer_bytes / median / 1e9:7.3f} GB/s  ({len(seconds)} calls)",
                  flush=True)
    with open(args.out, "w") as f:
        json.dump(fragment, f, indent=2, sort_keys=True)
        f.write("\n")


def element_size(torch, dtype):
    return torch.tensor([], dtype=dtype).element_size()


if __name__ == "__main__":
    main()
