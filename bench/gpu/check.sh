#!/usr/bin/env bash
# bench/gpu/check.sh — the whole GPU path of ampscope in one short run, on a machine with an
# NVIDIA GPU, the CUDA toolkit and this repository (Debian/Ubuntu; missing build packages come
# from the distribution's mirror, nothing else from the network).
#
#   1 preflight     GPU (nvidia-smi), nvcc, architecture of device 0
#   2 packages      install what the build lacks (apt-get; root or passwordless sudo)
#   3 configure     the whole project for this GPU; if that cannot be configured here (server
#                   dependencies missing), the standalone GPU subset (bench/gpu/CMakeLists.txt)
#   4 build         ampscope-train, the CUDA tests, the bandwidth benchmark (+ server and CLI
#                   in the whole-project build, for tensor_core_active_ratio)
#   5 tests         every CUDA test binary (device tests against the CPU references)
#   6 bandwidth     statistics kernel, and the unscale with fused statistics, vs a
#                   device-to-device copy: gpu_stats_bandwidth_ratio,
#                   gpu_fused_unscale_bandwidth_ratio (targets >= 0.85)
#   7 loss          amp-fp16 training on the GPU vs the CPU run of the same seed
#   7b fp8 gemms    fp8-delayed through cuBLASLt's FP8 GEMM vs its emulation: loss and speed
#   8 tensor cores  matmul-heavy amp-fp16 run and an FP32 control (no tensor-core math) with the
#                   agent's CUPTI collector reporting to a local ampscope-server
#   9 pytorch       ampscope.torch with torch.cuda.amp.GradScaler on the GPU against the CPU's
#                   counts (tests/python/torch_cuda_test.py), when the whole project was built
#                   and an interpreter with CUDA torch is found (AMPSCOPE_GPU_CHECK_PYTHON,
#                   else python3)
#  10 results       one JSON file (default: <build dir>/gpu_check.json)
# Each step has a time limit; the whole run is meant to take under 8 minutes on a 16-core host
# (most of it is compiling). On failure it prints the step where it stopped, and still writes
# what it measured. Exit 0 only when every step passed.
#
# usage: bench/gpu/check.sh [--build-dir DIR] [--out FILE] [--no-install] [--jobs N]
# environment: AMPSCOPE_GPU_CHECK_BUILD_TIMEOUT  seconds for the build step (default 420)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_BASE="$ROOT/build-gpucheck"
OUT=""
INSTALL=1
JOBS="$(nproc 2>/dev/null || echo 4)"
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD_BASE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --jobs) JOBS="$2"; shift 2 ;;
    -h | --help) sed -n '2,28p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$BUILD_BASE"
BUILD_BASE="$(cd "$BUILD_BASE" && pwd)"
OUT="${OUT:-$BUILD_BASE/gpu_check.json}"
WORK="$BUILD_BASE/work"
rm -rf "$WORK"
mkdir -p "$WORK"
LOG="$BUILD_BASE/check.log"
: >"$LOG"

START=$(date +%s)
STEP="start"
STEP_START=$START
FAILED_STEPS=()
DONE=0
SERVER_PID=""

elapsed() { echo $(($(date +%s) - START)); }
say() { printf '\033[1m[check %4ss] %s\033[0m\n' "$(elapsed)" "$*" >&2; echo "[$(elapsed)s] $*" >>"$LOG"; }
note() { printf '    %s\n' "$*" >&2; echo "    $*" >>"$LOG"; }

