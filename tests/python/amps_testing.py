"""What the Python tests share: a real ampscope-server (started, killed, restarted on the same
port and store), the ampscope CLI's JSON, and a small real PyTorch transformer (ampscope-train's
GPT as the PyTorch benchmark peer writes it).

The programs come from the environment tests/python/CMakeLists.txt sets: AMPSCOPE_SERVER_BIN,
AMPSCOPE_CLI_BIN (and AMPSCOPE_AGENT_LIBRARY for the package)."""

import json
import os
import subprocess
import sys

import torch

import ampscope

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench", "peers"))
import torch_gpt  # noqa: E402


class Server(ampscope.LocalServer):
    """ampscope-server on loopback (ampscope.LocalServer) with its store in `tmp`, and what the
    tests ask it through the ampscope CLI."""

    def __init__(self, tmp, *args, metrics=False):
        super().__init__(os.environ["AMPSCOPE_SERVER_BIN"], *args, workdir=tmp, metrics=metrics)

    def metric(self, name, **labels):
        """The value of one sample of /metrics (None when absent); needs metrics=True."""
        import urllib.request
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=30) as r:
            text = r.read().decode()
        want = {k: str(v) for k, v in labels.items()}
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            found = dict(kv.split("=", 1) for kv in head[len(name):].strip("{}").split(",") if kv)
            if all(found.get(k, "").strip('"') == v for k, v in want.items()):
                return float(value)
        return None

    def cli(self, *args):
        """The ampscope CLI's --json answer, as Python objects."""
        r = subprocess.run([os.environ["AMPSCOPE_CLI_BIN"], *args, "--server", self.address,
                            "--json"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"ampscope {' '.join(args)}: {r.stderr}")
        if args[0] == "tail":  # JSON Lines
            return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
        return json.loads(r.stdout)

    def reports(self, run_id, n=100000):
        """The stored step reports of a run with their tensors (ampscope tail --json
        --tensors), in arrival order."""
        return self.cli("tail", run_id, "-n", str(n), "--tensors")


def tiny_gpt(vocab=64, width=32, heads=2, layers=2, context=16):
    """ampscope-train's GPT as PyTorch writes it (bench/peers/torch_gpt.py), small: modules
    wte, wpe, blocks.N.{ln1,qkv,proj,ln2,fc,fc_proj}, lnf; the LM head tied to wte."""
    return torch_gpt.build_model(torch, vocab, context, width, heads, layers)


def batches(seed, vocab=64, context=16, batch=4):
    """An endless stream of (inputs, targets): a learnable sequence (each token the previous
    plus one, mod vocab) from random starts."""
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        seq = (start + torch.arange(context + 1)) % vocab
        yield seq[:, :-1], seq[:, 1:]
