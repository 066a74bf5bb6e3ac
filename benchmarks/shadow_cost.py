"""What the live check (dispatcher/shadow.h) costs a training loop with served kernels: the live
check at its defaults (shadow_calls=4, shadow_every=1000) against the live check off, runs
alternating so that load drifts hit both alike. Two loops: --example train_block (the training
example, examples/train_block.py) or --example layernorm (the quickstart's model: a layer norm
trained with SGD, 262144 rows of 8 on the CPU, one row of 4M on a GPU, where evolution is known to
find a kernel that beats eager).

    python3 benchmarks/shadow_cost.py --lib build/torch_ops/libkernelcraft.so [--example E]
        [--cache DIR] [--prepare-wait 900] [--rounds 5] [--steps 60] [-- train_block.py shape arguments]

Without --cache it first fills a fresh cache: one train_block run that misses, lets the worker
search (a short search: one generation of four) and waits up to --prepare-wait seconds for it.
Measured runs have evolution off, so they serve what the cache holds and nothing else changes.
Reported: total and steady-state (second half) step time, both medians over the rounds, the
overhead of the defaults in percent, the checks' own time as a share of each run (status()'s
shadow.check_ms: the extra eager calls and the comparisons, which whole-run wall-time ratios cannot
resolve on a busy machine), and how many calls were served and checked. A third mode checks every
served call; a tenth of a percent of its cost is what the defaults' 1 in 1000 costs in steady state. A cache in
which nothing is served measures nothing, and the script says so.

On the H200:  python3 benchmarks/shadow_cost.py --lib build/torch_ops/libkernelcraft.so
On a small CPU (2 cores): add  -- --batch 4 --seq 64 --dim 128 --heads 4 --layers 1 --vocab 512
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent.parent
TRAIN = HERE / "examples" / "train_block.py"

# The quickstart's model and step (examples/quickstart.py), with train_block's command line and output.
LAYERNORM = r"""
import argparse, json, time, torch, torch.nn.functional as F
ap = argparse.ArgumentParser()
for o in ("--mode", "--lib", "--out"): ap.add_argument(o, default="")
ap.add_argument("--steps", type=int, default=60); ap.add_argument("--warmup-steps", type=int, default=3)
ap.add_argument("--wait", type=float, default=0)
a, _ = ap.parse_known_args()
torch.ops.load_library(a.lib)
kc = torch.ops.kernelcraft
dev = "cuda" if torch.cuda.is_available() else "cpu"
shape = (1, 1 << 22) if dev == "cuda" else (1 << 18, 8)
torch.manual_seed(0)
norm = torch.nn.LayerNorm(shape[1]).to(dev)
opt = torch.optim.SGD(norm.parameters(), lr=1e-3)
x = torch.randn(*shape, device=dev) * 2 + 0.5
target = torch.randn(*shape, device=dev)
def sync():
    if dev == "cuda": torch.cuda.synchronize()
times = []
for i in range(a.steps):
    if i == a.warmup_steps and a.wait > 0:
        kc.wait_for_evolution(a.wait)
        time.sleep(1.0)   # the next catch-up finds the new records
    sync(); t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    F.mse_loss(norm(x), target).backward()
    opt.step()
    sync(); times.append(time.perf_counter() - t)
