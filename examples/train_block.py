"""A small transformer-style training loop (layer norm, attention softmax, gelu, linear, cross
entropy) that runs unchanged with kernelcraft loaded: the first steps miss and run eager while the
worker evolves kernels in the background; later steps are served evolved, verified kernels.

    python3 examples/train_block.py --mode eager --steps 60 --out eager.json
    python3 examples/train_block.py --mode kernelcraft --lib build/torch_ops/libkernelcraft.so \\
        --steps 60 --out kc.json [--wait 900]

--mode kernelcraft: a few warm-up steps (misses -> jobs), then optionally --wait seconds for the
evolutions (torch.ops.kernelcraft.wait_for_evolution), then the measured steps. The same seed and
data in both modes, so the loss curves can be compared (benchmarks/compare_train.py).
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        # Explicit attention (not SDPA), so the softmax is an operator kernelcraft sees.
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // self.heads), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, vocab, d, heads, ff, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "kernelcraft"], default="eager")
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "build", "torch_ops",
                                                  "libkernelcraft.so"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--wait", type=float, default=0, help="seconds to wait for evolutions after warm-up")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    kc = None
    if a.mode == "kernelcraft":
        torch.ops.load_library(a.lib)
        kc = torch.ops.kernelcraft

    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = Model(a.vocab, a.dim, a.heads, 4 * a.dim, a.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator(device="cpu").manual_seed(1)
    # A fixed synthetic corpus: the same batches in both modes.
    data = torch.randint(0, a.vocab, (16, a.batch, a.seq + 1), generator=g).to(dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step(i):
        batch = data[i % data.shape[0]]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    losses, times = [], []
    waited = None
    for i in range(a.steps):
        if kc is not None and i == a.warmup_steps and a.wait > 0:
            t = time.time()
            waited = {"done": bool(kc.wait_for_evolution(a.wait)), "seconds": time.time() - t}
        sync()
        t0 = time.perf_counter()
        loss = step(i)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())

    res = {"mode": a.mode, "device": str(dev), "torch": torch.__version__, "losses": losses, "step_s": times,
           "shape": {"batch": a.batch, "seq": a.seq, "dim": a.dim, "heads": a.heads, "layers": a.layers,
                     "vocab": a.vocab}}
    if kc is not None:
        res["waited"] = waited
        res["status"] = json.loads(kc.status())
        res["evolution"] = json.loads(kc.evolution_status())
        res["missed_keys"] = list(kc.missed_keys())
    tail = times[len(times) // 2:]
    res["median_step_ms_second_half"] = 1e3 * sorted(tail)[len(tail) // 2]
    print(json.dumps({k: res[k] for k in ("mode", "median_step_ms_second_half")}), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
