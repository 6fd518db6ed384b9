#!/usr/bin/env bash
# ./run demo: the numerics core on tensors that show how mixed precision fails. The tensors are
# written with NumPy, as a user would save them from a training run, then read by
# `ampscope stats`.
set -euo pipefail

BUILD_DIR="$1"
AMPSCOPE="$BUILD_DIR/cli/ampscope"
WORK="$BUILD_DIR/demo"
mkdir -p "$WORK"

say() { printf '\n\033[1;36m## %s\033[0m\n' "$*"; }

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
# BF16 weights, stored as raw uint16 (NumPy has no bfloat16): the top half of FP32.
w = rng.normal(0.0, 0.02, size=1 << 16).astype(np.float32)
bits = w.view(np.uint32)
rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16          # round to nearest even
np.save(f"{out}/weights_bf16.npy", rounded.astype(np.uint16))
PYEOF

say "1. FP32 activation gradients: how many would FP16 lose, at loss scale 1 and 2^16?"
echo "\$ ampscope stats activation_grads_fp32.npy --target fp16@0 --target fp16@16 --target e5m2@16 --target bf16@0"
"$AMPSCOPE" stats "$WORK/activation_grads_fp32.npy" \
  --target fp16@0 --target fp16@16 --target e5m2@16 --target bf16@0

say "2. FP16 activations that overflowed: Inf and NaN are counted, never averaged in"
echo "\$ ampscope stats activations_fp16.npy --target e4m3@0"
"$AMPSCOPE" stats "$WORK/activations_fp16.npy" --target e4m3@0

say "3. BF16 weights (saved as uint16), machine-readable"
echo "\$ ampscope stats weights_bf16.npy --dtype bf16 --target e4m3@4 --json"
"$AMPSCOPE" stats "$WORK/weights_bf16.npy" --dtype bf16 --target e4m3@4 --json
echo

say "Where to look next"
cat <<MSG
- The tensors are in $WORK; run '$AMPSCOPE stats --help' on your own .npy files
  (FP32, FP16, or BF16 saved as uint16 with --dtype bf16).
- README.md explains every field (binade histogram, exact underflow/overflow/subnormal counts
  per target FORMAT@SCALE_LOG2) and what is measured; './run test' runs every test.
MSG