# ---- results ---------------------------------------------------------------------------------
declare -A RES        # key -> JSON value
declare -a RES_ORDER  # insertion order
declare -a STEP_JSON
jstr() {
  local s
  s=$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n\t\r' '   ')
  printf '"%s"' "$s"
}
is_number() { [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
jnum() { if is_number "${1:-}"; then printf '%s' "$1"; else printf 'null'; fi; }
put() {  # put KEY JSON
  [ -z "${RES[$1]+x}" ] && RES_ORDER+=("$1")
  RES[$1]="$2"
}
write_results() {
  local first=1 k
  {
    printf '{\n  "schema": "ampscope.gpu_check.v1",\n'
    printf '  "completed": %s,\n' "$([ "$DONE" = 1 ] && echo true || echo false)"
    printf '  "stopped_at": %s,\n' "$([ "$DONE" = 1 ] && echo null || jstr "$STEP")"
    printf '  "failed_steps": ['
    for k in "${FAILED_STEPS[@]+"${FAILED_STEPS[@]}"}"; do
      [ $first = 1 ] || printf ', '
      first=0
      jstr "$k"
    done
    printf '],\n  "elapsed_s": %s,\n' "$(elapsed)"
    for k in "${RES_ORDER[@]+"${RES_ORDER[@]}"}"; do printf '  "%s": %s,\n' "$k" "${RES[$k]}"; done
    printf '  "steps": [\n'
    first=1
    for k in "${STEP_JSON[@]+"${STEP_JSON[@]}"}"; do
      [ $first = 1 ] || printf ',\n'
      first=0
      printf '    %s' "$k"
    done
    printf '\n  ]\n}\n'
  } >"$OUT.tmp" && mv "$OUT.tmp" "$OUT"
}

begin() {
  STEP="$1"
  STEP_START=$(date +%s)
  say "step $1"
}
end_step() {  # end_step ok|failed|skipped DETAIL
  local status="$1" detail="${2:-}"
  STEP_JSON+=("{\"name\": $(jstr "$STEP"), \"status\": $(jstr "$status"), \"seconds\": $(($(date +%s) - STEP_START)), \"detail\": $(jstr "$detail")}")
  if [ "$status" = failed ]; then
    FAILED_STEPS+=("$STEP")
    note "FAILED: $detail"
  else
    note "$status${detail:+: $detail}"
  fi
  write_results
}
# A step without which the rest cannot run.
fatal() {
  end_step failed "$1"
  echo "check.sh: stopped at step '$STEP' after $(elapsed)s: $1 (log: $LOG, results: $OUT)" >&2
  exit 1
}
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
  if [ "$DONE" != 1 ] && [ "$STEP" != start ]; then
    write_results 2>/dev/null
  fi
}
trap cleanup EXIT
trap 'echo "check.sh: interrupted at step '"'"'$STEP'"'"' after $(elapsed)s" >&2; exit 130' INT TERM

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi
}

# ---- 1 preflight ---------------------------------------------------------------------------------
begin preflight
command -v nvidia-smi >/dev/null || fatal "nvidia-smi not found: no NVIDIA driver on this machine"
GPU_LINE=$(timeout 30 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total \
  --format=csv,noheader -i 0 2>>"$LOG") || fatal "nvidia-smi cannot query device 0"
IFS=',' read -r GPU_NAME GPU_CC GPU_DRIVER GPU_MEM <<<"$GPU_LINE"
GPU_NAME=$(echo "$GPU_NAME" | sed 's/^ *//; s/ *$//')
GPU_CC=$(echo "$GPU_CC" | tr -d ' ')
GPU_DRIVER=$(echo "$GPU_DRIVER" | tr -d ' ')
ARCH=$(echo "$GPU_CC" | tr -d '.')
if ! [[ "$ARCH" =~ ^[0-9]+$ ]]; then
  ARCH="80;90"
  note "no compute capability from nvidia-smi; building for $ARCH"
fi
if [ -z "${CUDACXX:-}" ]; then
  if command -v nvcc >/dev/null; then CUDACXX=$(command -v nvcc); else CUDACXX=/usr/local/cuda/bin/nvcc; fi
