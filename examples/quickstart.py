"""kernelcraft's main job in two minutes: an unchanged training loop gets faster while it trains.

    python3 examples/quickstart.py [--steps-before 10] [--max-wait 75]

The loop below is plain PyTorch. `import kernelcraft` is the only addition. The first calls of each
intercepted operator miss: they run eager and start a background search in a separate worker
process, while training goes on. Once a kernel has been verified and has beaten eager, it is stored
in the cache and served. The loop then runs on the served kernels. Nothing is faked: the step
times before and after are measured here, and if nothing beat eager the script says so.

The model is a layer norm, where eager PyTorch is weak at some shapes:
- on a GPU, one long row per sample (4M features): eager computes a row's statistics in one
  thread block, so a single row cannot use the whole GPU; a split-row kernel can;
- on a CPU, many short rows (262144 rows of 8 features, as in per-head or per-point
  normalisation): eager pays a fixed cost per row that dwarfs the work; a kernel that takes
  several rows per step does not.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ap = argparse.ArgumentParser()
ap.add_argument("--steps-before", type=int, default=10, help="eager steps timed before any kernel exists")
ap.add_argument("--max-wait", type=float, default=75, help="seconds of training while the worker searches")
a = ap.parse_args()

# A private cache for the demo (the default is ~/.cache/kernelcraft), and a short search so that it
# finishes in about a minute on a 2-core machine (the defaults search longer). Set before loading.
os.environ.setdefault("KERNELCRAFT_CACHE_DIR", tempfile.mkdtemp(prefix="kc-quickstart-"))
os.environ.setdefault("KERNELCRAFT_EVOLVE_GENERATIONS", "1")
os.environ.setdefault("KERNELCRAFT_EVOLVE_LAMBDA", "4")
os.environ.setdefault("KERNELCRAFT_EVOLVE_GPU_SHARE", "1.0")   # this machine is ours for the demo:
os.environ.setdefault("KERNELCRAFT_EVOLVE_NICE", "0")          # no duty cycle, no lower priority

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import kernelcraft  # installed with `pip install .` (scripts/setup.sh)
except ImportError:     # a build tree without the package installed
    sys.path.insert(0, str(HERE.parent / "torch_ops" / "python"))
    os.environ.setdefault("KERNELCRAFT_LIB", str(HERE.parent / "build" / "torch_ops" / "libkernelcraft.so"))
    import kernelcraft

device = "cuda" if torch.cuda.is_available() else "cpu"
SHAPE = (1, 1 << 22) if device == "cuda" else (1 << 18, 8)   # (rows, features per row)


# ---- the user's program: unchanged, nothing in it knows about kernelcraft ----------------------
class Model(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = torch.nn.LayerNorm(features)

    def forward(self, x):
        return self.norm(x)


torch.manual_seed(0)
model = Model(SHAPE[1]).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(*SHAPE, device=device) * 2 + 0.5
target = torch.randn(*SHAPE, device=device)


def step():
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), target)
    loss.backward()
    opt.step()
    return loss


def timed(n):
    """Median seconds per step over n steps."""
    times = []
    for _ in range(n):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]
# -------------------------------------------------------------------------------------------------


def ms(s):
    return f"{s * 1e3:.2f} ms"


print(f"device {device}, torch {torch.__version__}, layer norm of {SHAPE[0]} rows x {SHAPE[1]} features")
with kernelcraft.disabled():
    before = timed(a.steps_before)
print(f"1. eager (kernelcraft disabled): {ms(before)} per step")

# Training with kernelcraft: the first step misses every key and submits them to the worker.
t0 = time.time()
step()
print(f"2. training on while the worker searches the {len(kernelcraft.missed_keys())} missed keys "
      f"(cache {os.environ['KERNELCRAFT_CACHE_DIR']})")
worker_log = pathlib.Path(os.environ["KERNELCRAFT_CACHE_DIR"]) / "worker.log"


def last_worker_line():
    """The worker's latest event (it logs one line per candidate), shortened for the terminal."""
    try:
        lines = [ln for ln in worker_log.read_text().splitlines() if ln.strip()]
    except OSError:
        return "worker starting"
    return (lines[-1] if lines else "worker starting")[-90:]


steps, shown = 0, time.time()
while not kernelcraft.wait_for_evolution(0.0) and time.time() - t0 < a.max_wait:
    step()
    steps += 1
    if time.time() - shown > 5:
        shown = time.time()
        print(f"   {shown - t0:5.1f} s, {steps:4d} steps | {last_worker_line()}", flush=True)
done = kernelcraft.wait_for_evolution(0.0)
print(f"   {'searches finished' if done else 'still searching (stopped waiting)'} after "
      f"{time.time() - t0:.1f} s and {steps} training steps")

# The process picks up new records at its next catch-up (catch_up_ms, 500 ms by default); the
# first call of a found key loads its kernel. Its next calls are its probation here: the kernel and
# eager both run, timed in this process, and a kernel that is not faster here is demoted to eager.
kernelcraft.reset_counters()
for i in range(3 + kernelcraft.config()["serve_probe_calls"] + 1):
    step()
    if i < 3:
        time.sleep(0.6)
probation = kernelcraft.status()["ops"]
kernelcraft.reset_counters()
# Timed in alternation, a few steps each way per round, so that both see the same machine (the
# worker may still be running, the clock may drift): the medians of the rounds are compared.
served_t, eager_t = [], []
for _ in range(5):
    served_t.append(timed(4))
    with kernelcraft.disabled():
        eager_t.append(timed(4))
after, eager_now = sorted(served_t)[2], sorted(eager_t)[2]
ops = {name: c for name, c in kernelcraft.status()["ops"].items() if c["hits"] or c["misses"]}
print(f"3. with kernelcraft: {ms(after)} per step against {ms(eager_now)} eager, timed in alternation "
      f"({eager_now / after:.2f}x)")
served = [n for n, c in ops.items() if c["hits"]]
for name, c in sorted(ops.items()):
    demoted = " (demoted: slower than eager in this process)" if probation.get(name, {}).get("demoted") else ""
    print(f"   {name:<28} served {c['hits']:>3}  eager {c['misses'] + c['fallbacks']:>3}{demoted}")
if not served:
    print("   nothing beat eager here: every key runs eager (eager_best, or demoted after timing here)")

# What the worker stored, with the evidence it promoted on.
cli = kernelcraft.cli_path()
out = subprocess.run([cli, "cache", "ls"], capture_output=True, text=True,
                     env={**os.environ, "KERNELCRAFT_LOG_LEVEL": "error"})
print("4. the cache (`kernelcraft cache ls`):")
print("   " + (out.stdout.strip().replace("\n", "\n   ") or "(empty)"))

# Served kernels passed the verification gauntlet; check one more time against eager here.
with torch.no_grad():
    y = model(x)
    with kernelcraft.disabled():
        y_eager = model(x)
err = (y - y_eager).abs().max().item()
print(f"5. served layer norm vs eager: max abs difference {err:.2e}")
