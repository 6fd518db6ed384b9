#!/usr/bin/env bash
# ./run demo: the whole loop on one machine, then the numerics core on saved tensors.
#   1. ampscope-server (embedded SQLite store, headroom policy) on free loopback ports;
#   2. ampscope-train in amp-fp16 with the agent attached, an initial loss scale far too high
#      (2^24) and a NaN injected into one activation at step 60;
#   3. what the server saw (ampscope show, and show --step 60 for the flight recorder's history),
#      a few of its Prometheus metrics, where to look next;
#   4. `ampscope stats` on tensors written with NumPy.
set -euo pipefail

BUILD_DIR="$1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AMPSCOPE="$BUILD_DIR/cli/ampscope"
SERVER="$BUILD_DIR/server/ampscope-server"
TRAIN="$BUILD_DIR/trainer/ampscope-train"
WORK="$BUILD_DIR/demo"
STEPS="${AMPSCOPE_DEMO_STEPS:-200}"
rm -rf "$WORK"
mkdir -p "$WORK"

say() { printf '\n\033[1;36m## %s\033[0m\n' "$*"; }

server_pid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT

say "1. ampscope-server: SQLite store in $WORK, headroom loss-scale policy"
"$SERVER" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
  --db "$WORK/ampscope.db" --policy headroom --ready-file "$WORK/ready.json" \
  >"$WORK/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do [ -s "$WORK/ready.json" ] && break; sleep 0.1; done
if [ ! -s "$WORK/ready.json" ]; then
  echo "demo: ampscope-server did not start; its log:" >&2
  cat "$WORK/server.log" >&2
  exit 1
fi
GRPC=$(sed -n 's/.*"grpc": *"\([^"]*\)".*/\1/p' "$WORK/ready.json")
METRICS=$(sed -n 's/.*"metrics": *"\([^"]*\)".*/\1/p' "$WORK/ready.json")
HTTP=$(sed -n 's/.*"http": *"\([^"]*\)".*/\1/p' "$WORK/ready.json")
echo "gRPC on $GRPC, Prometheus metrics on http://$METRICS/metrics, web UI on http://$HTTP/"

say "2. ampscope-train, amp-fp16, agent attached: initial scale 2^24 (too high), NaN at step 60"
# --sample-count-roles: the NaN/Inf counts of every role every step (the default samples
# activations and their gradients), so the first offender named at step 60 is the activation the
# NaN went into rather than the loss it reached.
echo "\$ ampscope-train --precision amp-fp16 --steps $STEPS --init-scale 16777216 \\"
echo "    --inject-nan h0.mlp.fc@60 --sample-count-roles activation,activation_grad,weight_grad,loss \\"
echo "    --server $GRPC --run-id demo"
"$TRAIN" --precision amp-fp16 --steps "$STEPS" --init-scale 16777216 \
  --inject-nan h0.mlp.fc@60 --sample-count-roles activation,activation_grad,weight_grad,loss \
  --eval-every 100 --server "$GRPC" --run-id demo --spool-dir "$WORK/spool" \
  --log-json "$WORK/train.jsonl"

say "3. What the server saw"
echo "\$ ampscope show demo --server $GRPC"
"$AMPSCOPE" show demo --server "$GRPC"
echo
echo "The flight recorder kept every unscaled weight gradient's statistics of the last steps and"
echo "sent them when the NaN came: what the offending tensors looked like before step 60"
echo "\$ ampscope show demo --step 60 --steps-back 6 --limit 2 --server $GRPC"
"$AMPSCOPE" show demo --step 60 --steps-back 6 --limit 2 --server "$GRPC"
echo
echo "Some of the server's Prometheus metrics for this run:"
if command -v curl >/dev/null; then
  curl -s "http://$METRICS/metrics" \
    | grep -E '^ampscope_(loss_scale|skipped_steps_total|found_inf_steps_total|nonfinite_values_total|first_offenders_total|policy_decisions_total)\{[^}]*run="demo"' \
    | grep -v ' 0$' | head -n 16 || true
