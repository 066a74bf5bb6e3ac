"""Wall time of the whole verification gauntlet (sanitizers included) for one candidate of a
default operator at a training-size shape: `kernelcraft verify` on the honest corpus kernels.

    python3 benchmarks/gauntlet_time.py --cli build/torch_ops/kernelcraft [--out times.json]
"""
import argparse
import json
import pathlib
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Training-size shapes per op (the transformer block of examples/train_block.py, and larger).
SHAPES = {"relu": "16x1024x4096", "gelu": "8x256x2048", "silu": "16x1024x4096", "sigmoid": "16x1024x4096",
          "tanh": "16x1024x4096", "softmax": "8x8x256x256", "log_softmax": "2048x4096", "layer_norm": "8x256x512",
          "softmax_backward": "8x8x256x256", "layer_norm_backward": "8x256x512"}

ap = argparse.ArgumentParser()
ap.add_argument("--cli", required=True)
ap.add_argument("--out", default="")
a = ap.parse_args()
manifest = json.loads((ROOT / "tests" / "corpus" / "manifest.json").read_text())
rows = []
for e in manifest:
    if e["backend"] != "cuda" or e["expect"] != "pass" or e["op"] not in SHAPES:
        continue
    d = ROOT / "tests" / "corpus" / "cuda"
    src = d / (e["name"] + ".cu")
    args = dict(e.get("args", {}))
    args.pop("normalized_shape", None)   # the training shape's own last dim
    cmd = [a.cli, "verify", "--json", "--backend", "cuda", "--op", e["op"], "--shape", SHAPES[e["op"]],
           "--source", str(src), "--launch", str(d / (e["name"] + ".json"))]
    if args:
        cmd += ["--args", json.dumps(args)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.time() - t0
    try:
        v = json.loads(r.stdout)
        call = v["calls"][0] if v.get("calls") else {}
        stages = {s["name"]: round(s["millis"] / 1e3, 2) for s in call.get("stages", [])}
    except (ValueError, KeyError, IndexError):
        v, stages = {"verified": None}, {}
    rows.append({"kernel": e["name"], "op": e["op"], "shape": SHAPES[e["op"]], "wall_s": round(wall, 2),
                 "verified": v.get("verified"), "stage": v.get("stage"), "stage_s": stages, "rc": r.returncode})
    print(json.dumps(rows[-1]), flush=True)
if a.out:
    json.dump(rows, open(a.out, "w"), indent=1)
print("max wall:", max((r["wall_s"] for r in rows), default=None))
