"""ampscope: numerical-stability diagnostics for mixed-precision training.

This package is the Python side of ampscope's in-process agent (libampscope_agent.so, through
ctypes). `ampscope.torch` attaches it to a PyTorch training loop:

    import ampscope.torch as amps
    mon = amps.attach(model, optimizer, scaler, run_id="gpt-small-7", server="127.0.0.1:50051")
    ...
    mon.close()
"""

from ._agent import (Agent, AgentError, Stats, compute_stats, count_recipe,
                     scale_and_compute_stats)
from ._capi import LibraryError
from ._server import LocalServer

__all__ = ["Agent", "AgentError", "LibraryError", "LocalServer", "Stats", "compute_stats",
           "count_recipe", "scale_and_compute_stats"]
__version__ = "0.1.0"
