#!/usr/bin/env bash
# The statistics benchmark behind `./run bench`:
#
#   bench/run_bench.sh BUILD_DIR
#
# BUILD_DIR must already hold the built target ampscope_stats_bench (configure with
# -DCMAKE_BUILD_TYPE=Release; the build type is recorded in the results). Runs the C++
# benchmark, then the PyTorch peer with the same buffer size and thread count, then merges the
# fragments into BUILD_DIR/bench/results.json (keeping keys other benchmarks wrote there) and
# prints the table. Fails only if the C++ benchmark or the merge fails; a missing or failing
# PyTorch shows as "n/a". Takes about 2-3 minutes on 2 cores with the defaults.
#
# Environment (all optional):
#   AMPSCOPE_BENCH_PYTHON        interpreter with torch for the peer  (default /usr/bin/python3)
#   AMPSCOPE_BENCH_BUFFER_MIB    bytes per buffer in MiB, keep it above the LLC  (default 256)
#   AMPSCOPE_BENCH_REPS          timed compute_stats / memory-read calls (median)  (default 5)
#   AMPSCOPE_BENCH_SIMD_REPS     timed calls per SIMD level                        (default 3)
#   AMPSCOPE_BENCH_THREADS       threads for both (default: the kernels' pool size)
#   AMPSCOPE_BENCH_TARGETS       what-if targets                        (default fp16@0,e4m3@0)
#   AMPSCOPE_BENCH_MX_RECIPE     recipe timed through recipe_counts for stats_gbps_*_mx
#                                (default mxfp8_e4m3, rows of 4,096, one thread)
#   AMPSCOPE_BENCH_TORCH_DTYPES  dtypes for the peer                    (default fp32,fp16,bf16)
#   AMPSCOPE_BENCH_TORCH_REPS    most timed calls per dtype for the peer           (default 3)
#   AMPSCOPE_BENCH_TORCH_BUDGET_S  seconds after which the peer stops repeating    (default 20)
#   AMPSCOPE_SIMD                caps the SIMD level of the kernels (scalar|avx2|avx512)
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build_dir=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench_bin=$build_dir/bench/ampscope_stats_bench
if [[ ! -x $bench_bin ]]; then
  echo "$0: $bench_bin not found; build the target ampscope_stats_bench in $build_dir" >&2
  exit 2
fi
python=${AMPSCOPE_BENCH_PYTHON:-/usr/bin/python3}
out_dir=$build_dir/bench
fragments=$out_dir/fragments
mkdir -p "$fragments"
rm -f "$fragments"/stats.json "$fragments"/stats_torch.json "$fragments"/stats_summary.json

"$bench_bin" \
  --buffer-mib "${AMPSCOPE_BENCH_BUFFER_MIB:-256}" \
  --reps "${AMPSCOPE_BENCH_REPS:-5}" \
  --simd-reps "${AMPSCOPE_BENCH_SIMD_REPS:-3}" \
  --threads "${AMPSCOPE_BENCH_THREADS:-0}" \
  --targets "${AMPSCOPE_BENCH_TARGETS:-fp16@0,e4m3@0}" \
  --mx-recipe "${AMPSCOPE_BENCH_MX_RECIPE:-mxfp8_e4m3}" \
  --out "$fragments/stats.json"