fi
[ -x "$CUDACXX" ] || fatal "nvcc not found (looked on PATH and at /usr/local/cuda/bin/nvcc)"
export CUDACXX
CUDA_BIN_DIR=$(dirname "$CUDACXX")
export PATH="$CUDA_BIN_DIR:$PATH"
NVCC_VERSION=$("$CUDACXX" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1)
put gpu "{\"name\": $(jstr "$GPU_NAME"), \"compute_capability\": $(jstr "$GPU_CC"), \"driver\": $(jstr "$(echo "$GPU_DRIVER" | tr -d ' ')"), \"memory\": $(jstr "$(echo "$GPU_MEM" | sed 's/^ *//')"), \"cuda_toolkit\": $(jstr "$NVCC_VERSION"), \"cpu_cores\": $JOBS}"
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -c . || true)
put repository "{\"commit\": $(jstr "$COMMIT"), \"changed_files\": $(jnum "$DIRTY")}"
end_step ok "$GPU_NAME (sm_$ARCH), driver $GPU_DRIVER, CUDA $NVCC_VERSION, commit $COMMIT"

# ---- 2 packages ----------------------------------------------------------------------------------
begin packages
# Needed for any build (ampscope-train links the agent, which speaks gRPC).
CORE_PACKAGES=(cmake ninja-build g++ make pkg-config libgtest-dev libopenblas-dev zlib1g-dev
  nlohmann-json3-dev libcli11-dev libprotobuf-dev protobuf-compiler libgrpc++-dev
  protobuf-compiler-grpc)
# The whole project (server, CLI, their tests), for the agent -> server -> CLI path that carries
# tensor_core_active_ratio. Optional: the standalone build does without them.
FULL_PACKAGES=(libsqlite3-dev prometheus-cpp-dev libgmock-dev libcurl4-openssl-dev
  libbenchmark-dev)
missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}
PKG_DETAIL=""
if ! command -v dpkg-query >/dev/null; then
  PKG_DETAIL="no dpkg: not a Debian/Ubuntu system, using what is installed"
