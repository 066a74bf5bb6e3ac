"""The composites kernelcraft catches above autograd, forward + backward: eager, kernelcraft (its
fused pair, cache pre-warmed) and torch.compile, step time and peak memory. --op picks the call:

cross_entropy (default): a language model's loss over [--n, --c] logits: logits [N, C] that want a gradient (as a linear layer's output
does), int64 targets with one in sixteen ignore_index (-100, padding), reduction mean. --autocast
runs it under torch.autocast("cuda", bfloat16) on bf16 logits (eager then computes log_softmax in
fp32 on an fp32 copy); without it the logits' dtype is --dtype.
rms_norm: F.rms_norm over the last dimension of [--n, --c] inputs with a weight, both wanting a
gradient, eps 1e-5, backward from a fixed cotangent. --autocast gives it bf16 inputs under
autocast, which runs rms_norm in fp32 (its policy), so the pair sees fp32 copies.

Phases, each its own process so the library's state is clean:
  record   the library loaded, evolution off, the miss log on: the pair's two keys are recorded;
  evolve   `kernelcraft evolve --keys` on them (EVOLVE_ARGS);
  serve    the library loaded, the cache read-only: timed;
  eager, compile   without the library (compile: torch.compile of loss + backward, warmed up; its
           compile time is reported apart).
Per method: median ms of loss + backward (L2 flushed before each call, CUDA events:
eager_ops.bench), peak memory allocated above what the logits and targets hold, and the loss and
gradient against eager's. The floor at the GPU's copy bandwidth (eager_ops.copy_bw): cross-entropy reads the logits twice and writes
their gradient once; RMSNorm reads x and writes y, then reads x and dy and writes dx.

    python3 benchmarks/composite_bench.py [--op rms_norm] --lib build/torch_ops/libkernelcraft.so \\
        --cli build/torch_ops/kernelcraft --out ce-out [--n 8192 --c 128256 --autocast]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def make_inputs(a, torch):
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16 if a.autocast else getattr(torch, a.dtype)
    if a.op == "rms_norm":
        x = torch.randn(a.n, a.c, device="cuda", generator=g).to(dt).requires_grad_(True)
        w = (1 + 0.1 * torch.randn(a.c, device="cuda", generator=g)).to(dt).requires_grad_(True)
        cot = torch.randn(a.n, a.c, device="cuda", generator=g)   # cast to y's dtype at the call
        return (x, w), cot
    x = (torch.randn(a.n, a.c, device="cuda", generator=g) * 2).to(dt).requires_grad_(True)
    t = torch.randint(0, a.c, (a.n,), device="cuda", generator=g)
    t[::16] = -100
    return x, t


def step_fn(a, torch, F, x, t, compiled=False):
    if a.op == "rms_norm":
        return rms_step_fn(a, torch, F, x, t, compiled)

    def loss_fn(x, t):
        if a.autocast:
            with torch.autocast("cuda", torch.bfloat16):
                return F.cross_entropy(x, t, label_smoothing=a.label_smoothing)
        return F.cross_entropy(x, t, label_smoothing=a.label_smoothing)

    f = torch.compile(loss_fn) if compiled else loss_fn

    def step():
        x.grad = None
        loss = f(x, t)
        loss.backward()
        return loss
    return step


def rms_step_fn(a, torch, F, xw, cot, compiled):
    x, w = xw

    def fwd(x, w):
        if a.autocast:
            with torch.autocast("cuda", torch.bfloat16):
                return F.rms_norm(x, (a.c,), w, 1e-5)
        return F.rms_norm(x, (a.c,), w, 1e-5)

    f = torch.compile(fwd) if compiled else fwd

    def step():
        x.grad = w.grad = None
        y = f(x, w)
        y.backward(cot.to(y.dtype))
        return y.float().pow(2).mean()   # the bench's "loss": a check that outputs agree
    return step


def measure(a, method):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, HERE)
    from eager_ops import bench, copy_bw
    if method == "serve" or method == "record":
        torch.ops.load_library(a.lib)
    x, t = make_inputs(a, torch)
    step = step_fn(a, torch, F, x, t, compiled=method == "compile")
    if a.op == "rms_norm":
        x = x[0]
    t0 = time.time()
    loss = step()
    torch.cuda.synchronize()
    first_s = time.time() - t0
    if method == "record":
        return {"method": method}
    # Past the serve probes: the forward's first 9 calls run eager beside the kernel (so their
    # backward is eager's too), then the backward key's 9; peak memory is taken after.
    for _ in range(25):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    r = bench(step)
    out = {"method": method, "median_ms": r["median_ms"], "p10_ms": r["p10_ms"], "p90_ms": r["p90_ms"],
           "peak_mb": peak / 2**20, "first_call_s": first_s, "loss": loss.item(), "copy_bw": copy_bw(),
           "grad": x.grad.float().flatten()[:: max(1, x.numel() // 65536)].tolist()}
    if method == "serve":
        ops = json.loads(torch.ops.kernelcraft.status())["ops"]
        out["hits"] = {k: ops[k]["hits"] for k in (a.op, a.op + "_backward")}
    return out


def run(a, method):
    env = dict(os.environ, KERNELCRAFT_EVOLVE="0")
    if method == "record":
        env.update(KERNELCRAFT_MISS_LOG=os.path.join(a.out, "keys.txt"), KERNELCRAFT_CACHE_DIR=a.cache)
    if method == "serve":
        env.update(KERNELCRAFT_CACHE_DIR=a.cache, KERNELCRAFT_CACHE_READONLY="1")
    cmd = [sys.executable, __file__, "--child", method] + a.argv
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stderr.write(r.stderr[-3000:])
    if r.returncode:
        return {"method": method, "error": f"exit status {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", default=os.path.join(HERE, "..", "build", "torch_ops", "libkernelcraft.so"))
    p.add_argument("--cli", default=os.path.join(HERE, "..", "build", "torch_ops", "kernelcraft"))
    p.add_argument("--op", default="cross_entropy", choices=["cross_entropy", "rms_norm"])
    p.add_argument("--out", default="ce-out")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--c", type=int, default=128256)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--autocast", action="store_true")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--phases", default="record,evolve,serve,eager,compile")
    p.add_argument("--evolve-args", default="--generations 2 --budget-s 60")
    p.add_argument("--child")
    a, _ = p.parse_known_args()
    a.argv = [x for x in sys.argv[1:] if x not in ("--child",)]
    if a.child:
        a.argv = []
        print(json.dumps(measure(a, a.child)))
        return 0
    a.argv = [f"--lib={a.lib}", f"--op={a.op}", f"--n={a.n}", f"--c={a.c}", f"--dtype={a.dtype}",
              f"--label-smoothing={a.label_smoothing}"] + (["--autocast"] if a.autocast else [])
    os.makedirs(a.out, exist_ok=True)
    a.cache = os.path.join(a.out, "cache")
    rows = {}
    for ph in a.phases.split(","):
        t0 = time.time()
        if ph == "evolve":
            # The pair's keys only: the record phase also misses the composite's parts
            # (_log_softmax, nll_loss, ...), which serving the pair makes unnecessary.
            pair = os.path.join(a.out, "pair_keys.txt")
            with open(os.path.join(a.out, "keys.txt")) as f, open(pair, "w") as g:
                g.writelines(k for k in f if "|kernelcraft::" in k)
            cmd = [a.cli, "--cache-dir", a.cache, "evolve", "--keys", pair]
            rc = subprocess.call(cmd + shlex.split(a.evolve_args))
            rows[ph] = {"method": ph, "rc": rc}
        else:
            if ph == "record":
                open(os.path.join(a.out, "keys.txt"), "w").close()
            rows[ph] = run(a, ph)
        rows[ph]["wall_s"] = time.time() - t0
        print(json.dumps({k: v for k, v in rows[ph].items() if k != "grad"}), flush=True)
    report(a, rows)
    return 0


def report(a, rows):
    el = 2 if a.autocast or a.dtype != "float32" else 4
    sys.path.insert(0, HERE)
    from eager_ops import COPY_BW
    bw = next((r["copy_bw"] for r in rows.values() if "copy_bw" in r), COPY_BW)   # measured on the GPU
    if a.op == "rms_norm":   # under autocast the pair reads fp32 copies: x twice, dy, writes y, dx
        el = 4 if a.autocast else el
        floor_ms = 5 * a.n * a.c * el / bw * 1e3
        what = f"rms_norm [{a.n}, {a.c}] with weight, eps 1e-5"
    else:
        floor_ms = 3 * a.n * a.c * el / bw * 1e3
        what = f"cross_entropy [{a.n}, {a.c}] mean, label_smoothing {a.label_smoothing}"
    eager = rows.get("eager", {})
    lines = [f"{what} {'bf16 autocast' if a.autocast else a.dtype}; forward + backward; floor {floor_ms:.3f} ms"]
    for m in ("eager", "serve", "compile"):
        r = rows.get(m)
        if not r or "median_ms" not in r:
            continue
        sp = eager["median_ms"] / r["median_ms"] if "median_ms" in eager else float("nan")
        diff = max(abs(u - v) for u, v in zip(r["grad"], eager.get("grad", r["grad"]))) if r.get("grad") else 0
        lines.append(f"  {m:8s} {r['median_ms']:8.3f} ms  {sp:5.2f}x eager  peak {r['peak_mb']:8.0f} MB  "
                     f"loss {r['loss']:.6f}  |dgrad| vs eager {diff:.3g}  first call {r['first_call_s']:.1f} s"
                     + (f"  hits {r['hits']}" if "hits" in r else ""))
    text = "\n".join(lines)
    print(text)
    open(os.path.join(a.out, "report.txt"), "w").write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