tail = times[len(times) // 2:]
json.dump({"step_s": times, "median_step_ms_second_half": 1e3 * sorted(tail)[len(tail) // 2],
           "status": json.loads(kc.status())}, open(a.out, "w"))
"""


def run(lib, cache, steps, extra, env_over, out, example="train_block"):
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache), KERNELCRAFT_LOG_LEVEL="warn", **env_over)
    prog = [str(TRAIN)] if example == "train_block" else ["-c", LAYERNORM]
    cmd = [sys.executable, *prog, "--mode", "kernelcraft", "--lib", lib, "--steps", str(steps),
           "--out", str(out), *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"train_block failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(pathlib.Path(out).read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--example", choices=["train_block", "layernorm"], default="train_block")
    ap.add_argument("--cache", default="")
    ap.add_argument("--prepare-wait", type=float, default=900)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="")
    ap.add_argument("train_args", nargs="*", help="after --: passed to train_block.py (shape)")
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="kc-shadow-cost-"))
    cache = pathlib.Path(a.cache) if a.cache else work / "cache"
    if not a.cache:
        print(f"preparing {cache}: a short search for {a.example}'s keys (up to {a.prepare_wait:.0f} s)", flush=True)
        run(a.lib, cache, 5, a.train_args + ["--warmup-steps", "2", "--wait", str(a.prepare_wait)],
            {"KERNELCRAFT_EVOLVE_GENERATIONS": "1", "KERNELCRAFT_EVOLVE_LAMBDA": "4",
             "KERNELCRAFT_EVOLVE_GPU_SHARE": "1", "KERNELCRAFT_EVOLVE_NICE": "0"}, work / "prepare.json", a.example)

    # "every": every served call checked. A run is too short for the defaults' 1-in-1000 to sample
    # at all, so their steady cost is extrapolated from this one: (every - off) / 1000.
    modes = {"off": {"KERNELCRAFT_SHADOW_CALLS": "0", "KERNELCRAFT_SHADOW_EVERY": "0"},
             "defaults": {"KERNELCRAFT_SHADOW_CALLS": "", "KERNELCRAFT_SHADOW_EVERY": ""},
             "every": {"KERNELCRAFT_SHADOW_CALLS": "0", "KERNELCRAFT_SHADOW_EVERY": "1"}}
    base = {"KERNELCRAFT_EVOLVE": "0"}
    res = {m: {"total_s": [], "steady_ms": [], "check_share": [], "hits": 0, "shadow_checks": 0, "mismatches": 0}
           for m in modes}
    for r in range(a.rounds):
        order = list(modes)[r % len(modes):] + list(modes)[:r % len(modes)]
        for m in order:
            j = run(a.lib, cache, a.steps, a.train_args, {**base, **modes[m]}, work / f"{m}-{r}.json", a.example)
            tot = j["status"]["total"]
            res[m]["total_s"].append(sum(j["step_s"]))
            # The checks' own time (status: extra eager calls + comparisons) as a share of the run:
            # immune to load that slows whole runs, which wall-time ratios on a busy machine are not.
            res[m]["check_share"].append(j["status"]["shadow"]["check_ms"] / 1e3 / sum(j["step_s"]))
            res[m]["steady_ms"].append(j["median_step_ms_second_half"])
            res[m]["hits"] += tot["hits"]
            res[m]["shadow_checks"] += tot.get("shadow_checks", 0)
            res[m]["mismatches"] += tot.get("shadow_mismatches", 0)
            print(f"round {r} {m:9s}: {sum(j['step_s']):.3f} s total, {j['median_step_ms_second_half']:.2f} ms/step "
                  f"(second half), hits {tot['hits']}, checks {tot.get('shadow_checks', 0)}", flush=True)
    summary = {}
    for m in modes:
        summary[m] = {"total_s_median": statistics.median(res[m]["total_s"]),
                      "steady_ms_median": statistics.median(res[m]["steady_ms"]),
                      "check_time_pct_median": 100 * statistics.median(res[m]["check_share"]),
                      "hits": res[m]["hits"], "shadow_checks": res[m]["shadow_checks"],
                      "mismatches": res[m]["mismatches"]}
    off, on, every = summary["off"], summary["defaults"], summary["every"]
    summary["overhead_total_pct"] = 100 * (on["total_s_median"] / off["total_s_median"] - 1)
    summary["overhead_steady_pct"] = 100 * (on["steady_ms_median"] / off["steady_ms_median"] - 1)
    summary["every_call_checked_steady_pct"] = 100 * (every["steady_ms_median"] / off["steady_ms_median"] - 1)
    summary["defaults_steady_pct_extrapolated"] = summary["every_call_checked_steady_pct"] / 1000
    summary["example"], summary["rounds"], summary["steps"], summary["train_args"] = a.example, a.rounds, a.steps, a.train_args
    if on["hits"] == 0:
        summary["note"] = "nothing was served from this cache: the live check had nothing to check"
    print(json.dumps(summary, indent=1))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps({"summary": summary, "runs": res}, indent=1))


if __name__ == "__main__":
    main()