else
  MISSING=$(missing "${CORE_PACKAGES[@]}" "${FULL_PACKAGES[@]}" | tr '\n' ' ')
  if [ -z "${MISSING// /}" ]; then
    PKG_DETAIL="all present"
  elif [ "$INSTALL" = 0 ]; then
    PKG_DETAIL="missing (not installed: --no-install): $MISSING"
  elif ! command -v apt-get >/dev/null || ! as_root true; then
    PKG_DETAIL="missing and cannot install (need apt-get and root or sudo): $MISSING"
  else
    note "installing: $MISSING"
    export DEBIAN_FRONTEND=noninteractive
    timeout 150 bash -c "$(declare -f as_root); as_root apt-get update -qq" >>"$LOG" 2>&1 \
      || note "apt-get update failed or timed out (see $LOG); trying the cached lists"
    # Only names this mirror knows (prometheus-cpp-dev is missing from some releases).
    KNOWN=()
    for p in $MISSING; do apt-cache show "$p" >/dev/null 2>&1 && KNOWN+=("$p"); done
    if [ ${#KNOWN[@]} -gt 0 ]; then
      timeout 300 bash -c "$(declare -f as_root); as_root apt-get install -y -qq --no-install-recommends ${KNOWN[*]}" \
        >>"$LOG" 2>&1 || note "apt-get install failed or timed out (see $LOG)"
    fi
    STILL=$(missing "${CORE_PACKAGES[@]}" "${FULL_PACKAGES[@]}" | tr '\n' ' ')
    PKG_DETAIL="installed: ${KNOWN[*]:-none}"
    [ -n "${STILL// /}" ] && PKG_DETAIL+="; still missing: $STILL"
  fi
fi
command -v cmake >/dev/null || fatal "cmake is missing and could not be installed ($PKG_DETAIL)"
CMAKE_VERSION=$(cmake --version | sed -n 's/cmake version \([0-9.]*\).*/\1/p')
GENERATOR="Unix Makefiles"
command -v ninja >/dev/null && GENERATOR=Ninja
put packages "$(jstr "$PKG_DETAIL")"
end_step ok "$PKG_DETAIL; cmake $CMAKE_VERSION, generator $GENERATOR"

# ---- 3 configure ---------------------------------------------------------------------------------
begin configure
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }
COMMON_ARGS=(-G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$ARCH"
  "-DCMAKE_CUDA_COMPILER=$CUDACXX")
MODE=""
if version_ge "$CMAKE_VERSION" 3.24 &&
  timeout 180 cmake -S "$ROOT" -B "$BUILD_BASE/full" "${COMMON_ARGS[@]}" -DAMPSCOPE_ENABLE_CUDA=ON \
    >"$BUILD_BASE/configure-full.log" 2>&1; then
  MODE=full
  BUILD="$BUILD_BASE/full"
else
  note "the whole project does not configure here (log: $BUILD_BASE/configure-full.log): $(grep -m1 -A2 'CMake Error' "$BUILD_BASE/configure-full.log" 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
  version_ge "$CMAKE_VERSION" 3.22 || fatal "cmake $CMAKE_VERSION is older than 3.22"
  if timeout 180 cmake -S "$ROOT/bench/gpu" -B "$BUILD_BASE/standalone" "${COMMON_ARGS[@]}" \
    >"$BUILD_BASE/configure-standalone.log" 2>&1; then
    MODE=standalone
    BUILD="$BUILD_BASE/standalone"
  else
    fatal "neither the whole project nor bench/gpu configures: $(grep -m1 -A3 'CMake Error' "$BUILD_BASE/configure-standalone.log" | tr '\n' ' ' | cut -c1-400) (log: $BUILD_BASE/configure-standalone.log)"
  fi
fi
put build "{\"mode\": $(jstr "$MODE"), \"cuda_architectures\": $(jstr "$ARCH"), \"cmake\": $(jstr "$CMAKE_VERSION"), \"dir\": $(jstr "$BUILD")}"
end_step ok "$MODE build in $BUILD"

# ---- 4 build -------------------------------------------------------------------------------------
begin build
TARGETS_ALL=$(cmake --build "$BUILD" --target help 2>/dev/null | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p; s/^\([A-Za-z0-9_.+-]*\): .*/\1/p' | sort -u)
has_target() { grep -qx "$1" <<<"$TARGETS_ALL"; }
ESSENTIAL=(ampscope-train ampscope_gpu_stats_bandwidth)
for t in $(grep -E 'cuda.*_test$' <<<"$TARGETS_ALL"); do ESSENTIAL+=("$t"); done
BUILD_TIMEOUT="${AMPSCOPE_GPU_CHECK_BUILD_TIMEOUT:-420}"
if ! timeout "$BUILD_TIMEOUT" cmake --build "$BUILD" -j "$JOBS" --target "${ESSENTIAL[@]}" >"$BUILD_BASE/build.log" 2>&1; then
  fatal "building ${ESSENTIAL[*]} failed: $(grep -m3 -E 'error|FAILED' "$BUILD_BASE/build.log" | tr '\n' ' ' | cut -c1-400) (log: $BUILD_BASE/build.log)"
fi
OPTIONAL_DETAIL=""
HAVE_SERVER=0
if [ "$MODE" = full ] && [ "$(elapsed)" -gt 330 ]; then
  OPTIONAL_DETAIL="; ampscope-server/ampscope skipped: $(elapsed)s gone, keeping the 8-minute budget"
elif [ "$MODE" = full ] && has_target ampscope-server && has_target ampscope; then
  if timeout 300 cmake --build "$BUILD" -j "$JOBS" --target ampscope-server ampscope \
    >"$BUILD_BASE/build-server.log" 2>&1; then
    HAVE_SERVER=1
  else
    OPTIONAL_DETAIL="; ampscope-server/ampscope did not build (log: $BUILD_BASE/build-server.log)"
  fi
fi
find_bin() { find "$BUILD" -type f -name "$1" -perm -u+x 2>/dev/null | head -1; }
TRAIN=$(find_bin ampscope-train)
BANDWIDTH=$(find_bin ampscope_gpu_stats_bandwidth)
SERVER_BIN=$(find_bin ampscope-server)
CLI_BIN=$(find_bin ampscope)
[ -x "$TRAIN" ] || fatal "ampscope-train was not built"
end_step ok "${#ESSENTIAL[@]} targets$OPTIONAL_DETAIL"

# ---- 5 tests -------------------------------------------------------------------------------------
begin tests
T_PASS=0; T_FAIL=0; T_SKIP=0; T_BIN_JSON=""; T_FAILED_NAMES=""
for t in "${ESSENTIAL[@]}"; do
  case "$t" in *_test) ;; *) continue ;; esac
  bin=$(find_bin "$t")
  [ -x "$bin" ] || continue
  out="$WORK/$t.txt"
  timeout 240 "$bin" --gtest_brief=1 >"$out" 2>&1
  rc=$?
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  p=${p:-0}; s=${s:-0}; f=${f:-0}
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; fi  # crashed or timed out
  T_PASS=$((T_PASS + p)); T_SKIP=$((T_SKIP + s)); T_FAIL=$((T_FAIL + f))
  [ "$f" != 0 ] && T_FAILED_NAMES+="$t($(grep -m5 '^\[  FAILED  \] [A-Za-z]' "$out" | sed 's/^\[  FAILED  \] //; s/,.*//' | tr '\n' ' ')) "
  T_BIN_JSON+="${T_BIN_JSON:+, }\"$t\": {\"passed\": $p, \"failed\": $f, \"skipped\": $s, \"exit\": $rc}"
  note "$t: $p passed, $f failed, $s skipped"
