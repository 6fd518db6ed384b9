#!/usr/bin/python3
"""A PyTorch training loop with ampscope attached: a small GPT (ampscope-train's model, as
bench/peers/torch_gpt.py writes it in PyTorch) learning a synthetic sequence task under
autocast, with ampscope.torch.LossScaler (a torch.cuda.amp.GradScaler attaches the same way).

    ampscope-server --policy headroom &                 # or: ./run demo starts one for you
    PYTHONPATH=python AMPSCOPE_AGENT_LIBRARY=build/agent/libampscope_agent.so \\
        /usr/bin/python3 examples/torch_train.py --server 127.0.0.1:50051 --steps 200
    ampscope show torch-example

(After `cmake --install build --component python` neither variable is needed.)
Options: --device cpu|cuda, --dtype bf16|fp16, --nan-at STEP injects a NaN into one MLP's
output at that step, to see the first offender and the skipped step in `ampscope show`.
"""

import argparse
import os
import sys

import torch

import ampscope.torch as amps

# The model: ampscope-train's GPT as PyTorch writes it (the benchmark's PyTorch peer).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                                "peers"))
from torch_gpt import build_model  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default=None, help="ampscope-server host:port (or AMPSCOPE_SERVER)")
    p.add_argument("--run-id", default="torch-example")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--init-scale", type=float, default=2.0**16)
    p.add_argument("--nan-at", type=int, default=-1, help="inject a NaN at this step")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16

    torch.manual_seed(0)
    model = build_model(torch, vocab=64, context=32, width=64, heads=4, layers=2).to(a.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    scaler = amps.LossScaler(init_scale=a.init_scale)
    mon = amps.attach(model, optimizer, scaler, run_id=a.run_id, server=a.server,
                      compute_dtype=dtype, scheduler=scheduler)

    step = {"i": 0}
    fc = model.blocks[-1].fc
    clean_forward = fc.forward

    def forward_with_nan(x):  # the layer itself produces the NaN at --nan-at
        out = clean_forward(x)
        return out.masked_fill(torch.ones_like(out, dtype=torch.bool), float("nan")) \
            if step["i"] == a.nan_at else out

    fc.forward = forward_with_nan
    g = torch.Generator().manual_seed(1)
    for i in range(a.steps):
        step["i"] = i
        start = torch.randint(0, 64, (16, 1), generator=g)
        seq = ((start + torch.arange(33)) % 64).to(a.device)
        x, y = seq[:, :-1], seq[:, 1:]
        with torch.autocast(a.device, dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        if i % 50 == 0 or i == a.steps - 1:
            print(f"step {i}: loss {loss.item():.4f}, scale {scaler.get_scale():g}")
    acked = mon.close()
    print(f"ampscope: {'all reports acknowledged' if acked else 'not all acknowledged yet (the rest stays in the spool for the next run)'}"
          f"; see `ampscope show {a.run_id}`")


if __name__ == "__main__":
    main()