# The peer gets exactly the buffer size and thread count the C++ run used.
read -r buffer_bytes threads < <("$python" -c \
  'import json, sys; d = json.load(open(sys.argv[1]))
print(d["stats_buffer_bytes"], d["stats_threads"])' "$fragments/stats.json")
echo "pytorch peer: $buffer_bytes bytes per tensor, $threads threads"
if ! "$python" "$here/peers/torch_stats.py" \
    --buffer-bytes "$buffer_bytes" --threads "$threads" \
    --targets "${AMPSCOPE_BENCH_TARGETS:-fp16@0,e4m3@0}" \
    --dtypes "${AMPSCOPE_BENCH_TORCH_DTYPES:-fp32,fp16,bf16}" \
    --reps "${AMPSCOPE_BENCH_TORCH_REPS:-3}" \
    --budget-s "${AMPSCOPE_BENCH_TORCH_BUDGET_S:-20}" \
    --out "$fragments/stats_torch.json"; then
  echo "$0: the PyTorch peer failed; its figures are left out" >&2
  echo '{"torch_error": "the peer script failed"}' > "$fragments/stats_torch.json"
fi

"$python" "$here/stats_report.py" "$fragments/stats.json" "$fragments/stats_torch.json" \
  "$fragments/stats_summary.json"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/stats.json" \
  "$fragments/stats_torch.json" "$fragments/stats_summary.json"
echo "results: $out_dir/results.json"

# ---- Trainer benchmark ----------------------------------------------------------------------
# ampscope-train (fp32 and amp-bf16) against the same GPT, batch and thread count written in
# PyTorch (bench/peers/torch_gpt.py: fp32 and bf16 autocast), runs alternating so both see the
# same load; writes trainer_tokens_per_s_*, trainer_torch_tokens_per_s_* and
# trainer_vs_torch_speedup_{fp32,bf16} into results.json. About a minute on 2 cores. A missing
# or failing PyTorch shows as "n/a"; a failing ampscope-train fails the script.
#
# Environment (all optional):
#   AMPSCOPE_BENCH_TRAINER_THREADS  threads for both sides (default: all logical cores, which is
#                                   what ampscope-train uses by default)
#   AMPSCOPE_BENCH_TRAINER_ROUNDS   alternations of the four runs (default 3)
#   AMPSCOPE_BENCH_TRAINER_COMPARE  another ampscope-train (e.g. a build before a back-end
#                                   change) measured in the same rounds, reported as compare
train_bin=$build_dir/trainer/ampscope-train
if [[ ! -x $train_bin ]]; then
  echo "$0: $train_bin not found; build the target ampscope-train in $build_dir" >&2
  exit 2
fi
rm -f "$fragments"/trainer.json "$fragments"/trainer_summary.json
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
compare=${AMPSCOPE_BENCH_TRAINER_COMPARE:-}
"$python" "$here/trainer_bench.py" \
  --train-bin "$train_bin" \
  --python "$python" \
  --threads "${AMPSCOPE_BENCH_TRAINER_THREADS:-0}" \
  --rounds "${AMPSCOPE_BENCH_TRAINER_ROUNDS:-3}" \
  --build-type "${build_type:-unspecified}" \
  ${compare:+--compare-bin "$compare"} \
  --out "$fragments/trainer.json"
"$python" "$here/trainer_report.py" "$fragments/trainer.json" "$fragments/trainer_summary.json"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/trainer.json" \
  "$fragments/trainer_summary.json"
echo "results: $out_dir/results.json"

# --- The agent's overhead on a training step (bench/agent_overhead.cc) ---------------------
# One process, one run: blocks of steps without the agent, with it at default sampling and with
# full statistics every step, interleaved; writes agent_overhead_ratio_default and
# agent_overhead_ratio_full (targets <= 1.01 and <= 1.05) into results.json, and the same ratios
# of process CPU time (agent_overhead_cpu_ratio_*). Then the same of an fp8-delayed run, the
# quantisers' counts reported too: the keys with _fp8 (agent_overhead_ratio_full_fp8, target
# <= 1.05). About a minute each on 2 cores.
#
# Environment (all optional):
#   AMPSCOPE_BENCH_AGENT_STEPS   steps per timed block (default 4)
#   AMPSCOPE_BENCH_AGENT_ROUNDS  timed rounds, each one block per configuration (default 8)
agent_bench=$build_dir/bench/ampscope_agent_bench
if [[ ! -x $agent_bench ]]; then
  echo "$0: $agent_bench not found; build the target ampscope_agent_bench in $build_dir" >&2
  exit 2
fi
rm -f "$fragments"/agent.json "$fragments"/agent_fp8.json
"$agent_bench" --out "$fragments/agent.json" \
  --steps-per-block "${AMPSCOPE_BENCH_AGENT_STEPS:-4}" \
  --rounds "${AMPSCOPE_BENCH_AGENT_ROUNDS:-8}"
"$agent_bench" --out "$fragments/agent_fp8.json" --precision fp8-delayed --key-suffix _fp8 \
  --steps-per-block "${AMPSCOPE_BENCH_AGENT_STEPS:-4}" \
  --rounds "${AMPSCOPE_BENCH_AGENT_ROUNDS:-8}"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/agent.json" \
  "$fragments/agent_fp8.json"
echo "results: $out_dir/results.json"

# The quantiser of an FP8/FP4 GEMM input with the statistics fused into it
# (fake_quantize_with_stats) against fake_quantize + compute_stats on the same 1,024 x 512
# input (bench/fused_recipe_bench.cc): recipe_stats_fused_speedup_{delayed,current,mx,nvfp4}.
# A few seconds.
rm -f "$fragments"/fused_recipe.json
"$build_dir/bench/ampscope_fused_recipe_bench" --out "$fragments/fused_recipe.json"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/fused_recipe.json"
echo "results: $out_dir/results.json"

# ---- The PyTorch monitor's overhead (bench/torch_agent_bench.py) -----------------------------
# ampscope.torch.attach() on a small GPT trained with PyTorch on the CPU (AdamW, LossScaler,
# bf16 autocast where the CPU has AVX-512, else FP32), reporting to a real ampscope-server: in
# one process, blocks of steps without the monitor, with it at default sampling and with full
# statistics every step, in rotating order; writes torch_agent_overhead_ratio_default and
# torch_agent_overhead_ratio_full into results.json. About a minute on 2 cores. A missing or
# failing PyTorch (or package) shows as "n/a" (the figures become null).
#
# Environment (all optional):
#   AMPSCOPE_BENCH_TORCH_AGENT_ROUNDS     rounds, each one block per configuration (default 12)
#   AMPSCOPE_BENCH_TORCH_AGENT_STEPS      timed steps per block (default 8)
#   AMPSCOPE_BENCH_TORCH_AGENT_PRECISION  auto|bf16|fp32 (default auto: bf16 with AVX-512)
#   AMPSCOPE_BENCH_TORCH_AGENT_THREADS    torch threads (default: all logical cores but one,
#                                         left to the agent's threads and the server)
agent_library=$build_dir/agent/libampscope_agent.so
server_bin=$build_dir/server/ampscope-server
for f in "$agent_library" "$server_bin"; do
  if [[ ! -e $f ]]; then
    echo "$0: $f not found; build the targets ampscope_agent_shared and ampscope-server in" \
      "$build_dir" >&2
    exit 2
  fi
done
rm -f "$fragments"/torch_agent.json
if ! PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
    AMPSCOPE_AGENT_LIBRARY="$agent_library" \
    "$python" "$here/torch_agent_bench.py" --server-bin "$server_bin" \
      --rounds "${AMPSCOPE_BENCH_TORCH_AGENT_ROUNDS:-12}" \
      --steps-per-block "${AMPSCOPE_BENCH_TORCH_AGENT_STEPS:-8}" \
      --precision "${AMPSCOPE_BENCH_TORCH_AGENT_PRECISION:-auto}" \
      --threads "${AMPSCOPE_BENCH_TORCH_AGENT_THREADS:-0}" \
      --out "$fragments/torch_agent.json"; then
  echo "pytorch monitor overhead: n/a (bench/torch_agent_bench.py failed; see above)" >&2
  cat > "$fragments/torch_agent.json" <<'EOF'
{"torch_agent_error": "bench/torch_agent_bench.py failed",
 "torch_agent_overhead_ratio_default": null, "torch_agent_overhead_ratio_full": null,
 "torch_agent_step_s_without": null, "torch_agent_step_s_default": null,
 "torch_agent_step_s_full": null, "torch_agent_training_thread_s_per_step_default": null,
 "torch_agent_training_thread_s_per_step_full": null}
EOF
fi
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/torch_agent.json"
echo "results: $out_dir/results.json"

# ---- Server ingest load (bench/server_load.cc) ------------------------------------------------
# 64 concurrent agent streams on loopback against a real ampscope-server: tensor statistics per
# second, p99 time to ack, peak server memory.
rm -f "$fragments"/server.json
"$build_dir/bench/ampscope_server_load" --out "$fragments/server.json"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/server.json"
echo "results: $out_dir/results.json"

# The same on PostgreSQL: the tool starts a real PostgreSQL (Debian's postgresql package, in a
# temporary directory on a Unix socket, fsync and synchronous_commit on as SQLite's --sync
# full) and the server stores there: server_postgres_ingest_tensor_stats_per_s beside
# server_ingest_tensor_stats_per_s, server_postgres_ack_p99_ms, ..., and the CPU PostgreSQL
# used (server_postgres_throughput_postgres_cpu_cores). About 45 s.
rm -f "$fragments"/server_postgres.json
"$build_dir/bench/ampscope_server_load" --db-backend postgres \
  --out "$fragments/server_postgres.json"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/server_postgres.json"
echo "results: $out_dir/results.json"

# One data-parallel run of 256 ranks against a real ampscope-server with the headroom policy:
# each rank one stream, one report of 200 tensors per second (the same step on every rank, each
# rank's send delayed by up to 20 ms), 5 s warm-up + 60 s measured. Writes
# server_256_ranks_ack_{p50,p99}_ms, server_256_ranks_ingest_tensor_stats_per_s,
# server_256_ranks_rss_{start,end,growth}_mb, server_256_ranks_peak_rss_mb and whether every
# report was acknowledged (server_256_ranks_all_acked, _rejects). About 70 s.
#
# Environment (all optional):
#   AMPSCOPE_BENCH_SERVER_RANKS           ranks (default 256; the keys say the number)
#   AMPSCOPE_BENCH_SERVER_RANKS_DURATION  measured seconds (default 60)
rm -f "$fragments"/server_ranks.json
"$build_dir/bench/ampscope_server_load" --out "$fragments/server_ranks.json" \
  --ranks "${AMPSCOPE_BENCH_SERVER_RANKS:-256}" --rank-tensors 200 --rank-rate 1 \
  --rank-duration "${AMPSCOPE_BENCH_SERVER_RANKS_DURATION:-60}"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/server_ranks.json"
echo "results: $out_dir/results.json"

# The same run at 1,024 and 4,096 ranks with the agent's default sample_full_ranks (auto: beyond
# 64 ranks only rank 0 of each node of 8 sends full reports, the others the same tensors as
# counts): server_1024_ranks_ack_p99_ms, server_4096_ranks_all_acked and the other keys above
# under their numbers, RSS over the run included. 5 s warm-up + 60 s measured each
# (AMPSCOPE_BENCH_SERVER_RANKS_DURATION); one connection per rank, so the tool raises its open
# files limit to the hard limit (4,096 ranks need about 8,200 descriptors).
for ranks in 1024 4096; do
  rm -f "$fragments/server_${ranks}_ranks.json"
  "$build_dir/bench/ampscope_server_load" --out "$fragments/server_${ranks}_ranks.json" \
    --ranks "$ranks" --sample-full-ranks auto --ranks-per-node 8 --rank-tensors 200 \
    --rank-rate 1 --rank-duration "${AMPSCOPE_BENCH_SERVER_RANKS_DURATION:-60}"
  "$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/server_${ranks}_ranks.json"
  echo "results: $out_dir/results.json"
done

# 1,024 ranks as above (sample_full_ranks auto) on two servers sharing one PostgreSQL, each with
# --run-leases: rank r asks server r % 2 first, and the server that does not own the run sends
# it to the one that does (a Redirect, as the agent given server=a,b follows): keys
# server_1024_ranks_2pg_* (ack p50/p99, all_acked, streams_failed, redirected_ranks, RSS and CPU
# of both servers summed, PostgreSQL's CPU). 5 s warm-up + 30 s measured
# (AMPSCOPE_BENCH_SERVER_2PG_DURATION) + at most 15 s for the last Acks: under a minute.
rm -f "$fragments"/server_1024_ranks_2pg.json
"$build_dir/bench/ampscope_server_load" --out "$fragments/server_1024_ranks_2pg.json" \
  --db-backend postgres --servers 2 --ranks 1024 --sample-full-ranks auto --ranks-per-node 8 \
  --rank-tensors 200 --rank-rate 1 --rank-duration "${AMPSCOPE_BENCH_SERVER_2PG_DURATION:-30}" \
  --rank-drain 15
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/server_1024_ranks_2pg.json"
echo "results: $out_dir/results.json"

# ---- Failover (bench/server_failover.cc) -------------------------------------------------------
# Two ampscope-server processes sharing one PostgreSQL database with --run-leases (the default
# --lease-ttl 10s), one agent with its default reconnect settings at 10 steps/s; the run's owner
# is killed with SIGKILL, three times: server_failover_s (median seconds from the kill to the
# first report the other server stored), _max, server_failover_lease_s. About a minute. A build
# without the tests has no PostgreSQL launcher and no such benchmark.
rm -f "$fragments"/server_failover.json
if [[ -x $build_dir/bench/ampscope_server_failover ]]; then
  "$build_dir/bench/ampscope_server_failover" --out "$fragments/server_failover.json"
  "$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/server_failover.json"
else
  echo "server failover: n/a (ampscope_server_failover is built with the tests)" >&2
fi

# ---- The web UI on a long run (bench/webui_page_load.mjs) ------------------------------------
# A real ampscope-server (headroom policy) filled with one run of 100,000 steps of 24 tensors
# (ampscope_server_load --long-run: skips, offenders, validation loss, policy decisions), then
# headless Chromium (puppeteer-core, server/webui/node_modules) opens the run's page at
# 1400x900 and times it from navigation to every chart drawn (body[data-ready]), once cold and
# then --loads times; writes webui_run_page_load_s (median), webui_run_page_load_s_max,
# webui_run_page_load_s_cold, webui_tensor_page_load_s (median) and the run's size. About 40 s.
#
# Environment (all optional):
#   AMPSCOPE_BENCH_WEBUI_STEPS  steps of the long run (default 100000; the keys record it)
#   AMPSCOPE_BENCH_WEBUI_LOADS  timed loads after the cold one (default 5)
rm -f "$fragments"/webui.json
webui_dir=$out_dir/webui
rm -rf "$webui_dir"
mkdir -p "$webui_dir"
"$build_dir/server/ampscope-server" --listen 127.0.0.1:0 --metrics-listen '' \
  --http-listen 127.0.0.1:0 --db "$webui_dir/ampscope.db" --policy headroom --sync normal \
  --ready-file "$webui_dir/ready.json" >"$webui_dir/server.log" 2>&1 &
webui_server=$!
for _ in $(seq 1 100); do [[ -s $webui_dir/ready.json ]] && break; sleep 0.1; done
webui_grpc=$(sed -n 's/.*"grpc": *"\([^"]*\)".*/\1/p' "$webui_dir/ready.json")
webui_http=$(sed -n 's/.*"http": *"\([^"]*\)".*/\1/p' "$webui_dir/ready.json")
webui_steps=${AMPSCOPE_BENCH_WEBUI_STEPS:-100000}
if "$build_dir/bench/ampscope_server_load" --server "$webui_grpc" --long-run "$webui_steps" \
    --long-run-id bench-long --tensors 24 \
  && node "$here/webui_page_load.mjs" --url "http://$webui_http" --run bench-long \
    --steps "$webui_steps" --loads "${AMPSCOPE_BENCH_WEBUI_LOADS:-5}" \
    --out "$fragments/webui.json"; then
  "$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/webui.json"
else
  echo "$0: the web UI benchmark failed; server log: $webui_dir/server.log" >&2
  kill "$webui_server" 2>/dev/null || true
  exit 1
fi
kill "$webui_server" 2>/dev/null || true
wait "$webui_server" 2>/dev/null || true
echo "results: $out_dir/results.json"

# ---- Loss-scale policies in closed loop (bench/policy_eval) ----------------------------------
# ampscope-train with the agent against ampscope-server, five seeds per scenario, every policy
# of a seed on the same batches, in lockstep with the server (deterministic): defaults, initial
# scale 2^24, shrinking gradients, injected gradient overflows, an overflow in an attention
# activation (with headroom + FP32 fallback), and 5,000 steps on the Jargon File (jargon-text;
# headroom also live there). Writes policy_{skip,underflow}_reduction_vs_gradscaler,
# policy_val_loss_delta_vs_gradscaler with policy_val_loss_delta_ci95, the skip, live-spread
# and FP32-fallback keys (with their targets and whether they are met) into results.json, and
# BUILD_DIR/bench/policy_eval/table.md and *.png. About 25 minutes on 2 cores; a run that does
# not complete fails the script.
#
# Environment (optional):
#   AMPSCOPE_BENCH_POLICY_PROFILE  short (default) or full (longer scenarios, 8 seeds)
#   AMPSCOPE_BENCH_POLICY_JOBS     runs at a time (default 2)
extract_bin=$build_dir/bench/policy_eval/ampscope_policy_eval_extract
if [[ ! -x $extract_bin ]]; then
  echo "$0: $extract_bin not found; build the target ampscope_policy_eval_targets in $build_dir" >&2
  exit 2
fi
rm -f "$fragments"/policy_eval.json
/usr/bin/python3 "$here/policy_eval/policy_eval.py" --build-dir "$build_dir" \
  --out-dir "$out_dir/policy_eval" --profile "${AMPSCOPE_BENCH_POLICY_PROFILE:-short}" \
  --jobs "${AMPSCOPE_BENCH_POLICY_JOBS:-2}" --fragment "$fragments/policy_eval.json"
"$python" "$here/merge_results.py" "$out_dir/results.json" "$fragments/policy_eval.json"
echo "results: $out_dir/results.json"
