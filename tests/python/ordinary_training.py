#!/usr/bin/python3
"""A PyTorch training script in the ordinary style, with ampscope attached as docs/pytorch.md
says: its own loop, bf16 autocast with a loss scaler, gradient accumulation, clipping, an LR
scheduler, validation under eval() and no_grad() every epoch, an EMA copy (copy.deepcopy) that
also runs forwards, torch.save(model) when validation improves and a full checkpoint (model,
optimizer, scaler, scheduler) every epoch; --resume continues from that checkpoint in a new
process. The model holds an nn.MultiheadAttention (its projection weights belong to the
attention module, which is not a leaf) and modules named by nn.ModuleDict keys that are not
ASCII. torch_training_script_test.py runs it against a real server.

    ordinary_training.py --server HOST:PORT --run-id RUN --out DIR --epochs 2 [--resume]

Prints one JSON line at the end: the monitor's notices and warnings, the steps it took."""

import argparse
import copy
import json
import math
import os

import torch
from torch import nn

import ampscope.torch as amps

# Module names as Python allows them: any Unicode identifier, any ModuleDict key.
TEMPERATURE = "température"
LINEAR = "线性"


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.ModuleDict({TEMPERATURE: nn.ModuleDict({LINEAR: nn.Linear(width, 2 * width)}),
                                  "out": nn.Linear(2 * width, width)})

    def forward(self, x, mask):
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        h = torch.relu(self.mlp[TEMPERATURE][LINEAR](self.norm2(x)))
        return x + self.mlp["out"](h)


class LanguageModel(nn.Module):
    def __init__(self, vocab=32, width=16, heads=2, context=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.encoder = Block(width, heads)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        t = tokens.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        return self.head(self.encoder(self.embed(tokens) + self.pos[:t], mask))


def warmup(step):
    return min(1.0, (step + 1) / 4)


def batches(seed, n, vocab=32, context=8, batch=4):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        seq = (start + torch.arange(context + 1)) % vocab
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def evaluate(model, data):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in data:
            total += nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train()
    return total / len(data)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=5)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--nan-at", type=int, default=-1, help="a NaN in the bias of encoder."
                   "mlp.température.线性 for this step (the step is skipped)")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    checkpoint_path = os.path.join(args.out, "checkpoint.pt")
    best_path = os.path.join(args.out, "best_model.pt")

    torch.manual_seed(0)
    model = LanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = amps.LossScaler(init_scale=1024.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    step, epoch, optimizer_steps, best = 0, 0, 0, math.inf
    if args.resume:
        state = torch.load(checkpoint_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch = state["step"], state["epoch"]
        optimizer_steps, best = state["optimizer_steps"], state["best"]
        torch.load(best_path)(torch.zeros(1, 8, dtype=torch.long))  # the saved model runs

    mon = amps.attach(model, optimizer, scaler, run_id=args.run_id, server=args.server,
                      compute_dtype=torch.bfloat16, scheduler=scheduler, start_step=step,
                      optimizer_steps=optimizer_steps,
                      options={"spool_dir": os.path.join(args.out, "spool")})
    ema = copy.deepcopy(model)
    ema_forwards = 0
    train_data = batches(1 + epoch, args.steps_per_epoch * args.accumulate * args.epochs)
    val_data = batches(1000, 2)
    poisoned = model.encoder.mlp[TEMPERATURE][LINEAR]
    lrs = {}
    first_epoch = epoch
    for epoch in range(first_epoch, first_epoch + args.epochs):
        for i in range(args.steps_per_epoch):
            saved_bias = None
            if step == args.nan_at:
                saved_bias = poisoned.bias.detach().clone()
                with torch.no_grad():
                    poisoned.bias[0] = float("nan")
            optimizer.zero_grad(set_to_none=True)
            for k in range(args.accumulate):
                x, y = train_data[((epoch - first_epoch) * args.steps_per_epoch + i) *
                                  args.accumulate + k]
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(x)
                loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                scaler.scale(loss / args.accumulate).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            lrs[step] = optimizer.param_groups[0]["lr"]
            if saved_bias is not None:
                with torch.no_grad():
                    poisoned.bias.copy_(saved_bias)
            with torch.no_grad():
                for e, q in zip(ema.parameters(), model.parameters()):
                    e.mul_(0.9).add_(q.detach(), alpha=0.1)
            ema(x)  # the EMA copy in training mode, with gradients: not the monitored model
            ema_forwards += 1
            step += 1
        val = evaluate(model, val_data)
        evaluate(ema, val_data)
        if val < best:
            best = val
            torch.save(model, best_path)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "scheduler": scheduler.state_dict(),
                    "step": step, "epoch": epoch + 1, "optimizer_steps": mon.optimizer_steps,
                    "best": best}, checkpoint_path)
    notices = mon.notices()
    acknowledged = mon.close(30)
    print(json.dumps({"acknowledged": acknowledged, "notices": notices,
                      "warnings": mon.warnings, "steps": step, "ema_forwards": ema_forwards,
                      "optimizer_steps": mon.optimizer_steps, "lrs": lrs}, ensure_ascii=False))


if __name__ == "__main__":
    main()
