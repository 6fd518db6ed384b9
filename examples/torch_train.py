#!/usr/bin/python3
"""A PyTorch training loop with ampscope attached: a small GPT-style model learning a synthetic
sequence task under autocast, with ampscope.torch.LossScaler (or torch's GradScaler on a GPU).

    ampscope-server --policy headroom &                 # or: ./run demo starts one for you
    PYTHONPATH=python AMPSCOPE_AGENT_LIBRARY=build/agent/libampscope_agent.so \\
        /usr/bin/python3 examples/torch_train.py --server 127.0.0.1:50051 --steps 200
    ampscope show torch-example

(After `cmake --install build --component python` neither variable is needed.)
Options: --device cpu|cuda, --dtype bf16|fp16, --nan-at STEP injects a NaN into one MLP's
output at that step, to see the first offender and the skipped step in `ampscope show`.
"""

import argparse

import torch

import ampscope.torch as amps


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.act = torch.nn.GELU()
        self.out = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        att = torch.softmax(att.float().masked_fill(mask, float("-inf")), dim=-1).to(v.dtype)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(self.act(self.fc(self.ln2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, vocab=64, width=64, heads=4, layers=2, context=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))


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
    model = Gpt().to(a.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    scaler = amps.LossScaler(init_scale=a.init_scale)
    mon = amps.attach(model, optimizer, scaler, run_id=a.run_id, server=a.server,
                      compute_dtype=dtype, scheduler=scheduler)

    step = {"i": 0}

    def inject(module, inputs, output):
        return output.masked_fill(torch.ones_like(output, dtype=torch.bool), float("nan")) \
            if step["i"] == a.nan_at else None

    model.blocks[-1].fc.register_forward_hook(inject)
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
