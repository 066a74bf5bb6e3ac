"""Op families end to end on the CPU backend: an offline search (`kernelcraft evolve`) for one small
key, then the user's own call in a fresh process with that cache. The served kernel must be hit and
give the fp64 answer within the dtype's budget.

The cases are the ops with the most scalar arguments: the worker binds a key's scalars from the key
string, the user process from the live call, and a launch spec may name any of them. A fifth
scalar once went missing on the serving side only (native_group_norm's eps), and every search
still passed; only a served call shows it. `serve_case` is shared with test_families_cuda.py.
"""
import json
import os
import subprocess
import time

from conftest import CLI, LIB
from test_evolution import child, records, search_state

import pytest

# (op, shape, dtype, args, the user's call as an expression of x; w(n) and idx(n, m) make a
# parameter vector and indices on x's device and in x's dtype)
CASES = [
    ("group_norm", "2x8x5x5", "f32", {"group": 4}, "F.group_norm(x, 4, w(8), w(8, -1.0))"),
    ("avg_pool2d", "2x3x9x9", "f32", {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]},
     "F.avg_pool2d(x, 3, 2, 1)"),
    ("max_pool2d", "2x3x9x9", "f32", {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]},
     "F.max_pool2d(x, 3, 2, 1, return_indices=True)[0]"),
    # aten::max_pool2d caught above autograd: the values alone where no gradient is wanted
    ("max_pool2d_values", "2x3x9x9", "f32", {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]},
     "F.max_pool2d(x, 3, 2, 1)"),
    ("batch_norm", "4x3x5x5", "f32", {"affine": False, "running": False},
     "F.batch_norm(x, None, None, training=True)"),
    ("embedding_backward", "64x16", "f32", {"num_weights": 100},
     "torch.ops.aten.embedding_dense_backward(x, idx(64, 100), 100, -1, False)"),
    # CompositeExplicitAutograd (caught at the CPU key), pos_weight [C] broadcast along the last
    # dim and a weight of self's sizes
    ("bce_with_logits", "64x16", "f32", {"weight": True, "pos_weight": "last"},
     "F.binary_cross_entropy_with_logits(x, torch.sigmoid(x.flip(0)), weight=x.abs(), pos_weight=w(16))"),
    # CompositeExplicitAutograd: no CPU kernel of its own; the interception sits at the CPU key
    ("logsumexp", "64x300", "f32", {"dim": [1]}, "torch.logsumexp(x, 1)"),
    # Two runs of reduced dims around the kept one (batch-norm statistics); Python passes
    # correction 1 where the CLI would key "none"
    ("var_mean", "6x8x7x9", "f32", {"dim": [0, 2, 3], "correction": 1}, "torch.var_mean(x, (0, 2, 3))[0]"),
    # The same, and reached only through autograd: the forward's derivative calls them (grad_output
    # a 0-dim one for mean and sum)
    ("smooth_l1_loss_backward", "64x16", "f32", {"beta": 0.5},
     "torch.autograd.grad(F.smooth_l1_loss(l := x.detach().requires_grad_(), torch.sin(x), beta=0.5), l)[0]"),
    ("huber_loss_backward", "64x16", "f32", {"reduction": 2, "delta": 0.7},
     "torch.autograd.grad(F.huber_loss(l := x.detach().requires_grad_(), torch.cos(x), reduction='sum', delta=0.7), l)[0]"),
]
EPS = {"f32": 1.2e-7, "bf16": 7.8e-3, "f16": 9.8e-4}


def evolve(cache, op, shape, dtype, args, backend, search, timeout=900):
    t0 = time.time()
    r = subprocess.run([CLI, "--cache-dir", str(cache), "evolve", "--op", op, "--shape", shape, "--dtype", dtype,
                        "--args", json.dumps(args), "--backend", backend, *search],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return time.time() - t0


def passed_templates(state):
    return [t for t in state["tried"] if t["verdict"] == "passed" and t.get("origin") != "user"]


def serve_case(tmp_path, op, shape, dtype, args, call, device,
               search=("--generations", "2", "--mu", "4", "--lambda", "6")):
    """Searches the key, then (when served) checks the user's call in a fresh process."""
    cache = tmp_path / "c"
    wall = evolve(cache, op, shape, dtype, args, "cuda" if device == "cuda" else "cpu", search)
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
        return None
    dt = {"f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16"}[dtype]
    sizes = ",".join(shape.split("x"))
    code = f"""
    import torch.nn.functional as F
    def f(x):
        w = lambda n, lo=0.5: torch.linspace(lo, 1.5, n, device=x.device).to(x.dtype)
        idx = lambda n, m: torch.arange(n, device=x.device) * 7919 % m
        return {call}
    x = torch.randn({sizes}, device="{device}").to({dt})
    ref = f(x.double()).float()
    for _ in range(3):   # the first call loads the kernel (and runs eager meanwhile)
        y = f(x)
    if x.is_cuda: torch.cuda.synchronize()
    s = json.loads(kc.status())["total"]
    print(json.dumps({{"hits": s["hits"], "err": (y.float() - ref).abs().max().item(),
                      "scale": ref.abs().max().item()}}))
"""
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache), KERNELCRAFT_EVOLVE="0", KERNELCRAFT_LIB=LIB)
    out = child(code, env)
    assert out["hits"] >= 1, f"the served {op} kernel was not used by the user's call: {out}"
    assert out["err"] <= 8 * EPS[dtype] * max(1.0, out["scale"]), out
    return out


@pytest.mark.parametrize("op,shape,dtype,args,call", CASES, ids=[c[0] for c in CASES])
def test_searched_kernel_serves_the_users_call(tmp_path, op, shape, dtype, args, call):
    # One small generation: the point is the served call, not the search (CI has two cores).
    serve_case(tmp_path, op, shape, dtype, args, call, "cpu", ("--generations", "1", "--mu", "2", "--lambda", "3"))