else
  echo "(curl is not installed: open http://$METRICS/metrics while a server runs)"
fi
stop_server
server_pid=""

say "4. The numerics core on saved tensors: ampscope stats"
# Debian's interpreter, which has python3-numpy (another python3 may come first on PATH).
PY=/usr/bin/python3
"$PY" - "$WORK" <<'PYEOF'
import sys, numpy as np
out = sys.argv[1]
rng = np.random.default_rng(2017)
# Activation gradients as Micikevicius et al. (2017) saw them in FP32: magnitudes spread over
# many binades, a large share below FP16's smallest subnormal 2^-24.
mag = np.exp2(rng.normal(-22.0, 4.0, size=1 << 20))
grads = (mag * rng.choice([-1.0, 1.0], size=mag.size)).astype(np.float32)
grads[rng.random(grads.size) < 0.05] = 0.0   # ReLU zeros
np.save(f"{out}/activation_grads_fp32.npy", grads)
# FP16 activations of a layer whose pre-activations grew past 65504: Inf, then NaN downstream.
act = rng.normal(0.0, 8000.0, size=1 << 18).astype(np.float32)
with np.errstate(over="ignore", invalid="ignore"):
    act16 = act.astype(np.float16) * np.float16(4.0)   # overflows to +-Inf in FP16
    act16[:64] = act16[:64] - act16[:64]                # Inf - Inf = NaN
np.save(f"{out}/activations_fp16.npy", act16)
PYEOF
echo "FP32 activation gradients: how many would FP16 lose at loss scale 1, and at 2^16? And"
echo "the FP8/FP4 recipes: per-tensor current scaling, MXFP8 (E8M0 per 32), NVFP4 (docs/fp8.md)"
echo "\$ ampscope stats activation_grads_fp32.npy --target fp16@0 --target fp16@16 --target bf16@0 \\"
echo "    --target e5m2:current --target mxfp8_e4m3 --target nvfp4"
"$AMPSCOPE" stats "$WORK/activation_grads_fp32.npy" --target fp16@0 --target fp16@16 \
  --target bf16@0 --target e5m2:current --target mxfp8_e4m3 --target nvfp4
echo
echo "FP16 activations that overflowed: Inf and NaN are counted, never averaged in"
echo "\$ ampscope stats activations_fp16.npy --json"
"$AMPSCOPE" stats "$WORK/activations_fp16.npy" --json
echo

say "Where to look next"
cat <<MSG
- The run is stored in $WORK/ampscope.db. Look at it again with:
    $SERVER --db $WORK/ampscope.db &
    $AMPSCOPE show demo        # or: $AMPSCOPE runs, $AMPSCOPE tail demo --follow
  and, while that server runs, its web UI at http://127.0.0.1:9465/ (the run's page:
  http://127.0.0.1:9465/runs/demo) and its Prometheus metrics at http://127.0.0.1:9464/metrics.
- The per-step log of the training run: $WORK/train.jsonl (one JSON object per step).
- Grafana and Prometheus: $ROOT/dashboards (dashboard JSON, scrape config, alert rules);
  README.md says how to point an existing Prometheus and Grafana at the server.
- Your own tensors: '$AMPSCOPE stats FILE.npy' (FP32, FP16, or BF16 saved as uint16 with
  --dtype bf16); './run test' runs every test.
- Your own PyTorch loop: 'import ampscope.torch as amps; mon = amps.attach(model, optimizer,
  scaler, run_id=..., server=...)'. A complete run against the server above:
    PYTHONPATH=$ROOT/python AMPSCOPE_AGENT_LIBRARY=$BUILD_DIR/agent/libampscope_agent.so \\
      /usr/bin/python3 $ROOT/examples/torch_train.py --server 127.0.0.1:50051 --nan-at 40
  (needs python3-torch; docs/pytorch.md).
MSG
