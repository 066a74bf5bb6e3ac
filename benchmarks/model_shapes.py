"""Operator calls at the shapes of well-known models' real layers (GPT-2, Llama-3 8B, ViT-B/16,
ResNet-50, a Stable Diffusion U-Net, 3D video nets, scans and reductions): eager PyTorch,
torch.compile and kernelcraft serving a pre-warmed cache, per call, dtype and mode.

What is measured, for every case of the set --cases names (model_cases.py), dtype (--dtypes) and mode ("fwd": the call;
"fwd+bwd": the call, then backward of a fixed random gradient of its outputs, for cases with a
differentiable input):
  eager        plain PyTorch, in a process that never loads the library;
  compile      torch.compile(fn), default mode, warmed up first, in its own process; a case that
               fails to compile is reported as such and the run carries on;
  kernelcraft  the same eager function in a process with libkernelcraft.so loaded and the cache
               pre-warmed as in README.md "Pre-warming and deployment" (phases below), read-only.
Bytes: a lower bound (every input read once, every output written once; the backward's share is
an estimate, see moved_bytes), achieved GB/s = bytes / median time, and its share of the copy
bandwidth measured on the GPU (eager_ops.copy_bw).

Method (CUDA): eager_ops.bench, the project's one timer: the L2 flushed by a 256 MB write before
each timed call, CUDA events, median of >= 30 calls. The kernelcraft process first makes as many
calls as the serve probe takes (serve_probe_calls), so the timed calls are steady-state serving.

Phases (--phases, default all), each its own subprocess so the library state is clean:
  record   the library loaded, KERNELCRAFT_EVOLVE=0, KERNELCRAFT_MISS_LOG=OUT/keys.txt and
           KERNELCRAFT_CACHE_DIR=CACHE (so what is recorded is what CACHE lacks): each case runs
           once and its missed keys are recorded;
  evolve   CLI --cache-dir CACHE evolve --keys OUT/keys.txt EVOLVE_ARGS (offline search);
  serve    KERNELCRAFT_CACHE_DIR=CACHE KERNELCRAFT_CACHE_READONLY=1 KERNELCRAFT_EVOLVE=0, timed;
  eager, compile   timed without the library (compile: one compilation per row, ~150 in all).
Rows go to OUT/{record,serve,eager,compile}.jsonl, one per (case, dtype, mode, method); the
report (--report, and at the end of every run) joins them into OUT/table.md for docs/PERF.md.

On a GPU machine, with the library built there (scripts/device_run.sh or pip install):
    python3 benchmarks/model_shapes.py --out ms-out \\
        --lib build/torch_ops/libkernelcraft.so --cli build/torch_ops/kernelcraft \\
        --evolve-args "--generations 4 --budget-s 120 --gpu-share 1"
    python3 benchmarks/model_shapes.py --out ms-out --phases serve      # re-time the served cache
    python3 benchmarks/model_shapes.py --out ms-out --report            # the table again
    (--commit SHA names the commit, where a copied tree's .git may be stale; --only TEXT selects cases)
Anywhere, at tiny shapes (same rank, at most SMOKE_NUMEL elements), one CPU thread,
time.perf_counter medians (compile only when --phases names it):
    python3 benchmarks/model_shapes.py --list [--smoke]
    python3 benchmarks/model_shapes.py --device cpu --smoke --dtypes float32 \\
        --phases eager,record,serve --out /tmp/ms-smoke
"""
import argparse
import datetime
import gc
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from eager_ops import COPY_BW, bench, copy_bw  # noqa: E402
from model_cases import CASE_SETS, MODES, OPS, label  # noqa: E402
from model_report import report  # noqa: E402


PHASES = ("record", "evolve", "serve", "eager", "compile")
METHOD_OF = {"eager": "eager", "compile": "compile", "serve": "kernelcraft", "record": "record"}
SMOKE_NUMEL = 1 << 18  # elements of a smoke shape at most (where the kept dims allow it)

