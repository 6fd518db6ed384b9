"""ampscope-server as a child process on loopback: for a notebook, an example, a test or a
benchmark that wants a server of its own.

    with ampscope.LocalServer() as server:            # ampscope-server from PATH, or
        mon = amps.attach(model, opt, scaler,         # AMPSCOPE_SERVER_BIN
                          run_id="r1", server=server.address)
        ...

The store (SQLite) and the server's log live in `workdir` (a temporary folder unless one was
given). stop() and kill() end the process and keep the folder: start() after them starts it
again on the same address and store, as a restarted server would be. close() (also the end of
the `with` block, and interpreter exit for one never closed) stops it and removes the temporary
folder; a workdir that was given is never removed."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref


class LocalServer:
    def __init__(self, binary=None, *args, workdir=None, start_timeout_s=30.0, metrics=False):
        """binary: the ampscope-server program (default: AMPSCOPE_SERVER_BIN, else
        ampscope-server on PATH). args: more of its flags ("--policy", "headroom", ...).
        metrics: also serve /metrics on a free loopback port (metrics_address once started)."""
        binary = binary or os.environ.get("AMPSCOPE_SERVER_BIN") or shutil.which(
            "ampscope-server")
        if not binary:
            raise FileNotFoundError("ampscope-server not found: pass its path or set "
                                    "AMPSCOPE_SERVER_BIN")
        self.binary = binary
        self.args = [str(a) for a in args]
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="ampscope-server-")
        self.db = os.path.join(self.workdir, "store.db")
        self.address = None  # "127.0.0.1:PORT" once started
        self.metrics_address = None  # "127.0.0.1:PORT" of /metrics, when asked for
        self._metrics = metrics
        self.proc = None
        self._starts = 0
        self._timeout = start_timeout_s
        self._closed = False
        # A LocalServer nobody closed still ends its process and removes its temporary folder
        # (at collection or interpreter exit).
        self._state = {"proc": None}
        self._finalizer = weakref.finalize(self, _cleanup, self._state,
                                           self.workdir if self._own_workdir else None)

    def start(self):
        """Starts the server (on a free port the first time, on the same one after that) and
        returns self once it serves. After close() (or stop(remove=True)) its store is gone:
        RuntimeError."""
        if self._closed:
            raise RuntimeError(f"this LocalServer was closed and its store {self.workdir} "
                               "removed; make a new one")
        if self.proc is not None and self.proc.poll() is None:
            return self  # already serving
        self._starts += 1
        ready = os.path.join(self.workdir, f"ready{self._starts}.json")
        with open(self.log_path(), "wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--listen", self.address or "127.0.0.1:0", "--metrics-listen",
                 (self.metrics_address or "127.0.0.1:0") if self._metrics else "",
                 "--http-listen", "127.0.0.1:0",
                 "--db", self.db, "--ready-file", ready, *self.args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._state["proc"] = self.proc
        deadline = time.monotonic() + self._timeout
        while not os.path.exists(ready):  # written under another name and renamed: whole
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("ampscope-server did not start:\n" + self.log()[-4000:])
            time.sleep(0.05)
        with open(ready, encoding="utf-8") as f:
            bound = json.load(f)
        self.address = bound["grpc"]
        if self._metrics:
            self.metrics_address = bound["metrics"]
        return self

    def log_path(self):
        return os.path.join(self.workdir, f"server{self._starts}.log")

    def log(self):
        """The current process's output."""
        try:
            with open(self.log_path(), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill(self):
        """SIGKILL: no graceful shutdown (what a crash looks like to the agents)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, remove=False):
        """Graceful shutdown (SIGTERM, SIGKILL after 30 s). The workdir and its store stay for
        start(); remove=True also removes a temporary workdir, as close() does."""
        _terminate(self.proc)
        if remove:
            self.close()

    def close(self):
        """Stops the server and removes its temporary workdir (not one that was given).
        Idempotent; start() afterwards raises."""
        _terminate(self.proc)
        self._closed = True
        self._finalizer()

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.close()


def _terminate(proc):
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _cleanup(state, temporary_workdir):
    _terminate(state["proc"])
    if temporary_workdir is not None:
        shutil.rmtree(temporary_workdir, ignore_errors=True)
