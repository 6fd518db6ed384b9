#!/usr/bin/env bash
# PolicyEvalTest.SmokeEveryPolicyCompletes: bench/policy_eval/policy_eval.py --profile smoke,
# then tests/policy_eval/check_table.py on what it wrote.
#   smoke_test.sh BUILD_DIR OUT_DIR
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
rm -rf "$2"
mkdir -p "$2"
# Debian's interpreter: the harness uses only the standard library.
python=/usr/bin/python3
"$python" "$root/bench/policy_eval/policy_eval.py" --profile smoke --build-dir "$1" \
  --out-dir "$2" --fragment "$2/fragment.json"
"$python" "$here/check_table.py" "$2"