done
put tests "{\"passed\": $T_PASS, \"failed\": $T_FAIL, \"skipped\": $T_SKIP, \"binaries\": {$T_BIN_JSON}}"
if [ "$T_FAIL" -ne 0 ]; then
  end_step failed "$T_FAIL failed: $T_FAILED_NAMES(outputs in $WORK)"
elif [ "$T_PASS" -eq 0 ]; then
  end_step failed "no CUDA test ran"
else
  end_step ok "$T_PASS passed, $T_SKIP skipped"
fi

# ---- 6 bandwidth ---------------------------------------------------------------------------------
begin bandwidth
if [ -x "$BANDWIDTH" ] && timeout 180 "$BANDWIDTH" --out "$WORK/bandwidth.json" 2>"$WORK/bandwidth.txt"; then
  BW_JSON=$(cat "$WORK/bandwidth.json")
  RATIO=$(sed -n 's/.*"gpu_stats_bandwidth_ratio": \([0-9.eE+-]*\).*/\1/p' "$WORK/bandwidth.json")
  FUSED=$(sed -n 's/.*"gpu_fused_unscale_bandwidth_ratio": \([0-9.eE+-]*\).*/\1/p' "$WORK/bandwidth.json")
  put gpu_stats_bandwidth_ratio "$(jnum "$RATIO")"
  put gpu_fused_unscale_bandwidth_ratio "$(jnum "$FUSED")"
  put stats_bandwidth "$BW_JSON"
  cat "$WORK/bandwidth.txt" >&2
  end_step ok "gpu_stats_bandwidth_ratio $RATIO, gpu_fused_unscale_bandwidth_ratio $FUSED (targets >= 0.85)"
else
  put gpu_stats_bandwidth_ratio null
  put gpu_fused_unscale_bandwidth_ratio null
  end_step failed "$(tail -2 "$WORK/bandwidth.txt" 2>/dev/null | tr '\n' ' ')"
fi

