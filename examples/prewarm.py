"""The deployment workflow: record the keys a model misses, evolve them offline, ship the cache.

    python3 examples/prewarm.py [--lib build/torch_ops/libkernelcraft.so] [--cli build/torch_ops/kernelcraft]
                                [--workdir DIR] [--generations 2]

1. run the model once with evolution off and KERNELCRAFT_MISS_LOG=keys.txt (the keys it missed)
2. kernelcraft evolve --keys keys.txt        (the same search the background worker runs)
3. kernelcraft cache export kernels.kcb      (a bundle: records with their evidence and binaries)
4. on the serving machine: kernelcraft cache import kernels.kcb, then run the model with
   KERNELCRAFT_CACHE_READONLY=1: evolved kernels are served from the first call, nothing is written
Bundles hold binaries for one target (GPU architecture, driver and toolkit are part of every key):
build them on the kind of machine you deploy to.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=str(HERE.parent / "build" / "torch_ops" / "libkernelcraft.so"))
ap.add_argument("--cli", default=str(HERE.parent / "build" / "torch_ops" / "kernelcraft"))
ap.add_argument("--workdir", default=tempfile.mkdtemp(prefix="kc-prewarm-"))
ap.add_argument("--generations", default="2")
a = ap.parse_args()
work = pathlib.Path(a.workdir)
keys, build_cache, ship_cache, bundle = work / "keys.txt", work / "build-cache", work / "ship-cache", work / "kernels.kcb"
# A small configuration of the training example, so the demo runs in a minute on a CPU too.
MODEL = [sys.executable, str(HERE / "train_block.py"), "--mode", "kernelcraft", "--lib", a.lib, "--steps", "3",
         "--batch", "2", "--seq", "64", "--dim", "128", "--heads", "4", "--vocab", "512"]


def run(cmd, progress=False, **env):
    """Runs cmd; its stdout is returned. With progress, its stderr (kernelcraft evolve's progress
    bar on a terminal, plain lines otherwise) goes straight to ours."""
    print("$", " ".join(str(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, env={**os.environ, **{k: str(v) for k, v in env.items()}}, stdout=subprocess.PIPE,
                       stderr=None if progress else subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}):\n{(r.stderr or '')[-3000:]}")
    return r.stdout


# 1. record the misses
run(MODEL + ["--out", str(work / "record.json")], KERNELCRAFT_EVOLVE=0, KERNELCRAFT_CACHE_DIR=build_cache,
    KERNELCRAFT_MISS_LOG=keys)
print(f"   {len(keys.read_text().splitlines())} keys recorded in {keys}")
# 2. evolve them offline, 3. export
print(run([a.cli, "--cache-dir", build_cache, "evolve", "--keys", keys, "--generations", a.generations],
          progress=True), end="")
print(run([a.cli, "--cache-dir", build_cache, "cache", "export", bundle]), end="")
# 4. import where the model is served, and serve read-only
print(run([a.cli, "--cache-dir", ship_cache, "cache", "import", bundle]), end="")
run(MODEL + ["--out", str(work / "serve.json")], KERNELCRAFT_CACHE_DIR=ship_cache, KERNELCRAFT_CACHE_READONLY=1)
ops = json.load(open(work / "serve.json"))["status"]["ops"]
print("served from the shipped cache:")
for name, c in sorted(ops.items()):
    if c["hits"] or c["misses"]:
        print(f"   {name:<22} hits {c['hits']:>4}  misses {c['misses']:>4}  (misses: eager is best for that key)")
