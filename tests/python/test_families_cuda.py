"""The operator families of [5/7] end to end on a real GPU (skipped without one): for each op an
offline search (`kernelcraft evolve`) runs the whole gauntlet on the family's CUDA templates; some
template candidate must pass it, the key must end served or eager_best, and a served kernel must
give the fp64 answer within its dtype's budget in a user process. Prints the time to the first
verified candidate and to the best (the search state's timestamps)."""
import json
import os
import subprocess
import time

import pytest
import torch
from conftest import CLI, LIB
from test_evolution import child, records, search_state

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

# (op, shape, dtype, args, a user call on tensor x)
CASES = [
    ("leaky_relu", "4096x4099", "bf16", {}, "F.leaky_relu(x)"),
    ("elu", "4096x4099", "bf16", {}, "F.elu(x)"),
    ("hardswish", "4096x4099", "f32", {}, "F.hardswish(x)"),
    ("softplus", "4096x4099", "bf16", {}, "F.softplus(x)"),
    ("mish", "4096x4099", "bf16", {}, "F.mish(x)"),
    ("mish_backward", "4096x4099", "bf16", {}, None),
    ("elu_backward", "4096x4099", "f32", {}, None),
    ("cumsum", "128x65536", "f32", {"dim": 1}, "torch.cumsum(x, 1)"),
    ("cumsum", "8192x1024", "bf16", {"dim": 0}, "torch.cumsum(x, 0)"),
    ("group_norm", "8x320x64x64", "f32", {"group": 32}, None),
    ("batch_norm", "1x512x128x128", "f32", {"affine": False, "running": False}, None),
    ("max_pool2d", "16x64x128x128", "bf16", {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]}, None),
    ("avg_pool3d", "8x32x32x64x64", "f32", {"kernel_size": [3, 3, 3], "stride": [2, 2, 2], "padding": [1, 1, 1]}, None),
    ("embedding_backward", "8192x768", "bf16", {"num_weights": 50257}, None),
]


def evolve(cache, op, shape, dtype, args):
    t0 = time.time()
    r = subprocess.run([CLI, "--cache-dir", str(cache), "evolve", "--op", op, "--shape", shape, "--dtype", dtype,
                        "--args", json.dumps(args), "--backend", "cuda", "--generations", "2", "--mu", "4",
                        "--lambda", "6"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return time.time() - t0


def passed_templates(state):
    return [t for t in state["tried"] if t["verdict"] == "passed" and t.get("origin") != "user"]


@pytest.mark.parametrize("op,shape,dtype,args,call", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_family_op_is_searched_verified_and_served(tmp_path, op, shape, dtype, args, call):
    cache = tmp_path / "c"
    wall = evolve(cache, op, shape, dtype, args)
    recs = records(cache)
    assert len(recs) == 1, recs
    key, rec = next(iter(recs.items()))
    st = search_state(cache, key)
    ok = passed_templates(st)
    print(f"{op} {shape} {dtype}: {rec['state']}, {len(ok)}/{len(st['tried'])} candidates verified, "
          f"search {wall:.1f} s")
    assert ok, [(t["family"], t["verdict"], t.get("stage"), str(t.get("evidence"))[:300]) for t in st["tried"]]
    assert rec["state"] in ("served", "eager_best")
    if rec["state"] != "served" or call is None:
        return
    dt = {"f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16"}[dtype]
    sizes = ",".join(shape.split("x"))
    code = f"""
    import torch.nn.functional as F
    x = torch.randn({sizes}, device="cuda").to({dt})
    ref = ({call.replace("x)", "x.double())")}).float()
    y = {call}
    torch.cuda.synchronize()
    s = json.loads(kc.status())["total"]
    print(json.dumps({{"hits": s["hits"], "err": (y.float() - ref).abs().max().item(),
                      "scale": ref.abs().max().item()}}))
"""
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache), KERNELCRAFT_EVOLVE="0", KERNELCRAFT_LIB=LIB)
    out = child(code, env)
    assert out["hits"] >= 1
    eps = {"f32": 1.2e-7, "bf16": 7.8e-3, "f16": 9.8e-4}[dtype]
    assert out["err"] <= 8 * eps * max(1.0, out["scale"]), out
