#!/usr/bin/env python3
"""Checks what bench/policy_eval/policy_eval.py wrote: `check_table.py OUT_DIR`.

For the loss-scale scenarios that ran, table.md must have its sections with exactly the columns
docs/policy.md describes: the summary (one row per scenario and policy), the goals, and the
per-seed runs, where every scenario runs gradscaler and headroom (plus headroom-fp32 on
activation-overflow and headroom-live on long) on the same seeds, at least as many as the
profile promises, every run completed with a number in every figure column; runs.json must agree
with the table; the fragment must carry the results keys with their targets (the val-loss CI as
[low, high] around the mean); the plots must be PNG files.

For fp-recipes: every arm (bf16, mxfp8, nvfp4 and the two -policy arms) on the same seeds, each
run complete with a finite validation loss and, but bf16, a finite gap to bf16; every step of a
recipe arm reported quantisers (the policy's evidence) and none of bf16's; an arm without the
policy ran every layer-step in its recipe (share 1); a policy arm's share is in (0, 1], the BF16
sets the trainer reported are those the server decided, from the step each applied on, and its
log agrees; every layer move carries the server's reason naming that layer, and the moves replay
to the BF16 set the run ended with; with the smoke profile's strict limits nvfp4-policy moves a
layer on every seed. The fragment carries the fp4_ and mxfp8_ keys (gaps finite, their CIs
around them, the shares in (0, 1]). Prints every problem, exits 1 if there is one.
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
FP_SCENARIO = "fp-recipes"
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
FP_PLOTS = ["fp_recipes.png"]
FP_POLICIES = ["bf16", "mxfp8", "nvfp4", "mxfp8-policy", "nvfp4-policy"]
FP_SUMMARY_COLUMNS = ["policy", "precision", "seeds", "steps", "final val loss",
                      "val loss - bf16 [95% CI]", "val loss - recipe [95% CI]",
                      "low-precision GEMM share", "low-precision layers at the end",
                      "layer moves (all seeds)", "steps with quantisers", "ms per step",
                      "agent share of the step", "wall s", "completed"]
FP_PER_SEED_COLUMNS = ["policy", "seed", "steps", "final train loss", "final val loss",
                       "val loss - bf16", "low-precision GEMM share", "BF16 layers at the end",
                       "layer moves", "BF16 sets as decided", "trainer log agrees",
                       "steps with quantisers", "what-if quantisers", "wall s", "completed"]
FP_SECTIONS = {"fp_summary": "## FP8/FP4 recipes and per-layer precision",
               "fp_per_seed": "## FP8/FP4 per-seed runs", "fp_goals": "## FP8/FP4 goals"}
FP_KEYS = {k: p for p in ("fp4", "mxfp8") for k in (
    f"{p}_val_loss_gap_vs_bf16", f"{p}_policy_val_loss_gap_vs_bf16",
    f"{p}_policy_val_loss_delta_vs_recipe")}
FP_SHARES = [f"{p}_policy_low_precision_gemm_share" for p in ("fp4", "mxfp8")] + [
    f"{p}_policy_low_precision_gemm_final_share" for p in ("fp4", "mxfp8")]
FP_GOAL_KEYS = [f"{p}_policy_{k}" for p in ("fp4", "mxfp8")
                for k in ("gap_closed_share", "low_precision_gemm_share")]
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
    title = {**SECTIONS, **FP_SECTIONS}[name]
    header = next((h for h in tables if h.startswith(title)), None)
    rows = tables.get(header, [])
    if not rows:
        problems.append(f"table.md has no '{title}' table")
        return []
    if rows[0] != columns:
        problems.append(f"{title}: header {rows[0]} != {columns}")
        return []
    body = rows[2:]
    for r in body:
        if len(r) != len(columns):
            problems.append(f"{title}: {r[:3]}: {len(r)} cells, expected {len(columns)}")
    return [dict(zip(columns, r)) for r in body if len(r) == len(columns)]


def is_number(text):
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def check_per_seed(rows, min_seeds, scenarios, problems):
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
    for s in scenarios:
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


def check_summary(rows, seeds, scenarios, problems):
    seen = {(r["scenario"], r["policy"]): r for r in rows}
    for s in scenarios:
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


def cell_number(text):
    """The leading number of a cell ('+0.0123 [-0.01, +0.03]', '7.0 of 8'), or None."""
    head = text.split()[0] if text.split() else ""
    return float(head) if is_number(head) else None


def check_fp_per_seed(rows, problems):
    seeds = {}
    for row in rows:
        p = row["policy"]
        name = f"{FP_SCENARIO}/{p}/seed {row['seed']}"
        seeds.setdefault(p, set()).add(row["seed"])
        if row["completed"] != "yes":
            problems.append(f"{name}: did not complete: {row['completed']}")
        for c in ("final train loss", "final val loss", "wall s"):
            if not is_number(row[c]):
                problems.append(f"{name}: {c} is '{row[c]}', not a finite number")
        for c in ("BF16 sets as decided", "trainer log agrees"):
            if row[c] != "yes":
                problems.append(f"{name}: {c}: {row[c]}")
        want_quantizers = "0" if p == "bf16" else row["steps"]
        if row["steps with quantisers"] != want_quantizers:
            problems.append(f"{name}: quantisers reported on {row['steps with quantisers']} "
                            f"steps, expected {want_quantizers}")
        if p == "bf16":
            continue
        if not is_number(row["val loss - bf16"]):
            problems.append(f"{name}: val loss - bf16 is '{row['val loss - bf16']}'")
        share = cell_number(row["low-precision GEMM share"])
        if share is None or not 0 < share <= 1:
            problems.append(f"{name}: low-precision GEMM share '{row['low-precision GEMM share']}'"
                            f" is not in (0, 1]")
        elif not p.endswith("-policy") and share != 1:
            problems.append(f"{name}: without the policy every layer-step runs the recipe, share "
                            f"{share}")
    want = seeds.get("bf16", set())
    if len(want) < 2:
        problems.append(f"{FP_SCENARIO}: bf16 has {len(want)} seeds, expected at least 2")
    for p in FP_POLICIES:
        if seeds.get(p) != want:
            problems.append(f"{FP_SCENARIO}: {p} has seeds {sorted(seeds.get(p, []))}, bf16 "
                            f"{sorted(want)}")


def check_fp_summary(rows, problems):
    seen = {r["policy"]: r for r in rows}
    for p in FP_POLICIES:
        r = seen.get(p)
        if r is None:
            problems.append(f"{FP_SCENARIO} summary: no row for {p}")
            continue
        if r["completed"] != "yes" or not is_number(r["final val loss"]):
            problems.append(f"{FP_SCENARIO} summary {p}: completed {r['completed']}, final val "
                            f"loss '{r['final val loss']}'")
        if p != "bf16" and cell_number(r["val loss - bf16 [95% CI]"]) is None:
            problems.append(f"{FP_SCENARIO} summary {p}: no paired gap to bf16")
        if p.endswith("-policy") and cell_number(r["val loss - recipe [95% CI]"]) is None:
            problems.append(f"{FP_SCENARIO} summary {p}: no paired difference to its recipe")


def replay(moves):
    """The BF16 set the moves leave behind."""
    now = set()
    for mv in sorted(moves, key=lambda m: m["step"]):
        (now.add if mv["to"] == "bf16" else now.discard)(mv["layer"])
    return sorted(now)


def check_fp_runs(runs, profile, problems):
    """The -policy arms' moves: a reason naming the layer, a decided BF16 set behind each, and
    the moves replaying to the set the run ended with."""
    for p in ("mxfp8-policy", "nvfp4-policy"):
        for seed, m in runs.get(p, {}).items():
            name = f"{FP_SCENARIO}/{p}/seed {seed}"
            moves = m.get("layer_moves", [])
            if moves and not m.get("bf16_decisions"):
                problems.append(f"{name}: layers moved without a decision carrying a BF16 set")
            for mv in moves:
                if mv["layer"] not in mv["reason"]:
                    problems.append(f"{name}: the move of {mv['layer']} at step {mv['step']} has "
                                    f"a reason that does not name it: '{mv['reason']}'")
            if replay(moves) != sorted(m.get("bf16_gemms_final", [])):
                problems.append(f"{name}: the moves replay to {replay(moves)}, the run ended with "
                                f"{m.get('bf16_gemms_final')}")
            if profile == "smoke" and p == "nvfp4-policy" and not moves:
                problems.append(f"{name}: no layer moved under the smoke profile's limits, which "
                                f"every nvfp4 GEMM input breaks")


def check_fp_fragment(fragment, goals, problems):
    for k in FP_KEYS:
        v, ci = fragment.get(k), fragment.get(k + "_ci95")
        if not (isinstance(v, (int, float)) and math.isfinite(v)):
            problems.append(f"fragment: {k} is {v}, not a finite number")
        elif not (isinstance(ci, list) and len(ci) == 2 and ci[0] <= v <= ci[1]):
            problems.append(f"fragment: {k}_ci95 {ci} is not [low, high] around {v}")
    for k in FP_SHARES:
        v = fragment.get(k)
        if not (isinstance(v, (int, float)) and 0 < v <= 1):
            problems.append(f"fragment: {k} is {v}, not in (0, 1]")
    for k in ("fp4_policy_gap_closed_share", "mxfp8_policy_gap_closed_share"):
        if k not in fragment:
            problems.append(f"fragment lacks {k}")
    listed = {g["key"] for g in goals}
    for k in FP_GOAL_KEYS:
        if k not in listed:
            problems.append(f"the FP8/FP4 goals table lacks {k}")


def check_fp(out_dir, tables, runs, profile, problems):
    check_fp_per_seed(table(tables, "fp_per_seed", FP_PER_SEED_COLUMNS, problems), problems)
    check_fp_summary(table(tables, "fp_summary", FP_SUMMARY_COLUMNS, problems), problems)
    check_fp_runs(runs.get(FP_SCENARIO, {}), profile, problems)
    with open(os.path.join(out_dir, "fragment.json")) as f:
        check_fp_fragment(json.load(f), table(tables, "fp_goals", GOAL_COLUMNS, problems),
                          problems)


def check(out_dir):
    problems = []
    with open(os.path.join(out_dir, "runs.json")) as f:
        ran = json.load(f)
    profile = ran["profile"]
    scenarios = [s for s in SCENARIOS if s in ran["scenarios"]]
    tables = sections(os.path.join(out_dir, "table.md"))
    plots = []
    if scenarios:
        per_seed = table(tables, "per_seed", PER_SEED_COLUMNS, problems)
        seeds = check_per_seed(per_seed, MIN_SEEDS.get(profile, 5), scenarios, problems)
        check_summary(table(tables, "summary", SUMMARY_COLUMNS, problems), seeds, scenarios,
                      problems)
        check_runs_json(out_dir, per_seed, problems)
        if scenarios == SCENARIOS:  # the derived keys need every loss-scale scenario
            check_fragment(out_dir, table(tables, "goals", GOAL_COLUMNS, problems), problems)
        plots += PLOTS
    if FP_SCENARIO in ran["scenarios"]:
        check_fp(out_dir, tables, ran["runs"], profile, problems)
        plots += FP_PLOTS
    for p in plots:
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
