#!/usr/bin/env python3
"""Checks what bench/policy_eval/policy_eval.py wrote: `check_table.py OUT_DIR`.

table.md must have its sections with exactly the columns docs/policy.md describes: the summary
(one row per scenario and policy), the goals, and the per-seed runs, where every scenario runs
gradscaler and headroom (plus headroom-fp32 on activation-overflow and headroom-live on long) on
the same seeds, at least as many as the profile promises, every run completed with a number in
every figure column; runs.json must agree with the table; the fragment must carry the results
keys with their targets (the val-loss CI as [low, high] around the mean); the plots must be PNG
files. Prints every problem, exits 1 if there is one.
"""

import json
import math
import os
import sys

SUMMARY_COLUMNS = ["scenario", "policy", "seeds", "steps", "skipped", "skipped / 10k",
                   "avoidable", "avoidable / 10k", "avoidable after first decision (all seeds)",
                   "steps underflow > 1%", "mean underflow", "final val loss",
                   "val loss - gradscaler [95% CI]", "policy updates", "wall s", "completed"]
PER_SEED_COLUMNS = ["scenario", "policy", "seed", "steps", "steps measured", "skipped",
                    "skipped / 10k", "avoidable", "avoidable / 10k", "first decision step",
                    "avoidable after first decision", "steps underflow > 1%", "mean underflow",
                    "final train loss", "final val loss", "val loss - gradscaler",
                    "policy updates", "scale changes", "final scale", "fp32 layers (from step)",
                    "wall s", "completed"]
GOAL_COLUMNS = ["goal", "key", "measured", "target", "met"]
SCENARIOS = ["defaults", "init-2p24", "grad-shrink", "overflow-spikes", "activation-overflow",
             "long"]
REQUIRED = {s: ["gradscaler", "headroom"] for s in SCENARIOS}
REQUIRED["activation-overflow"].append("headroom-fp32")
REQUIRED["long"].append("headroom-live")
MIN_SEEDS = {"smoke": 2, "short": 5, "full": 5}
SECTIONS = {"summary": "## Summary", "goals": "## Goals", "per_seed": "## Per-seed runs"}
KEYS = ["policy_skip_reduction_vs_gradscaler", "policy_underflow_reduction_vs_gradscaler",
        "policy_val_loss_delta_vs_gradscaler", "policy_val_loss_delta_ci95",
        "policy_avoidable_skips_after_first_decision",
        "policy_skips_fewer_than_gradscaler_every_scenario_met",
        "policy_live_val_loss_spread_mean", "policy_live_val_loss_spread_max",
        "policy_fp32_fallback_skips_after_decision", "policy_fp32_fallback_throughput_ratio",
        "policy_fp32_fallback_layers"]
TARGETS = ["policy_target_skip_reduction", "policy_target_underflow_reduction",
           "policy_target_val_loss_delta", "policy_target_avoidable_skips_after_first_decision",
           "policy_target_fp32_fallback_skips_after_decision"]
PLOTS = ["loss_scale.png", "cumulative_skipped.png", "underflow.png", "val_loss_delta.png"]
COUNTS = ("steps", "steps measured", "skipped", "avoidable", "steps underflow > 1%",
          "policy updates", "scale changes")
NUMBERS = ("skipped / 10k", "avoidable / 10k", "final train loss", "final val loss", "wall s")


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def sections(path):
    """Markdown tables by the section header above them: {header: [rows]}."""
    out, header = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("## "):
                header = line.strip()
            elif line.startswith("|") and header is not None:
                out.setdefault(header, []).append(cells(line))
    return out


def table(tables, name, columns, problems):
    header = next((h for h in tables if h.startswith(SECTIONS[name])), None)
    rows = tables.get(header, [])
    if not rows:
        problems.append(f"table.md has no '{SECTIONS[name]}' table")
        return []
    if rows[0] != columns:
        problems.append(f"{SECTIONS[name]}: header {rows[0]} != {columns}")
        return []
    body = rows[2:]
    for r in body:
        if len(r) != len(columns):
            problems.append(f"{SECTIONS[name]}: {r[:3]}: {len(r)} cells, expected {len(columns)}")
    return [dict(zip(columns, r)) for r in body if len(r) == len(columns)]


