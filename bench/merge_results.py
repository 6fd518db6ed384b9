"""Merges JSON fragments into a results file: `merge_results.py RESULTS FRAGMENT...`.

Each benchmark writes its own fragment of flat keys (an object); this read-modify-write keeps
the keys other benchmarks put in RESULTS and replaces those the fragments carry (later
fragments win). An exclusive lock on RESULTS.lock serialises concurrent merges, and the new
file replaces the old one atomically.
"""

import fcntl
import json
import os
import sys
import tempfile


def main():
    if len(sys.argv) < 3:
        print("usage: merge_results.py RESULTS FRAGMENT...", file=sys.stderr)
        return 2
    results, fragments = sys.argv[1], sys.argv[2:]
    with open(results + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {}
        if os.path.exists(results):
            with open(results) as f:
                merged = json.load(f)
        for path in fragments:
            with open(path) as f:
                fragment = json.load(f)
            if not isinstance(fragment, dict):
                print(f"merge_results.py: {path} is not a JSON object", file=sys.stderr)
                return 1
            merged.update(fragment)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(results)), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(merged, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
