#!/usr/bin/python3
"""libampscope_agent.so from Python with ctypes and nothing but the standard library.

Starts a real ampscope-server on a free port (read back from its --ready-file), loads the
library by path, streams three steps with an FP32 tensor each (a NaN in the second) through the
C API, flushes, destroys the agent, and checks with the ampscope CLI that the server stored the
steps and the NaN's tensor as the first offender. Also checks that ampscope_agent_abi_version()
is the header's AMPSCOPE_AGENT_ABI_VERSION.

Run by ctest (tests/agent/CMakeLists.txt) with:
  --lib PATH --header PATH/c_api.h --server PATH/ampscope-server --cli PATH/ampscope
"""

import argparse
import ctypes
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

RUN_ID = "py-ctypes-smoke"
STEPS = 3

# ampscope/agent/c_api.h, as a Python caller declares it (enums are C ints).
FORMAT_FP32, FORMAT_FP16 = 0, 1
ROLE_WEIGHT_GRAD = 4
PHASE_BACKWARD = 3
SCALER_DYNAMIC = 1
OK = 0


class RunInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("host", ctypes.c_char_p),
        ("trainer", ctypes.c_char_p),
        ("precision", ctypes.c_char_p),
        ("compute_format", ctypes.c_int),
        ("loss_scale", ctypes.c_double),
        ("growth_factor", ctypes.c_double),
        ("backoff_factor", ctypes.c_double),
        ("growth_interval", ctypes.c_int64),
        ("scaler_kind", ctypes.c_int),
        ("min_scale", ctypes.c_double),
        ("max_scale", ctypes.c_double),
        ("hysteresis", ctypes.c_int32),
    ]


class TensorView(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("role", ctypes.c_int),
        ("phase", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("rank", ctypes.c_int),
        ("numel", ctypes.c_int64),
        ("device", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("scale", ctypes.c_double),
        ("micro_step", ctypes.c_int),
        ("order", ctypes.c_int),
        ("has_held", ctypes.c_int),
        ("held", ctypes.c_int),
    ]


class StepInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("step", ctypes.c_int64),
        ("loss", ctypes.c_double),
        ("loss_scale", ctypes.c_double),
        ("scale_after", ctypes.c_double),
        ("found_inf", ctypes.c_int),
        ("skipped", ctypes.c_int),
        ("grad_norm", ctypes.c_double),
        ("lr", ctypes.c_double),
        ("tokens", ctypes.c_int64),
        ("step_time_s", ctypes.c_double),
        ("optimizer_steps", ctypes.c_int64),
        ("has_val_loss", ctypes.c_int),
        ("val_loss", ctypes.c_double),
        ("fp32_layers", ctypes.POINTER(ctypes.c_char_p)),
        ("num_fp32_layers", ctypes.c_size_t),
    ]


class Counters(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64)
        for name in ("steps", "reports_spooled", "reports_acked", "dropped_reports",
                     "dropped_tensors", "rejected_reports", "spool_bytes", "reconnects",
                     "policies_applied", "policies_refused")
    ] + [("training_thread_s", ctypes.c_double), ("connected", ctypes.c_int)]


def new(struct_type):
    """The *_INIT macro: struct_size set, the rest zero."""
    s = struct_type()
    s.struct_size = ctypes.sizeof(struct_type)
    return s


def load(path):
    lib = ctypes.CDLL(path)
    status, p = ctypes.c_int, ctypes.c_void_p
    for name, restype, argtypes in [
        ("ampscope_agent_abi_version", ctypes.c_uint32, []),
        ("ampscope_agent_version", ctypes.c_char_p, []),
        ("ampscope_status_string", ctypes.c_char_p, [status]),
        ("ampscope_agent_config_create", status, [ctypes.POINTER(p)]),
        ("ampscope_agent_config_destroy", None, [p]),
        ("ampscope_agent_config_set", status, [p, ctypes.c_char_p, ctypes.c_char_p]),
        ("ampscope_agent_config_last_error", ctypes.c_char_p, [p]),
        ("ampscope_agent_create", status, [p, ctypes.POINTER(RunInfo), ctypes.POINTER(p)]),
        ("ampscope_agent_destroy", status, [p, ctypes.c_int64]),
        ("ampscope_agent_begin_step", ctypes.c_int, [p, ctypes.c_int64]),
        ("ampscope_agent_observe", status, [p, ctypes.POINTER(TensorView)]),
        ("ampscope_agent_end_step", status, [p, ctypes.POINTER(StepInfo)]),
        ("ampscope_agent_flush", status, [p, ctypes.c_int64]),
        ("ampscope_agent_get_counters", status, [p, ctypes.POINTER(Counters)]),
        ("ampscope_agent_last_error", ctypes.c_char_p, [p]),
    ]:
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, argtypes
    return lib


def header_abi_version(header):
    with open(header, encoding="utf-8") as f:
        m = re.search(r"#define AMPSCOPE_AGENT_ABI_VERSION (\d+)u?", f.read())
    if not m:
        raise SystemExit(f"{header}: no AMPSCOPE_AGENT_ABI_VERSION")
    return int(m.group(1))


