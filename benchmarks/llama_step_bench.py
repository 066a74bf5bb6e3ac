"""examples/llama_step.py in its three modes, each in its own process: eager, kernelcraft with a
pre-warmed cache, torch.compile. Step time, peak memory and the loss curve against eager's.

Phases (--phases, default all, in this order):
  record   kernelcraft mode, 2 steps, evolution off, the miss log on: the keys the step misses;
  evolve   `kernelcraft evolve --keys` on them (--evolve-args; --pair-only: only kernelcraft's own
           composite keys, e.g. the fused cross-entropy pair);
  serve    kernelcraft mode, the cache read-only, --steps steps;
  eager, compile   without the library (compile's first step, its compilation, is reported apart).
The report: median step (second half), speedup over eager, peak MB of the second half's steps
(and of all steps) and its reduction, the largest
relative loss difference from eager over the steps (bf16 autocast: expect about 1e-2), hits.

    python3 benchmarks/llama_step_bench.py --out llama-out --lib build/torch_ops/libkernelcraft.so \\
        --cli build/torch_ops/kernelcraft [--steps 100] [-- <llama_step.py shape arguments>]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "llama_step.py")


def run_mode(a, phase, extra):
    mode = {"record": "kernelcraft", "serve": "kernelcraft"}.get(phase, phase)
    env = dict(os.environ, KERNELCRAFT_EVOLVE="0", KERNELCRAFT_CACHE_DIR=a.cache)
    if phase == "record":
        env["KERNELCRAFT_MISS_LOG"] = os.path.join(a.out, "keys.txt")
    if phase == "serve":
        env["KERNELCRAFT_CACHE_READONLY"] = "1"
    steps = "2" if phase == "record" else str(a.steps)
    out = os.path.join(a.out, f"{phase}.json")
    cmd = [sys.executable, EXAMPLE, "--mode", mode, "--lib", a.lib, "--steps", steps, "--out", out] + extra
    print("$ " + shlex.join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd, env=env)


def evolve(a):
    keys = os.path.join(a.out, "keys.txt")
    if a.pair_only:
        with open(keys) as f, open(keys + ".pair", "w") as g:
            g.writelines(k for k in f if "|kernelcraft::" in k)
        keys += ".pair"
    cmd = [a.cli, "--cache-dir", a.cache, "evolve", "--keys", keys] + shlex.split(a.evolve_args)
    print("$ " + shlex.join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd)


def report(a):
    rows = {}
    for m in ("eager", "serve", "compile"):
        p = os.path.join(a.out, f"{m}.json")
        if os.path.exists(p):
            rows[m] = json.load(open(p))
    e = rows.get("eager")
    lines = []
    for m, r in rows.items():
        line = f"{m:8s} {r['median_step_ms']:9.2f} ms"
        if e:
            line += f"  {e['median_step_ms'] / r['median_step_ms']:5.2f}x eager"
            if r["peak_mb"] and e["peak_mb"]:
                # Steady state: the second half's steps, after kernelcraft's first calls of each
                # key (loads, probes and live checks run eager beside the kernel and hold both).
                steady = lambda x: max(x[len(x) // 2:])
                line += (f"  peak {steady(r['peak_mb']):8.0f} MB ({1 - steady(r['peak_mb']) / steady(e['peak_mb']):+.0%}"
                         f" less than eager; all steps {max(r['peak_mb']):.0f} MB)")
            rel = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(r["losses"], e["losses"]))
            line += f"  max rel loss diff {rel:.2e}"
        line += f"  first step {r['first_step_s']:.1f} s"
        if "hits" in r:
            line += f"  hits {json.dumps(r['hits'])}"
        lines.append(line)
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "report.txt"), "w") as f:
        f.write(text + "\n")


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="llama-out")
    p.add_argument("--lib", default=os.path.join(HERE, "..", "build", "torch_ops", "libkernelcraft.so"))
    p.add_argument("--cli", default=os.path.join(HERE, "..", "build", "torch_ops", "kernelcraft"))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--phases", default="record,evolve,serve,eager,compile")
    p.add_argument("--evolve-args", default="--generations 2 --budget-s 60")
    p.add_argument("--pair-only", action="store_true")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    a.cache = os.path.join(a.out, "cache")
    failed = []
    for ph in a.phases.split(","):
        if ph == "record":
            open(os.path.join(a.out, "keys.txt"), "w").close()
        rc = evolve(a) if ph == "evolve" else run_mode(a, ph, extra)
        if rc:
            failed.append(ph)
    report(a)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
