#!/usr/bin/python3
"""`ampscope stats --target RECIPE` against a NumPy reference written from the specifications.

The reference below is written from the rules (OCP Microscaling Formats v1.0 for MX, NVIDIA's
two-level NVFP4 scaling, Transformer Engine's current and delayed scaling, DeepSeek-V3's FP32
tile scales; docs/numerics.md "Scaled recipes" states each), not from kernels/cpu/recipe.cc:
element rounding is rint (ties to even) on the value divided by its quantum, in FP64, with the
scaling arithmetic in FP32 where the rule says fl32. It generates .npy tensors that hold every
value of E2M1, E3M2, E2M3, E4M3 and E5M2 at several block scales, the midpoints between them,
blocks at every scale edge, blocks whose amax rounds the scale down into saturation, NaN, Inf
and zero blocks, and normal data at several magnitudes; runs the real binary once per file with
every recipe; and compares every count exactly, the SQNR sums within 1e-9 relative (the SQNR in
dB within 1e-9 relative or, near 0 dB, 1e-9 dB).

Usage: recipe_reference_test.py AMPSCOPE_BINARY
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)

# Element formats from their definitions: (mantissa bits, min normal exponent, emax, max).
ELEMENTS = {
    "e4m3": (3, -6, 8, 448.0),
    "e5m2": (2, -14, 15, 57344.0),
    "e3m2": (2, -2, 4, 28.0),
    "e2m3": (3, 0, 2, 7.5),
    "e2m1": (1, 0, 2, 6.0),
}
MX = {"mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2", "mxfp6_e3m2": "e3m2", "mxfp6_e2m3": "e2m3",
      "mxfp4": "e2m1"}

RECIPES = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxfp8_e4m3:ceil",
           "mxfp4:ceil", "mxfp8_e4m3:block=32x1", "nvfp4", "nvfp4:block=16x16", "e4m3:current",
           "e5m2:current", "e2m1:current", "e4m3:current:margin=2", "e4m3:scale=0.5",
           "e5m2:scale=1000", "e3m2:scale=3", "e4m3:tile=1x128", "e4m3:tile=128x128",
           "e2m3:tile=1x128"]


def grid(name):
    """Every non-negative finite value of the element format, ascending."""
    mbits, emin, emax, vmax = ELEMENTS[name]
    values = [k * 2.0 ** (emin - mbits) for k in range(2 ** mbits)]  # zero and subnormals
    for e in range(emin, emax + 1):
        values += [(1 + k / 2 ** mbits) * 2.0 ** e for k in range(2 ** mbits)]
    return np.array(sorted(v for v in values if v <= vmax))


def round_element(y, name):
    """y (finite FP64 array) rounded to nearest even into the element, saturating.

    Returns (q, rounded magnitude before the clamp)."""
    mbits, emin, _, vmax = ELEMENTS[name]
    a = np.abs(y)
    _, ex = np.frexp(a)  # a = m * 2^ex, m in [0.5, 1): binade ex - 1
    quantum = np.maximum(ex - 1, emin) - mbits
    r = np.ldexp(np.rint(np.ldexp(a, -quantum)), quantum)
    r = np.where(a == 0, 0.0, r)
    return np.copysign(np.minimum(r, vmax), y), r


def floor_log2(v):
    _, ex = np.frexp(np.float64(v))
    return int(ex) - 1


def parse(text):
    parts = text.split(":")
    r = {"text": text, "block": None, "ceil": "ceil" in parts[1:], "margin": 0}
    for p in parts[1:]:
        if p.startswith("block=") or p.startswith("tile="):
            r["block"] = tuple(int(v) for v in p.split("=")[1].split("x"))
        if p.startswith("margin="):
            r["margin"] = int(p.split("=")[1])
        if p.startswith("scale="):
            r["scale"] = F32(p.split("=")[1])
    if parts[0] in MX:
        r.update(kind="mx", element=MX[parts[0]])
        r["block"] = r["block"] or (1, 32)
    elif parts[0] == "nvfp4":
        r.update(kind="nvfp4", element="e2m1")
        r["block"] = r["block"] or (1, 16)
    else:
        r["element"] = parts[0]
        r["kind"] = "tile" if "tile=" in text else "delayed" if "scale=" in text else "current"
    return r


class Counts:
    def __init__(self):
        self.c = dict(values=0, nonfinite=0, underflow=0, subnormal=0, saturated=0, overflow=0,
                      blocks=0, zero_blocks=0, saturated_blocks=0, nan_blocks=0)
        self.signal = []
        self.error = []
        self.binades = []

    def add_rounded(self, x, q, r, deq, name):
        """x: finite FP32 inputs; q: rounded and clamped; r: rounded magnitude; deq: decoded."""
        _, emin, _, vmax = ELEMENTS[name]
        self.c["underflow"] += int(np.sum((x != 0) & (q == 0)))
        self.c["subnormal"] += int(np.sum((q != 0) & (np.abs(q) < 2.0 ** emin)))
        saturated = int(np.sum(r > vmax))
        self.c["saturated"] += saturated
        ok = np.isfinite(deq)
        self.c["overflow"] += int(np.sum(~ok))
        x64 = x[ok].astype(np.float64)
        self.signal.append(x64 * x64)
        err = x64 - deq[ok].astype(np.float64)
        self.error.append(err * err)
        return saturated


def per_tensor(x, rec):
    name = rec["element"]
    vmax = ELEMENTS[name][3]
    out = Counts()
    finite = np.isfinite(x)
    xf = x[finite]
    out.c["values"] = int(xf.size)
    out.c["nonfinite"] = int(x.size - xf.size)
    amax = F32(np.max(np.abs(xf))) if xf.size else F32(0)
    if rec["kind"] == "delayed":
        s = rec["scale"]
    elif amax == 0:
        s = F32(1)
    else:
        with np.errstate(over="ignore"):
            s = F32(vmax) / amax
        if np.isinf(s):
            s = F32(FLT_MAX)
        s = F32(np.ldexp(s, -rec["margin"]))
        s = max(s, F32(2.0 ** -126))
    with np.errstate(over="ignore"):
        y = (xf * s).astype(np.float64)  # fl32(x * s)
        q, r = round_element(y, name)
        deq = q.astype(F32) * (F32(1) / s)
    out.add_rounded(xf, q, r, deq, name)
    out.tensor_scale = float(s)
    out.amax = float(amax)
    return out


def blocked(x2, rec):
    """Block recipes on a [rows, cols] FP32 array: blocks of br x bc from (0, 0), ragged edges."""
    name = rec["element"]
    vmax = ELEMENTS[name][3]
    emax = ELEMENTS[name][2]
    br, bc = rec["block"]
    rows, cols = x2.shape
    out = Counts()
    finite_all = np.isfinite(x2)
    out.c["values"] = int(np.sum(finite_all))
    out.c["nonfinite"] = int(x2.size - out.c["values"])
    amax_t = F32(np.max(np.abs(x2[finite_all]))) if out.c["values"] else F32(0)
    g = F32(1)
    if rec["kind"] == "nvfp4" and amax_t != 0:
        g = amax_t / F32(448.0 * 6.0)
        if g == 0:
            g = F32(2.0 ** -149)
    out.tensor_scale = float(g) if rec["kind"] == "nvfp4" else 0.0
    out.amax = float(amax_t)
    for r0 in range(0, rows, br):
        for c0 in range(0, cols, bc):
            b = x2[r0:r0 + br, c0:c0 + bc].reshape(-1)
            out.c["blocks"] += 1
            fin = np.isfinite(b)
            if not np.all(fin):  # scale NaN: every element decodes to NaN
                out.c["nan_blocks"] += 1
                out.c["overflow"] += int(np.sum(fin))
                continue
            a = F32(np.max(np.abs(b)))
            if a == 0:
                out.c["zero_blocks"] += 1
                continue
            if rec["kind"] == "mx":
                k = floor_log2(a) - emax
                if rec["ceil"] and float(a) > vmax * 2.0 ** k:
                    k += 1
                k = min(max(k, -127), 127)
                y = np.ldexp(b.astype(np.float64), -k)  # exact
                q, r = round_element(y, name)
                with np.errstate(over="ignore"):
                    deq = np.ldexp(q, k).astype(F32)  # q x 2^k: exact, or beyond FP32
                out.binades.append(k)
            else:
                if rec["kind"] == "tile":
                    d = a / F32(vmax)
                    if d == 0:
                        d = F32(2.0 ** -149)
                else:
                    code, _ = round_element(np.array([float((a / F32(6)) / g)]), "e4m3")
                    d = F32(code[0]) * g
                    if d == 0:  # the block quantises to zeros
                        q = np.zeros_like(b, dtype=np.float64)
                        out.add_rounded(b, q, q, q.astype(F32), name)
                        continue
                y = (b / d).astype(np.float64)  # fl32(x / d)
                q, r = round_element(y, name)
                with np.errstate(over="ignore"):
                    deq = q.astype(F32) * d
                out.binades.append(floor_log2(d))
            if out.add_rounded(b, q, r, deq, name):
                out.c["saturated_blocks"] += 1
    return out


def reference(x, rec):
    """x: the tensor as FP32, shape as saved; rows are the last dimension."""
    cols = x.shape[-1] if x.ndim else 1
    x2 = x.reshape(-1, cols) if x.size else x.reshape(0, max(cols, 1))
    if rec["kind"] in ("current", "delayed"):
        return per_tensor(x2.reshape(-1), rec)
    return blocked(x2, rec)


# ---- Data ---------------------------------------------------------------------------------

def pattern_blocks(name, block, scales):
    """Blocks of `block` values: the element's grid values and their midpoints (signed), the
    tie above max, each block led by a marker of max x X so that its MX scale is X."""
    g = grid(name)
    _, _, emax, vmax = ELEMENTS[name]
    mids = (g[1:] + g[:-1]) / 2
    top_tie = vmax + (2.0 ** (emax + 1) - vmax) / 2  # the tie between max and the next binade
    body = np.concatenate([g, -g, mids, -mids, [top_tie, -top_tie, vmax * 1.0625]])
    per = block - 1
    body = np.concatenate([body, np.zeros((-body.size) % per)])
    out = []
    for x in scales:
        for i in range(0, body.size, per):
            out.append(np.concatenate([[vmax * x], body[i:i + per] * x]))
    return np.concatenate(out)


def edge_blocks(block):
    """Blocks at every scale edge of every element, one block each (value, then zeros)."""
    firsts = []
    for name, (_, _, emax, vmax) in ELEMENTS.items():
        for e in (-20, 0, 7):
            p = 2.0 ** (e + emax)
            firsts += [p, np.nextafter(F32(2 * p), F32(0)),  # amax a power of two; just below
                       vmax * 2.0 ** e * 1.07]  # amax rounds the scale down into saturation
    firsts += [480.0, 2.0 ** -140, 2.0 ** -136, 2.0 ** -149, FLT_MAX, -FLT_MAX, 1e38, 3e-39]
    blocks = []
    for f in firsts:
        b = np.zeros(block)
        b[0] = f
        b[1] = f / 3
        b[2] = f * 2.0 ** -12  # far below the amax: underflow in most elements
        blocks.append(b)
    nan = np.ones(block)
    nan[3] = np.nan
    inf = np.full(block, 2.0)
    inf[5] = -np.inf
    blocks += [nan, inf, np.zeros(block)]
    return np.concatenate(blocks)


def normal_rows(rng, n):
    mags = np.ldexp(1.0, rng.integers(-24, 24, size=n // 64)).repeat(64)
    return rng.standard_normal(n) * mags


def make_tensor(cols, seed):
    rng = np.random.default_rng(seed)
    parts = []
    for name in ELEMENTS:
        parts.append(pattern_blocks(name, 32, [2.0 ** -30, 2.0 ** -3, 1.0, 2.0 ** 5, 2.0 ** 40]))
        parts.append(pattern_blocks(name, 16, [2.0 ** -8, 1.0, 2.0 ** 9]))
    parts.append(edge_blocks(32))
    parts.append(edge_blocks(16))
    parts.append(normal_rows(rng, 128 * 256))
    # Each part padded to whole 32-element blocks, so that its blocks line up in the 256 view.
    parts = [np.concatenate([p, np.zeros((-p.size) % 32)]) for p in parts]
    x = np.concatenate(parts)
    x = np.concatenate([x, np.zeros((-x.size) % cols)])
    with np.errstate(over="ignore"):
        return x.astype(F32).reshape(-1, cols)


# ---- Comparison ---------------------------------------------------------------------------

def close(a, b, rel=1e-9):
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


def compare(binary, path, x, failures):
    args = [binary, "stats", "--json", path]
    for r in RECIPES:
        args += ["--target", r]
    run = subprocess.run(args, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        failures.append(f"{path}: exit {run.returncode}: {run.stderr.strip()}")
        return
    got = json.loads(run.stdout)["recipes"]
    assert [g["recipe"] for g in got] == RECIPES, [g["recipe"] for g in got]
    for g, text in zip(got, RECIPES):
        want = reference(x, parse(text))
        where = f"{os.path.basename(path)} {text}"
        for key, value in want.c.items():
            if g[key] != value:
                failures.append(f"{where}: {key} {g[key]} != reference {value}")
        signal = float(np.sum(np.concatenate(want.signal))) if want.signal else 0.0
        error = float(np.sum(np.concatenate(want.error))) if want.error else 0.0
        for key, value in (("signal_sq", signal), ("error_sq", error)):
            if not close(g[key], value):
                failures.append(f"{where}: {key} {g[key]!r} != reference {value!r}")
        if signal > 0 and error > 0:
            db = 10 * math.log10(signal / error)
            # Relative near 0 dB would ask for more than the sums' last bits: 1e-9 dB there.
            got_db = g["sqnr_db"]
            if got_db is None or not (close(got_db, db) or abs(got_db - db) < 1e-9):
                failures.append(f"{where}: sqnr_db {g['sqnr_db']} != reference {db}")
        if g["tensor_scale"] != want.tensor_scale:
            failures.append(f"{where}: tensor_scale {g['tensor_scale']} != {want.tensor_scale}")
        if g["amax"] != want.amax:
            failures.append(f"{where}: amax {g['amax']} != {want.amax}")
        hist = g["scale_histogram"]
        got_bins = {hist["min_exponent"] + i: n for i, n in enumerate(hist["counts"]) if n}
        want_bins = {}
        for e in want.binades:
            want_bins[e] = want_bins.get(e, 0) + 1
        if got_bins != want_bins:
            failures.append(f"{where}: scale histogram {got_bins} != reference {want_bins}")


def main():
    binary = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(4)
        cases = [("normal", normal_rows(rng, 64 * 512).astype(F32).reshape(64, 512), None),
                 ("rows256", make_tensor(256, 1), None),
                 ("ragged100", make_tensor(100, 2), None),  # every block shape is ragged here
                 ("fp16", make_tensor(160, 3), np.float16)]
        for label, x, store in cases:
            path = os.path.join(tmp, label + ".npy")
            if store is not None:
                with np.errstate(over="ignore"):
                    stored = x.astype(store)
                np.save(path, stored)
                x = stored.astype(F32)  # what the tool reads, widened exactly
            else:
                np.save(path, x)
            compare(binary, path, x, failures)
            print(f"{label}: shape {x.shape}, {len(RECIPES)} recipes compared")
    for f in failures[:40]:
        print("FAIL", f)
    if failures:
        print(f"{len(failures)} mismatches")
        return 1
    print("all counts equal the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
