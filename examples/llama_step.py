"""A Llama-style decoder training step, unchanged code whatever runs it: nn.RMSNorm,
scaled_dot_product_attention with rotary embeddings, a SwiGLU MLP, tied embeddings and
F.cross_entropy over the vocabulary, under bf16 autocast on CUDA (fp32 on the CPU).

    python3 examples/llama_step.py --mode eager --out eager.json
    python3 examples/llama_step.py --mode kernelcraft --lib build/torch_ops/libkernelcraft.so --out kc.json
    python3 examples/llama_step.py --mode compile --out compile.json

The default shape is the [6/7] benchmark's: 8192 tokens a step (batch 4 x 2048), a 128256-token
vocabulary, width 1024, 4 layers. With kernelcraft loaded the model code is the same: the library
serves what its cache holds (pre-warm it with benchmarks/llama_step_bench.py, which also compares
the three modes). Per step: wall time (synchronised), the loss, and on CUDA the step's peak
memory (the loss's backward is where it peaks at a large vocabulary). --mode compile compiles the model and
the loss together; its first step, the compilation, is reported apart.
"""
import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotary(x, cos, sin):
    a, b = x[..., ::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)


class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(rotary(q, cos, sin), rotary(k, cos, sin), v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab, d, heads, ff, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        nn.init.normal_(self.emb.weight, std=0.02)   # as Llama initialises it: logits of order one
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.heads = heads

    def forward(self, idx):
        t, hd = idx.shape[1], self.emb.weight.shape[1] // self.heads
        f = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=idx.device).float() / hd))
        ang = torch.outer(torch.arange(t, device=idx.device).float(), f)
        cos, sin = ang.cos(), ang.sin()
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return F.linear(self.norm(x), self.emb.weight)   # tied embeddings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "kernelcraft", "compile"], default="eager")
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "build", "torch_ops",
                                                  "libkernelcraft.so"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.mode == "kernelcraft":
        torch.ops.load_library(a.lib)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = Llama(a.vocab, a.dim, a.heads, int(8 * a.dim / 3) // 64 * 64, a.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    g = torch.Generator(device="cpu").manual_seed(1)
    data = torch.randint(0, a.vocab, (8, a.batch, a.seq + 1), generator=g).to(dev)   # the same batches in every mode
    autocast = torch.autocast(dev.type, torch.bfloat16, enabled=cuda)

    def forward_loss(inp, tgt):
        with autocast:
            logits = model(inp)
            return F.cross_entropy(logits.reshape(-1, a.vocab), tgt.reshape(-1)), logits

    run = torch.compile(forward_loss) if a.mode == "compile" else forward_loss
    losses, times, peaks = [], [], []
    for i in range(a.steps):
        batch = data[i % data.shape[0]]
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss, logits = run(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() / 2**20)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del logits
    res = {"mode": a.mode, "device": str(dev), "torch": torch.__version__, "losses": losses, "step_s": times,
           "peak_mb": peaks, "shape": vars(a) | {"lib": None, "out": None}}
    tail = sorted(times[max(1, len(times) // 2):])
    res["median_step_ms"] = 1e3 * tail[len(tail) // 2]
    res["first_step_s"] = times[0]
    if a.mode == "kernelcraft":
        ops = json.loads(torch.ops.kernelcraft.status())["ops"]
        res["hits"] = {k: v["hits"] for k, v in ops.items() if v["hits"]}
    print(json.dumps({k: res[k] for k in ("mode", "median_step_ms", "first_step_s")} |
                     {"peak_mb": max(peaks) if peaks else None, "final_loss": losses[-1]}), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