def is_number(text):
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def check_per_seed(rows, min_seeds, problems):
    seeds = {}
    for row in rows:
        name = f"{row['scenario']}/{row['policy']}/seed {row['seed']}"
        seeds.setdefault((row["scenario"], row["policy"]), set()).add(row["seed"])
        if row["completed"] != "yes":
            problems.append(f"{name}: did not complete: {row['completed']}")
        for c in COUNTS:
            if not row[c].isdigit():
                problems.append(f"{name}: {c} is '{row[c]}', not a count")
        for c in NUMBERS:
            if not is_number(row[c]):
                problems.append(f"{name}: {c} is '{row[c]}', not a finite number")
        if not row["mean underflow"].endswith("%"):
            problems.append(f"{name}: mean underflow is '{row['mean underflow']}'")
        if row["skipped"].isdigit() and row["avoidable"].isdigit() and \
                int(row["avoidable"]) > int(row["skipped"]):
            problems.append(f"{name}: more avoidable skipped steps than skipped steps")
        server = row["policy"].startswith("headroom")
        after = row["avoidable after first decision"]
        if server and not (after.isdigit() or after == "n/a"):
            problems.append(f"{name}: avoidable after first decision is '{after}'")
        if row["policy"] != "gradscaler" and not is_number(row["val loss - gradscaler"]):
            problems.append(f"{name}: val loss - gradscaler is '{row['val loss - gradscaler']}'")
    for s in SCENARIOS:
        want = seeds.get((s, "gradscaler"), set())
        if len(want) < min_seeds:
            problems.append(f"per-seed runs: {s}/gradscaler has {len(want)} seeds, expected at "
                            f"least {min_seeds}")
        for p in REQUIRED[s]:
            got = seeds.get((s, p))
            if got is None:
                problems.append(f"per-seed runs: no rows for scenario {s}, policy {p}")
            elif got != want:
                problems.append(f"per-seed runs: {s}/{p} has seeds {sorted(got)}, gradscaler "
                                f"{sorted(want)}")
    return seeds


def check_summary(rows, seeds, problems):
    seen = {(r["scenario"], r["policy"]): r for r in rows}
    for s in SCENARIOS:
        for p in REQUIRED[s]:
            if (s, p) not in seen:
                problems.append(f"summary: no row for scenario {s}, policy {p}")
    for (s, p), r in seen.items():
        if r["seeds"] != str(len(seeds.get((s, p), ()))):
            problems.append(f"summary {s}/{p}: {r['seeds']} seeds, the per-seed rows have "
                            f"{len(seeds.get((s, p), ()))}")
        if r["completed"] != "yes":
            problems.append(f"summary {s}/{p}: not every seed completed")
        for c in ("skipped", "skipped / 10k", "avoidable", "avoidable / 10k", "final val loss"):
            if not is_number(r[c]):
                problems.append(f"summary {s}/{p}: {c} is '{r[c]}', not a number")
        if p != "gradscaler" and not is_number(r["val loss - gradscaler [95% CI]"].split()[0]):
            problems.append(f"summary {s}/{p}: no paired val-loss difference")


def check_runs_json(out_dir, rows, problems):
    with open(os.path.join(out_dir, "runs.json")) as f:
        runs = json.load(f)["runs"]
    for r in rows:
        m = runs.get(r["scenario"], {}).get(r["policy"], {}).get(r["seed"])
        if m is None:
            problems.append(f"{r['scenario']}/{r['policy']}/seed {r['seed']}: missing from "
                            f"runs.json")
        elif str(m["skipped"]) != r["skipped"] or m["steps"] != m["steps_wanted"]:
            problems.append(f"{r['scenario']}/{r['policy']}/seed {r['seed']}: runs.json "
                            f"disagrees with the table")


def check_fragment(out_dir, goals, problems):
    with open(os.path.join(out_dir, "fragment.json")) as f:
        fragment = json.load(f)
    for k in KEYS:
        if k not in fragment:
            problems.append(f"fragment lacks {k}")
    for k in TARGETS:
        if not isinstance(fragment.get(k), (int, float)):
            problems.append(f"fragment lacks the target {k}")
    ci, m = fragment.get("policy_val_loss_delta_ci95"), fragment.get(
        "policy_val_loss_delta_vs_gradscaler")
    if not (isinstance(ci, list) and len(ci) == 2 and isinstance(m, (int, float))
            and ci[0] <= m <= ci[1]):
        problems.append(f"policy_val_loss_delta_ci95 {ci} is not [low, high] around the mean {m}")
    listed = {g["key"] for g in goals}
    for k in ("policy_skip_reduction_vs_gradscaler", "policy_underflow_reduction_vs_gradscaler",
              "policy_val_loss_delta_vs_gradscaler", "policy_avoidable_skips_after_first_decision",
              "policy_fp32_fallback_skips_after_decision"):
        if k not in listed:
            problems.append(f"the goals table lacks {k}")


def check(out_dir):
    problems = []
    with open(os.path.join(out_dir, "runs.json")) as f:
        profile = json.load(f)["profile"]
    tables = sections(os.path.join(out_dir, "table.md"))
    per_seed = table(tables, "per_seed", PER_SEED_COLUMNS, problems)
    seeds = check_per_seed(per_seed, MIN_SEEDS.get(profile, 5), problems)
    check_summary(table(tables, "summary", SUMMARY_COLUMNS, problems), seeds, problems)
    check_runs_json(out_dir, per_seed, problems)
    check_fragment(out_dir, table(tables, "goals", GOAL_COLUMNS, problems), problems)
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
        print("check_table.py: tables, seeds, runs, results keys and plots complete")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
