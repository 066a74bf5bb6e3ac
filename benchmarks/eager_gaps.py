"""Where eager falls short: for operators of the memory-bound families kernelcraft targets, at sizes
where eager takes well over 50 us, the ATen operators a call reaches on this device (what the
dispatcher would have to intercept), eager's and torch.compile's median times, and the bytes floor
(inputs read once, outputs written once, at the measured copy bandwidth).

    python3 benchmarks/eager_gaps.py [--dtype float32|bfloat16] [--no-compile] > gaps.jsonl
Timing: the method of eager_ops.py (L2 flushed, CUDA events, medians).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(__file__))
from eager_ops import bench, copy_bw  # noqa: E402


class Reached(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def cases(dt):
    d = "cuda"
    r = lambda *s: torch.randn(*s, device=d, dtype=dt)
    x4 = r(16, 64, 256, 256)
    w64, b64 = r(64), r(64)
    rm, rv = torch.zeros(64, device=d), torch.ones(64, device=d)
    yield "batch_norm train (16,64,256,256)", lambda: F.batch_norm(x4, rm.clone(), rv.clone(), w64, b64, True), [x4], 1
    yield "batch_norm eval (16,64,256,256)", lambda: F.batch_norm(x4, rm, rv, w64, b64, False), [x4], 1
    yield "instance_norm (16,64,256,256)", lambda: F.instance_norm(x4), [x4], 1
    yield "group_norm 8 (16,64,256,256)", lambda: F.group_norm(x4, 8, w64, b64), [x4], 1
    x5 = r(16, 32, 64, 64, 64)
    yield "max_pool3d k3 s2 p1 d3 (16,32,64^3)", lambda: F.max_pool3d(x5, 3, 2, 1, 3), [x5], 0
    yield "avg_pool3d k3 s2 p1 (16,32,64^3)", lambda: F.avg_pool3d(x5, 3, 2, 1), [x5], 0
    yield "adaptive_avg_pool3d 1 (16,32,64^3)", lambda: F.adaptive_avg_pool3d(x5, 1), [x5], 0
    x2 = r(16, 64, 256, 256)
    yield "max_pool2d k2 s2 (16,64,256,256)", lambda: F.max_pool2d(x2, 2, 2), [x2], 0
    yield "avg_pool2d k3 s1 p1 (16,64,256,256)", lambda: F.avg_pool2d(x2, 3, 1, 1), [x2], 0
    x1 = r(64, 128, 65536)
    yield "max_pool1d k4 s4 (64,128,65536)", lambda: F.max_pool1d(x1, 4, 4), [x1], 0
    xr = r(128, 4096, 4095)
    for name, fn in [("sum", lambda t, k: t.sum(k)), ("mean", lambda t, k: t.mean(k)),
                     ("amax", lambda t, k: t.amax(k)), ("argmax", lambda t, k: t.argmax(k)),
                     ("argmin", lambda t, k: t.argmin(k)), ("prod", lambda t, k: t.prod(k)),
                     ("var", lambda t, k: t.var(k)), ("std_mean", lambda t, k: torch.std_mean(t, k)),
                     ("logsumexp", lambda t, k: t.logsumexp(k)), ("norm2", lambda t, k: torch.linalg.vector_norm(t, 2, k))]:
        for k in (1, 2):
            yield f"{name} dim{k} (128,4096,4095)", (lambda fn=fn, k=k: fn(xr, k)), [xr], 0
    yield "sum dims(0,1) (128,4096,4095)", lambda: xr.sum((0, 1)), [xr], 0
    xs = r(128, 4096 * 64)
    yield "cumsum dim1 (128,262144)", lambda: torch.cumsum(xs, 1), [xs], 1
    yield "cumprod dim1 (128,262144)", lambda: torch.cumprod(xs, 1), [xs], 1
    yield "logcumsumexp dim1 (128,262144)", lambda: torch.logcumsumexp(xs, 1), [xs], 1
    xs0 = r(32768, 1024)
    yield "cumsum dim0 (32768,1024)", lambda: torch.cumsum(xs0, 0), [xs0], 1
    a, b = r(32768, 2048), r(32768, 2048)
    yield "mse_loss (32768,2048)", lambda: F.mse_loss(a, b), [a, b], 0
    yield "smooth_l1_loss (32768,2048)", lambda: F.smooth_l1_loss(a, b), [a, b], 0
    yield "huber_loss (32768,2048)", lambda: F.huber_loss(a, b), [a, b], 0
    p = torch.rand(32768, 2048, device=d, dtype=dt)
    yield "binary_cross_entropy (32768,2048)", lambda: F.binary_cross_entropy(p, p), [p, p], 0
    yield "bce_with_logits (32768,2048)", lambda: F.binary_cross_entropy_with_logits(a, p), [a, p], 0
    lp = torch.log_softmax(r(32768, 2048).float(), -1).to(dt)
    yield "kl_div batchmean (32768,2048)", lambda: F.kl_div(lp, p, reduction="batchmean"), [lp, p], 0
    logits = r(32768, 50257 // 4)
    tgt = torch.randint(0, logits.shape[1], (32768,), device=d)
    yield "nll_loss (32768,12564)", lambda: F.nll_loss(logits, tgt), [tgt], 0
    yield "cross_entropy (32768,12564)", lambda: F.cross_entropy(logits, tgt), [logits], 0
    e = r(16, 1024, 4096)
    for name, fn in [("leaky_relu", F.leaky_relu), ("elu", F.elu), ("selu", F.selu), ("hardtanh", F.hardtanh),
                     ("hardsigmoid", F.hardsigmoid), ("hardswish", F.hardswish), ("softplus", F.softplus),
                     ("mish", F.mish), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))]:
        yield f"{name} (16,1024,4096)", (lambda fn=fn: fn(e)), [e], 1
    emb_g = r(32768, 1024)
    idx = torch.randint(0, 50257, (32768,), device=d)
    yield "embedding_dense_backward (32768x1024 -> 50257)", lambda: torch.ops.aten.embedding_dense_backward(
        emb_g, idx, 50257, -1, False), [emb_g], 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    torch._dynamo.config.cache_size_limit = 512
    for name, fn, ins, out_like in cases(dt):
        if a.only and a.only not in name:
            continue
        row = {"case": name, "dtype": a.dtype}
        try:
            m = Reached()
            with m:
                out = fn()
            row["aten"] = sorted(set(m.ops))
            outs = out if isinstance(out, (tuple, list)) else [out]
            nbytes = sum(t.numel() * t.element_size() for t in ins) + sum(
                t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))
            row["bytes"] = nbytes
            row["floor_ms"] = nbytes / copy_bw() * 1e3
            row["eager_ms"] = bench(fn, reps=15)["median_ms"]
            if not a.no_compile:
                cfn = torch.compile(fn)
                cfn()
                row["compile_ms"] = bench(cfn, reps=15)["median_ms"]
            row["eager_pct_floor"] = round(100 * row["floor_ms"] / row["eager_ms"], 1)
        except Exception as ex:  # a case this torch cannot run is reported, not fatal
            row["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
