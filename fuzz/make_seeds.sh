#!/usr/bin/env bash
# Regenerates the committed seed corpora (fuzz/corpus/<target>/) from the project's own writers:
# ampscope_fuzz_seeds for the streams, policy updates, checkpoints, spool segments and option
# strings, NumPy for the .npy files (PYTHON: a Python with NumPy, default python3). Build ampscope_fuzz_seeds first (in build/, or in
# AMPSCOPE_BUILD_DIR): cmake --build build --target ampscope_fuzz_seeds. Regression inputs
# (the files named regression-*) are left as they are.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${AMPSCOPE_BUILD_DIR:-$ROOT/build}"
"$BUILD_DIR/fuzz/ampscope_fuzz_seeds" "$ROOT/fuzz/corpus"
"${PYTHON:-python3}" "$ROOT/fuzz/make_npy_seeds.py" "$ROOT/fuzz/corpus/npy_fuzz"