def case_shape(case, smoke):
    """The case's shape, or for smoke runs one of the same rank with at most SMOKE_NUMEL elements:
    the largest dims are halved (never below 2), the kept dims only once the others are down."""
    s = list(case.shape)
    if not smoke:
        return tuple(s)
    kept = {k % len(s) for k in case.keep}
    for dims in ([i for i in range(len(s)) if i not in kept], list(range(len(s)))):
        while dims and math.prod(s) > SMOKE_NUMEL:
            i = max(dims, key=lambda d: s[d])
            if s[i] <= 2:
                break
            s[i] = (s[i] + 1) // 2
    return tuple(s)


def plan(a):
    """The (case, dtype, mode) triples this run measures, in table order."""
    for c in CASE_SETS[a.cases]:
        if a.only and not any(o in f"{c.model} {label(c)}" for o in a.only.split("|")):
            continue
        for dtype in a.dtypes.split(","):
            for mode in a.modes.split(","):
                if dtype in c.dtypes and (mode == "fwd" or OPS[c.call].grads):
                    yield c, dtype, mode


def _tensors(out):
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def moved_bytes(inputs, outs, grads, mode, reads=None):
    """Lower bound of the bytes one call moves: every input read once (or what `reads`, the op's
    own count, says it must read), every output written once. fwd+bwd adds an estimate of the
    backward: every output's gradient read, every differentiable input read again (the saved
    activation these backwards read: the input, or for softmax its same-sized output; `reads`
    again where given) and its gradient written once."""
    nb = lambda ts: sum(t.numel() * t.element_size() for t in ts)
    diff = [inputs[i] for i in grads]
    n = (reads(inputs) if reads else nb(inputs)) + nb(outs)
    if mode == "fwd+bwd":
        n += nb(outs) + (reads(inputs) if reads else nb(diff)) + nb(diff)
    return n


def setup(case, dtype, mode, a, compiled):
    """Builds the case's inputs; returns (step, bytes), step making one call of `mode`. fn runs
    once here, for the outputs' sizes (and, compiled, its compilation)."""
    op = OPS[case.call]
    fn, ins = op.build(case_shape(case, a.smoke), getattr(torch, dtype), a.device, **case.args)
    if compiled:
        fn = torch.compile(fn)
    if mode == "fwd":
        return (lambda: fn(*ins)), moved_bytes(ins, _tensors(fn(*ins)), (), mode, op.reads)
    leaves = [ins[i].requires_grad_() for i in op.grads]
    outs = [o for o in _tensors(fn(*ins)) if o.requires_grad]
    grads = [torch.randn_like(o) for o in outs]

    def step():
        for t in leaves:
            t.grad = None   # a fresh gradient per call, never an accumulation into the last one
        torch.autograd.backward([o for o in _tensors(fn(*ins)) if o.requires_grad], grads)
    return step, moved_bytes(ins, outs, op.grads, mode, op.reads)