# ---- 7 loss vs CPU -------------------------------------------------------------------------------
begin loss_vs_cpu
LOSS_ARGS="--precision amp-fp16 --context 64 --width 128 --heads 4 --layers 4 --batch 16 --steps 30 --warmup 5 --seed 1 --eval-every 0 --quiet"
losses() { grep -o '"loss":[-0-9.eE+]*' "$1" | cut -d: -f2; }
# compare_losses REF.jsonl NEW.jsonl REF_NAME NEW_NAME FIRST_TOL ANY_TOL: the two runs' losses
# step by step as JSON: the relative difference |new - ref| / |ref| at the first step (forward
# only) within FIRST_TOL and at every step within ANY_TOL.
compare_losses() {
  paste <(losses "$1") <(losses "$2") | awk -v rn="$3" -v nn="$4" -v ft="$5" -v at="$6" '
    function abs(x) { return x < 0 ? -x : x }
    { n++; d = abs($2 - $1) / abs($1); if (n == 1) first = d; if (d > max) max = d; r = $1; v = $2 }
    END { ok = (n > 0 && first <= ft + 0 && max <= at + 0) ? "true" : "false";
          printf "{\"steps\": %d, \"%s_final_loss\": %.6f, \"%s_final_loss\": %.6f, \"first_step_rel_diff\": %.3g, \"max_rel_diff\": %.3g, \"within_tolerance\": %s, \"tolerance\": {\"first_step\": %s, \"any_step\": %s}}", n, rn, r, nn, v, first, max, ok, ft, at }'
}
tok_per_s() { sed -n 's/.*| \([0-9.]*\) tok\/s.*/\1/p' "$1" | tail -1; }
timeout 120 "$TRAIN" --device cuda $LOSS_ARGS --log-json "$WORK/loss_gpu.jsonl" >"$WORK/loss_gpu.txt" 2>&1
GPU_RC=$?
timeout 180 "$TRAIN" --device cpu $LOSS_ARGS --log-json "$WORK/loss_cpu.jsonl" >"$WORK/loss_cpu.txt" 2>&1
CPU_RC=$?
if [ $GPU_RC -ne 0 ] || [ $CPU_RC -ne 0 ]; then
  put loss_vs_cpu "{\"config\": $(jstr "$LOSS_ARGS"), \"error\": $(jstr "gpu exit $GPU_RC: $(tail -1 "$WORK/loss_gpu.txt"); cpu exit $CPU_RC: $(tail -1 "$WORK/loss_cpu.txt")")}"
  end_step failed "training failed (gpu exit $GPU_RC, cpu exit $CPU_RC; outputs in $WORK)"
else
  # Relative difference per step; tolerance: 2e-3 at step 0 (forward only), 3e-2 at any step.
  CMP=$(compare_losses "$WORK/loss_cpu.jsonl" "$WORK/loss_gpu.jsonl" cpu gpu 2e-3 3e-2)
  put loss_vs_cpu "{\"config\": $(jstr "$LOSS_ARGS"), \"gpu_tokens_per_s\": $(jnum "$(tok_per_s "$WORK/loss_gpu.txt")"), \"cpu_tokens_per_s\": $(jnum "$(tok_per_s "$WORK/loss_cpu.txt")"), \"comparison\": $CMP}"
  if grep -q '"within_tolerance": true' <<<"$CMP"; then
    end_step ok "$CMP"
  else
    end_step failed "GPU loss outside the tolerance of the CPU run: $CMP"
  fi
fi

# ---- 7b FP8 GEMMs --------------------------------------------------------------------------------
# fp8-delayed with its GEMMs through cuBLASLt's FP8 GEMM (--fp8-gemm auto) against the emulation
# (dequantised FP32 GEMMs, the CPU's): the same run within 3e-2 at every step, and the speed of
# each (gpu_fp8_gemm_speedup: real over emulated tokens per second).
begin fp8_gemms
FP8_ARGS="${LOSS_ARGS/--precision amp-fp16/--precision fp8-delayed}"
timeout 120 "$TRAIN" --device cuda $FP8_ARGS --fp8-gemm auto --log-json "$WORK/fp8_real.jsonl" >"$WORK/fp8_real.txt" 2>&1
REAL_RC=$?
timeout 120 "$TRAIN" --device cuda $FP8_ARGS --fp8-gemm emulate --log-json "$WORK/fp8_emul.jsonl" >"$WORK/fp8_emul.txt" 2>&1
EMUL_RC=$?
if [ $REAL_RC -ne 0 ] || [ $EMUL_RC -ne 0 ]; then
  put fp8_gemms "{\"config\": $(jstr "$FP8_ARGS"), \"error\": $(jstr "real exit $REAL_RC: $(tail -1 "$WORK/fp8_real.txt"); emulate exit $EMUL_RC: $(tail -1 "$WORK/fp8_emul.txt")")}"
  end_step failed "training failed (real exit $REAL_RC, emulate exit $EMUL_RC; outputs in $WORK)"
