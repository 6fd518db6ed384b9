#!/usr/bin/python3
"""The documented install step: `cmake --install BUILD --component python --prefix P` lays the
package and libampscope_agent.so where Debian's interpreter imports them from, and the package
then finds its library by itself (no AMPSCOPE_AGENT_LIBRARY).

Run by ctest with: --cmake CMAKE --build-dir BUILD --site-dir RELATIVE_INSTALL_DIR"""

import argparse
import os
import subprocess
import sys
import tempfile

CHECK = """
import ampscope, ampscope._capi as c, ampscope.torch as amps, torch
lib = c.library()
print(lib._name)
s = amps.LossScaler(init_scale=8.0)
s.update(16.0)
print(s.get_scale())
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cmake", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--site-dir", required=True)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ampscope-install-") as prefix:
        subprocess.run([a.cmake, "--install", a.build_dir, "--component", "python", "--prefix",
                        prefix], check=True, stdout=subprocess.DEVNULL)
        site = os.path.join(prefix, a.site_dir)
        installed = os.path.join(site, "ampscope", "_lib", "libampscope_agent.so")
        if not os.path.exists(installed):
            raise SystemExit(f"not installed: {installed}")
        env = {k: v for k, v in os.environ.items()
               if k not in ("AMPSCOPE_AGENT_LIBRARY", "PYTHONPATH")}
        env["PYTHONPATH"] = site
        r = subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=prefix,
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SystemExit(f"the installed package failed:\n{r.stderr}")
        lines = r.stdout.split()
        if os.path.realpath(lines[0]) != os.path.realpath(installed):
            raise SystemExit(f"loaded {lines[0]}, not the installed {installed}")
        if float(lines[1]) != 16.0:
            raise SystemExit(f"LossScaler from the installed package: scale {lines[1]}")
    print(f"ok: installed into {a.site_dir} and imported from there")


if __name__ == "__main__":
    main()