def cpu_bench(fn, reps=15):
    """The CPU stand-in for bench() in smoke runs: time.perf_counter around each call, median."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"median_ms": statistics.median(times), "p10_ms": times[len(times) // 10],
            "p90_ms": times[9 * len(times) // 10], "reps": reps}


def kc_counters():
    t = json.loads(torch.ops.kernelcraft.status())["total"]
    return {k: t[k] for k in ("calls", "hits", "misses", "fallbacks")}


def measure(phase, case, dtype, mode, a, env):
    """One row: the case run once (record) or timed (the others)."""
    # table_shape tells cases apart where smoke shapes coincide (ResNet's first two batch norms).
    row = dict(env, model=case.model, call=label(case), op=case.call, shape=list(case_shape(case, a.smoke)),
               table_shape=list(case.shape), dtype=dtype, mode=mode, method=METHOD_OF[phase])
    if phase == "compile":
        torch._dynamo.reset()   # each case compiles afresh: no recompile limit, no dynamic shapes
    stage = "first call"   # for compile: the compilation
    try:
        missed = json.loads(torch.ops.kernelcraft.status())["missed_keys"] if phase == "record" else 0
        step, row["bytes"] = setup(case, dtype, mode, a, phase == "compile")
        step()
        if a.device == "cuda":
            torch.cuda.synchronize()
        stage = "timing"
        if phase == "record":
            row["new_missed_keys"] = json.loads(torch.ops.kernelcraft.status())["missed_keys"] - missed
            return row
        for _ in range(a.warm):
            step()
        if phase == "serve":
            torch.ops.kernelcraft.reset_counters()
        row.update(bench(step) if a.device == "cuda" else cpu_bench(step))
        if phase == "serve":
            row["kc"] = kc_counters()
        seconds = row["median_ms"] / 1e3
        row["gbps"] = row["bytes"] / seconds / 1e9
        row["copy_bw"] = copy_bw() if a.device == "cuda" else COPY_BW
        row["pct_copy"] = 100 * row["bytes"] / seconds / row["copy_bw"]
    except Exception as ex:  # one failing case (compile error, out of memory) never ends the run
        row["error"] = f"{stage}: {type(ex).__name__}: {str(ex).strip()[:300]}"
    return row


def git_commit(given):
    """The commit the rows name: --commit where given (a copied tree's .git can be stale), else
    HEAD, marked where the working tree differs from it."""
    if given:
        return given
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD"]).returncode != 0
    return head + (" + working tree" if dirty else "")


def progress(row):
    if "error" in row:
        return row["error"]
    if "median_ms" in row:
        return f"{row['median_ms']:.4g} ms" + (f", {row['kc']['hits']} hits" if "kc" in row else "")
    return f"{row['new_missed_keys']} new missed keys"


def run_worker(phase, a):
    """The body of one phase's subprocess: every planned case, one JSONL row each."""
    if a.smoke and a.device == "cpu":
        # Tiny shapes gain nothing from threads, and on a busy machine a descheduled OpenMP thread
        # stalls every parallel region (steps of 8 ms on a loaded 2-core machine).
        torch.set_num_threads(1)
    if phase in ("record", "serve"):
        torch.ops.load_library(a.lib)
    # The serve probe times a newly served key against eager on its first calls: warm past it.
    probe = json.loads(torch.ops.kernelcraft.config())["serve_probe_calls"] if phase == "serve" else 0
    a.warm = probe + 2 if probe else 0
    env = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "device": a.device,
           "device_name": torch.cuda.get_device_name() if a.device == "cuda" else f"CPU ({os.cpu_count()} cores)",
           "commit": git_commit(a.commit), "smoke": a.smoke}
    with open(os.path.join(a.out, f"{phase}.jsonl"), "w") as f:
        for case, dtype, mode in plan(a):
            row = measure(phase, case, dtype, mode, a, env)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"{phase:8} {case.model:12} {row['call']:45} {dtype:9} {mode:8} {progress(row)}",
                  file=sys.stderr, flush=True)
            gc.collect()
            if a.device == "cuda":
                torch.cuda.empty_cache()


def worker_cmd(phase, a):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", phase, "--device", a.device,
           "--dtypes", a.dtypes, "--modes", a.modes, "--out", a.out, "--lib", a.lib, "--commit", a.commit, "--cases", a.cases]
    return cmd + (["--only", a.only] if a.only else []) + (["--smoke"] if a.smoke else [])


def phase_env(phase, a):
    over = {"record": {"KERNELCRAFT_EVOLVE": "0", "KERNELCRAFT_MISS_LOG": os.path.join(a.out, "keys.txt"),
                       "KERNELCRAFT_CACHE_DIR": a.cache},
            "serve": {"KERNELCRAFT_CACHE_DIR": a.cache, "KERNELCRAFT_CACHE_READONLY": "1",
                      "KERNELCRAFT_EVOLVE": "0"}}
    return {**os.environ, **over.get(phase, {})}