else
  CMP=$(compare_losses "$WORK/fp8_emul.jsonl" "$WORK/fp8_real.jsonl" emulated real 3e-2 3e-2)
  REAL_TPS=$(tok_per_s "$WORK/fp8_real.txt")
  EMUL_TPS=$(tok_per_s "$WORK/fp8_emul.txt")
  SPEEDUP=$(awk -v r="$REAL_TPS" -v e="$EMUL_TPS" 'BEGIN { if (e > 0) printf "%.3f", r / e }')
  put fp8_gemms "{\"config\": $(jstr "$FP8_ARGS"), \"real_tokens_per_s\": $(jnum "$REAL_TPS"), \"emulated_tokens_per_s\": $(jnum "$EMUL_TPS"), \"comparison\": $CMP}"
  put gpu_fp8_gemm_speedup "$(jnum "$SPEEDUP")"
  if grep -q '"within_tolerance": true' <<<"$CMP"; then
    end_step ok "$CMP"
  else
    end_step failed "real FP8 GEMMs outside the tolerance of the emulation: $CMP"
  fi
fi

# ---- 8 tensor cores ------------------------------------------------------------------------------
begin tensor_cores
HEAVY_ARGS="--precision amp-fp16 --context 256 --width 1024 --heads 16 --layers 4 --batch 16 --steps 12 --warmup 2 --seed 1 --eval-every 0 --quiet"
CONTROL_ARGS="--precision fp32 --context 256 --width 1024 --heads 16 --layers 4 --batch 16 --steps 6 --warmup 2 --seed 1 --eval-every 0 --quiet"
TC_REASON=""
AGENT_ARGS=()
HELP=$("$TRAIN" --help 2>&1)
if ! grep -q -- '--cupti-every' <<<"$HELP" || ! grep -q -- '--server' <<<"$HELP"; then
  TC_REASON="ampscope-train has no agent flags (--server, --cupti-every): the agent is not built into it"
elif [ "$HAVE_SERVER" != 1 ]; then
  TC_REASON="ampscope-server and the ampscope CLI are not built here ($MODE build): the ratio travels agent -> server -> 'ampscope tail', and the agent's spool has no reader"
else
  "$SERVER_BIN" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
    --db "$WORK/store.db" \
    --ready-file "$WORK/ready.json" >"$WORK/server.txt" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 50); do [ -s "$WORK/ready.json" ] && break; sleep 0.2; done
  ADDR=$(sed -n 's/.*"grpc": "\([^"]*\)".*/\1/p' "$WORK/ready.json" 2>/dev/null)
  if [ -z "$ADDR" ]; then
    TC_REASON="ampscope-server did not start: $(tail -2 "$WORK/server.txt" | tr '\n' ' ')"
  else
    AGENT_ARGS=(--server "$ADDR" --cupti-every 1)
  fi
