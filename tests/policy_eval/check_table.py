#!/usr/bin/env python3
"""Checks what bench/policy_eval/policy_eval.py wrote: `check_table.py OUT_DIR`.

table.md must have exactly the columns docs/policy.md describes (plus the harness's bookkeeping ones),
one row per scenario and policy, every run completed with a number in every figure column;
runs.json must agree with the table; the fragment must carry the three results keys with their
targets; the three plots must be PNG files. Prints every problem, exits 1 if there is one.
"""

import json
import math
import os
import sys

COLUMNS = ["scenario", "policy", "steps", "skipped", "avoidable skipped",
           "steps underflow > 1%", "mean underflow", "final train loss", "final val loss",
           "policy updates", "scale changes", "final scale", "wall s", "completed"]
SCENARIOS = ["defaults", "init-2p24", "grad-shrink", "overflow-spikes", "long"]
POLICIES = ["gradscaler", "hysteresis", "static", "headroom", "headroom-fp32"]
KEYS = ["policy_skip_reduction_vs_gradscaler", "policy_underflow_reduction_vs_gradscaler",
        "policy_val_loss_delta_vs_gradscaler"]
PLOTS = ["loss_scale.png", "cumulative_skipped.png", "underflow.png"]


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def check(out_dir):
    problems = []
    with open(os.path.join(out_dir, "table.md")) as f:
        rows = [cells(l) for l in f if l.startswith("|")]
    if not rows or rows[0] != COLUMNS:
        problems.append(f"table header {rows[0] if rows else None} != {COLUMNS}")
        return problems
    body = [r for r in rows[2:]]
    seen = {(r[0], r[1]) for r in body}
    for s in SCENARIOS:
        for p in POLICIES:
            if (s, p) not in seen:
                problems.append(f"no row for scenario {s}, policy {p}")
    if len(body) != len(SCENARIOS) * len(POLICIES):
        problems.append(f"{len(body)} rows, expected {len(SCENARIOS) * len(POLICIES)}")
    for r in body:
        name = f"{r[0]}/{r[1]}"
        if len(r) != len(COLUMNS):
            problems.append(f"{name}: {len(r)} cells, expected {len(COLUMNS)}")
            continue
        row = dict(zip(COLUMNS, r))
        if row["completed"] != "yes":
            problems.append(f"{name}: did not complete: {row['completed']}")
        for c in ("steps", "skipped", "avoidable skipped", "steps underflow > 1%",
                  "policy updates", "scale changes"):
            if not row[c].isdigit():
                problems.append(f"{name}: {c} is '{row[c]}', not a count")
        for c in ("final train loss", "final val loss", "wall s"):
            try:
                if not math.isfinite(float(row[c])):
                    raise ValueError
            except ValueError:
                problems.append(f"{name}: {c} is '{row[c]}', not a finite number")
        if not row["mean underflow"].endswith("%"):
            problems.append(f"{name}: mean underflow is '{row['mean underflow']}'")
        if row["skipped"].isdigit() and row["avoidable skipped"].isdigit() and \
                int(row["avoidable skipped"]) > int(row["skipped"]):
            problems.append(f"{name}: more avoidable skipped steps than skipped steps")

    with open(os.path.join(out_dir, "runs.json")) as f:
        runs = json.load(f)["runs"]
    for r in body:
        m = runs.get(r[0], {}).get(r[1])
        if m is None:
            problems.append(f"{r[0]}/{r[1]}: missing from runs.json")
        elif str(m["skipped"]) != r[3] or m["steps"] != m["steps_wanted"]:
            problems.append(f"{r[0]}/{r[1]}: runs.json disagrees with the table")

    with open(os.path.join(out_dir, "fragment.json")) as f:
        fragment = json.load(f)
    for k in KEYS:
        if k not in fragment:
            problems.append(f"fragment lacks {k}")
    for k in ("policy_target_skip_reduction", "policy_target_underflow_reduction",
              "policy_target_val_loss_delta"):
        if not isinstance(fragment.get(k), (int, float)):
            problems.append(f"fragment lacks the target {k}")
    for p in PLOTS:
        path = os.path.join(out_dir, p)
        try:
            with open(path, "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    problems.append(f"{p} is not a PNG file")
        except OSError:
            problems.append(f"{p} was not written")
    return problems


def main():
    if len(sys.argv) != 2:
        print("usage: check_table.py OUT_DIR", file=sys.stderr)
        return 2
    try:
        problems = check(sys.argv[1])
    except (OSError, ValueError, KeyError) as e:
        problems = [f"cannot read the harness output: {e}"]
    for p in problems:
        print(f"check_table.py: {p}", file=sys.stderr)
    if not problems:
        print("check_table.py: table, runs, results keys and plots complete")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
