"""ampscope for PyTorch (torch >= 1.13): attach() a monitor to a model, optimizer and loss
scaler; LossScaler, a GradScaler with the built-in trainer's rules (GradScaler's and
Megatron-LM's) that runs on the CPU too and takes the server's policy natively.
See docs/pytorch.md."""

from ._monitor import Monitor, attach
from ._scaler import LossScaler

__all__ = ["Monitor", "attach", "LossScaler"]