fi
# run_config NAME ARGS: trains on the GPU, sets RUN_JSON.
run_config() {
  local name="$1" args="$2" run_id="gpucheck-$1-$$" ratio="null" reason="$TC_REASON" extra=()
  [ ${#AGENT_ARGS[@]} -gt 0 ] && extra=("${AGENT_ARGS[@]}" --run-id "$run_id" --spool-dir "$WORK/spool-$name")
  timeout 150 "$TRAIN" --device cuda $args "${extra[@]+"${extra[@]}"}" >"$WORK/$name.txt" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    RUN_JSON="{\"config\": $(jstr "$args"), \"error\": $(jstr "exit $rc: $(tail -1 "$WORK/$name.txt")")}"
    return 1
  fi
  if [ ${#extra[@]} -gt 0 ]; then
    sleep 1  # the agent flushed at exit; the server stores asynchronously
    timeout 30 "$CLI_BIN" tail "$run_id" --server "$ADDR" --json -n 1000 >"$WORK/$name.reports.jsonl" 2>"$WORK/$name.tail.txt"
    # Steps without a measurement carry null; only numbers count.
    ratio=$(grep -oE '"tensor_core_active_ratio":-?[0-9][-0-9.eE+]*' "$WORK/$name.reports.jsonl" | cut -d: -f2 |
      awk '{ s += $1; n++ } END { if (n > 0) printf "%.4f", s / n }')
    if [ -n "$ratio" ]; then
      reason=""
    else
      ratio=null
      reason="no report carried tensor_core_active_ratio ($(grep -i -m2 'cupti' "$WORK/$name.txt" | tr '\n' ' ')$(tail -1 "$WORK/$name.tail.txt" 2>/dev/null))"
    fi
  fi
  RUN_JSON="{\"config\": $(jstr "$args"), \"tokens_per_s\": $(jnum "$(tok_per_s "$WORK/$name.txt")"), \"final\": $(jstr "$(tail -1 "$WORK/$name.txt")"), \"tensor_core_active_ratio\": $ratio, \"not_measured_because\": $( [ -n "$reason" ] && jstr "$reason" || echo null)}"
  [ "$ratio" != null ]
}
TC_OK=1
run_config matmul_heavy "$HEAVY_ARGS" || TC_OK=0
HEAVY_JSON=$RUN_JSON
HEAVY_RATIO=$(sed -n 's/.*"tensor_core_active_ratio": \([0-9.]*\).*/\1/p' <<<"$HEAVY_JSON")
run_config control_fp32 "$CONTROL_ARGS" || TC_OK=0
CONTROL_JSON=$RUN_JSON
[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
SERVER_PID=""
put tensor_core_active_ratio "$(jnum "$HEAVY_RATIO")"
put tensor_cores "{\"matmul_heavy\": $HEAVY_JSON, \"control_fp32_no_tensor_cores\": $CONTROL_JSON}"
if [ $TC_OK = 1 ]; then
  end_step ok "matmul-heavy $HEAVY_RATIO; control $(sed -n 's/.*"tensor_core_active_ratio": \([0-9.]*\).*/\1/p' <<<"$CONTROL_JSON")"
elif grep -q '"error"' <<<"$HEAVY_JSON$CONTROL_JSON"; then
  end_step failed "a GPU training run failed (outputs in $WORK)"
else
  end_step skipped "tensor_core_active_ratio not measured: ${TC_REASON:-see not_measured_because in the results}"
fi

# ---- 9 pytorch -----------------------------------------------------------------------------------
begin pytorch
PY="${AMPSCOPE_GPU_CHECK_PYTHON:-python3}"
AGENT_SO=$(find "$BUILD" -name libampscope_agent.so -type f 2>/dev/null | head -1)
if [ "$HAVE_SERVER" != 1 ] || [ -z "$AGENT_SO" ]; then
  end_step skipped "needs the whole-project build (ampscope-server, libampscope_agent.so)"
elif ! timeout 60 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  end_step skipped "$PY has no torch with CUDA"
else
  PYTHONPATH="$ROOT/python" AMPSCOPE_AGENT_LIBRARY="$AGENT_SO" AMPSCOPE_SERVER_BIN="$SERVER_BIN" \
    AMPSCOPE_CLI_BIN="$CLI_BIN" timeout 300 "$PY" "$ROOT/tests/python/torch_cuda_test.py" \
    >"$WORK/pytorch.txt" 2>&1
  rc=$?
  put pytorch "{\"exit\": $rc, \"last_line\": $(jstr "$(tail -1 "$WORK/pytorch.txt")")}"
  if [ $rc -eq 0 ]; then end_step ok "$(tail -1 "$WORK/pytorch.txt")"; else end_step failed "exit $rc (output in $WORK/pytorch.txt)"; fi
fi

# ---- 10 results ----------------------------------------------------------------------------------
DONE=1
STEP=results
write_results
if [ ${#FAILED_STEPS[@]} -gt 0 ]; then
  say "finished in $(elapsed)s with failed steps: ${FAILED_STEPS[*]} (results: $OUT, log: $LOG)"
  exit 1
fi
say "finished in $(elapsed)s; results: $OUT"
