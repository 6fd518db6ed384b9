"""PyTorch peer of the trainer benchmark (bench/trainer_bench.py): ampscope-train's model and step.

The same GPT as trainer/src/model.cc, written the way a PyTorch user would write it on the CPU:
token and position embeddings, `--layers` pre-LN blocks (LayerNorm -> causal multi-head
self-attention with a packed qkv projection -> residual, LayerNorm -> GELU (tanh) MLP of width
4C -> residual), final LayerNorm, LM head tied to the token embedding, mean cross-entropy. One
training step is what ampscope's Trainer::step does with --accum 1: fetch a batch, zero the
gradients, forward, backward, global-norm clipping at 1.0, AdamW (betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on 2-D weights; the multi-tensor `foreach` implementation, which is the faster
one here) at a warmup + cosine learning rate.

Threads: torch.set_num_threads(--threads), and OPENBLAS_NUM_THREADS=--threads for the OpenBLAS
that Debian's torch calls for FP32 matmuls.

Precision: `fp32`, or `bf16` = torch.autocast('cpu', dtype=torch.bfloat16) around the forward
pass (the linear layers and attention products run in bf16, LayerNorm and softmax as autocast
decides) with the loss computed from FP32 logits, FP32 master weights, no loss scaling -- the
counterpart of ampscope's amp-bf16 mode.

Tokens are uniform random ids (the step's cost does not depend on the text); a pool of batches
is drawn before timing. Timing: `--warmup` untimed steps, then `--windows` windows of
`--window-steps` steps; each window's tokens/s = its tokens / the sum of its step times. Writes
a JSON object with the per-window figures to `--out` (a failure is reported there instead).
"""

import argparse
import json
import math
import os
import sys
import time


def build_model(torch, vocab, context, width, heads, layers):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.fc_proj = nn.Linear(4 * width, width)
            self.register_buffer(
                "mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

        def attention(self, x):
            B, T, C = x.shape
            hs = C // heads
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, T, heads, hs).transpose(1, 2)  # (B, NH, T, hs)
            k = k.view(B, T, heads, hs).transpose(1, 2)
            v = v.view(B, T, heads, hs).transpose(1, 2)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
            scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
            y = F.softmax(scores, dim=-1) @ v  # (B, NH, T, hs)
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(width)
            self.register_buffer("pos", torch.arange(context))
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(self.pos[: idx.shape[1]])
            for block in self.blocks:
                x = block(x)
            return F.linear(self.lnf(x), self.wte.weight)  # tied LM head

    return Gpt()


def lr_at(update, lr, min_lr, warmup, total):
    if update < warmup:
        return lr * (update + 1) / warmup
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def run(torch, args):
    F = torch.nn.functional
    torch.manual_seed(args.seed)
    model = build_model(torch, args.vocab, args.context, args.width, args.heads, args.layers)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    total = args.warmup + args.windows * args.window_steps
    pool = torch.randint(args.vocab, (8, args.batch, args.context + 1),
                         generator=torch.Generator().manual_seed(args.seed))
    bf16 = args.precision == "bf16"

    def step(i):
        start = time.perf_counter()
        batch = pool[i % pool.shape[0]]
        inputs, targets = batch[:, :-1], batch[:, 1:]
        for group in opt.param_groups:
            group["lr"] = lr_at(i, args.lr, args.lr / 10, 20, total)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()
        return time.perf_counter() - start, value

    losses = [step(i)[1] for i in range(args.warmup)]
    windows = []
    for w in range(args.windows):
        seconds = 0.0
        for s in range(args.window_steps):
            dt, value = step(args.warmup + w * args.window_steps + s)
            seconds += dt
            losses.append(value)
        windows.append(args.window_steps * args.batch * args.context / seconds)
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"non-finite loss in {args.precision}: {losses}")
    return {"tokens_per_s_windows": windows, "first_loss": losses[0], "last_loss": losses[-1],
            "parameters": sum(p.numel() for p in model.parameters()),
            "torch_version": torch.__version__, "threads": torch.get_num_threads(),
            "openblas_threads": int(os.environ["OPENBLAS_NUM_THREADS"])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=("fp32", "bf16"), required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=5)
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()

    # Debian's torch does its FP32 matmuls through OpenBLAS, whose own threads
    # torch.set_num_threads does not limit (it starts one per core): give it the same count.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    try:
        import torch
        torch.set_num_threads(args.threads)
        result = run(torch, args)
    except Exception as e:  # reported in the results, not a crash of the benchmark
        result = {"error": f"{type(e).__name__}: {e}"}
        print(f"torch_gpt.py: {result['error']}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