def start_server(binary, tmp):
    ready = os.path.join(tmp, "ready.json")
    log = open(os.path.join(tmp, "server.log"), "wb")
    server = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--db", os.path.join(tmp, "store.db"), "--ready-file", ready],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not os.path.exists(ready):  # written under another name and renamed: whole
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            with open(os.path.join(tmp, "server.log"), encoding="utf-8", errors="replace") as f:
                raise SystemExit("ampscope-server did not start:\n" + f.read())
        time.sleep(0.05)
    with open(ready, encoding="utf-8") as f:
        return server, json.load(f)["grpc"]


def check(lib, handle, status, what):
    if status != OK:
        error = lib.ampscope_agent_last_error(handle) if handle else b""
        raise SystemExit(f"{what}: {lib.ampscope_status_string(status).decode()} "
                         f"{error.decode(errors='replace')}")


def stream_steps(lib, address, spool_dir):
    config = ctypes.c_void_p()
    check(lib, None, lib.ampscope_agent_config_create(ctypes.byref(config)), "config_create")
    for key, value in [("run_id", RUN_ID), ("server", address), ("spool_dir", spool_dir),
                       ("sample_full_every", "1")]:
        if lib.ampscope_agent_config_set(config, key.encode(), value.encode()) != OK:
            raise SystemExit(f"config_set {key}: "
                             f"{lib.ampscope_agent_config_last_error(config).decode()}")
    run = new(RunInfo)
    run.trainer = b"c_api_smoke.py"
    run.precision = b"amp-fp16"
    run.compute_format = FORMAT_FP16
    run.scaler_kind = SCALER_DYNAMIC
    run.loss_scale = 1024.0
    agent = ctypes.c_void_p()
    if lib.ampscope_agent_create(config, ctypes.byref(run), ctypes.byref(agent)) != OK:
        raise SystemExit("create: " + lib.ampscope_agent_config_last_error(config).decode())
    lib.ampscope_agent_config_destroy(config)

    values = (ctypes.c_float * 64)(*[0.001 * (i + 1) for i in range(64)])
    shape = (ctypes.c_int64 * 2)(8, 8)
    for step in range(STEPS):
        values[5] = math.nan if step == 1 else 0.006
        lib.ampscope_agent_begin_step(agent, step)
        view = new(TensorView)
        view.name = b"py.fc.weight.grad"
        view.role = ROLE_WEIGHT_GRAD
        view.phase = PHASE_BACKWARD
        view.dtype = FORMAT_FP32
        view.data = ctypes.cast(values, ctypes.c_void_p)
        view.shape = shape
        view.rank = 2
        view.scale = 1024.0
        view.has_held = 1
        view.held = FORMAT_FP32
        check(lib, agent, lib.ampscope_agent_observe(agent, ctypes.byref(view)), "observe")
        info = new(StepInfo)
        info.step = step
        info.loss = 2.0 - 0.1 * step
        info.loss_scale = 1024.0
        info.scale_after = 512.0 if step == 1 else 1024.0
        info.found_inf = int(step == 1)
        info.skipped = int(step == 1)
        check(lib, agent, lib.ampscope_agent_end_step(agent, ctypes.byref(info)), "end_step")
    check(lib, agent, lib.ampscope_agent_flush(agent, 20000), "flush")
    counters = new(Counters)
    check(lib, agent, lib.ampscope_agent_get_counters(agent, ctypes.byref(counters)), "counters")
    if counters.steps != STEPS or counters.reports_acked != STEPS:
        raise SystemExit(f"counters: steps {counters.steps}, acked {counters.reports_acked}")
    check(lib, None, lib.ampscope_agent_destroy(agent, 10000), "destroy")


def cli_json(cli, *args):
    r = subprocess.run([cli, *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {r.stderr}")
    return json.loads(r.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--lib", "--header", "--server", "--cli"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()

    lib = load(args.lib)
    want = header_abi_version(args.header)
    got = lib.ampscope_agent_abi_version()
    if got != want:
        raise SystemExit(f"ampscope_agent_abi_version() is {got}, the header says {want}")

    with tempfile.TemporaryDirectory(prefix="ampscope-py-") as tmp:
        server, address = start_server(args.server, tmp)
        try:
            stream_steps(lib, address, os.path.join(tmp, "spool"))
            runs = cli_json(args.cli, "runs", "--server", address, "--json")["runs"]
            run = next((r for r in runs if r["run_id"] == RUN_ID), None)
            if run is None or run["steps"] != STEPS or run["trainer"] != "c_api_smoke.py":
                raise SystemExit(f"ampscope runs: {runs}")
            shown = cli_json(args.cli, "show", RUN_ID, "--server", address, "--json")
            offenders = [(o["step"], o["tensor"]) for o in shown["first_offenders"]]
            if offenders != [(1, "py.fc.weight.grad")]:
                raise SystemExit(f"ampscope show: first offenders {offenders}")
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"ok: ABI {got}, {STEPS} steps stored by ampscope-server")


if __name__ == "__main__":
    sys.exit(main())