def run_evolve(a):
    keys = os.path.join(a.out, "keys.txt")
    if not os.path.exists(keys) or not open(keys).read().strip():
        print(f"evolve: no keys in {keys} (run the record phase first)", file=sys.stderr)
        return 1
    cmd = [a.cli, "--cache-dir", a.cache, "evolve", "--keys", keys] + shlex.split(a.evolve_args)
    print("$ " + shlex.join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd)


def run_phases(a):
    names = PHASES if a.phases == "all" else a.phases.split(",")
    if unknown := set(names) - set(PHASES):
        sys.exit(f"unknown phases: {', '.join(sorted(unknown))} (known: {', '.join(PHASES)})")
    if a.phases == "all" and a.smoke:
        names = [p for p in names if p != "compile"]   # torch.compile of every case is slow on a small CPU
    if "record" in names:
        open(os.path.join(a.out, "keys.txt"), "w").close()   # the miss log appends: start it empty
    failed = []
    for phase in [p for p in PHASES if p in names]:
        print(f"== {phase}", file=sys.stderr, flush=True)
        if phase != "evolve":
            open(os.path.join(a.out, f"{phase}.jsonl"), "w").close()   # no stale rows if it fails early
        rc = run_evolve(a) if phase == "evolve" else subprocess.call(worker_cmd(phase, a), env=phase_env(phase, a))
        if rc:
            failed.append(f"{phase} (exit status {rc})")
    report(a)
    if failed:
        print("failed phases: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


def list_cases(a):
    print(f"{'model':12} {'call':48} {'shape' + (' (smoke)' if a.smoke else ''):22} {'dtypes':17} modes")
    for c in CASE_SETS[a.cases]:
        modes = "fwd, fwd+bwd" if OPS[c.call].grads else "fwd"
        shape = "x".join(map(str, case_shape(c, a.smoke)))
        print(f"{c.model:12} {label(c):48} {shape:22} {','.join(c.dtypes):17} {modes}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the cases (with --smoke: at smoke shapes)")
    ap.add_argument("--report", action="store_true", help="only write OUT/table.md from the rows in OUT")
    ap.add_argument("--merge", nargs="+", default=[], metavar="DIR",
                    help="with --report: the rows of these runs (slices of the table) instead of OUT's")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU timing where --device cpu")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--phases", default="all", help=f"all, or a comma-separated subset of {','.join(PHASES)}")
    ap.add_argument("--cases", default="models", choices=sorted(CASE_SETS),
                    help="models: the table (model layers, single-op rows); large: 1-8 GiB single-op calls")
    ap.add_argument("--only", default="", help="only cases whose 'model call' contains this text (or one of A|B|...)")
    ap.add_argument("--out", default="model-shapes-out")
    ap.add_argument("--cache", help="the cache evolved and served (default OUT/cache)")
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "torch_ops", "libkernelcraft.so"))
    ap.add_argument("--cli", default=os.path.join(REPO, "build", "torch_ops", "kernelcraft"))
    ap.add_argument("--evolve-args", default="", help="passed to `kernelcraft evolve`, e.g. '--generations 4'")
    ap.add_argument("--commit", default="", help="the commit the rows name (default: git rev-parse HEAD)")
    ap.add_argument("--worker", choices=[p for p in PHASES if p != "evolve"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.out = os.path.abspath(a.out)
    a.cache = os.path.abspath(a.cache or os.path.join(a.out, "cache"))
    if bad := set(a.modes.split(",")) - set(MODES):
        ap.error(f"unknown modes: {', '.join(sorted(bad))}")
    if bad := [d for d in a.dtypes.split(",") if not isinstance(getattr(torch, d, None), torch.dtype)]:
        ap.error(f"unknown dtypes: {', '.join(bad)}")
    return a


def main():
    a = parse_args()
    if a.list:
        return list_cases(a)
    if a.worker:
        return run_worker(a.worker, a)
    if a.report:
        return report(a)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: use --device cpu --smoke")
    os.makedirs(a.out, exist_ok=True)
    return run_phases(a)


if __name__ == "__main__":
    sys.exit(main())
