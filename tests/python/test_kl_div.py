"""KL divergence caught above autograd (dispatcher/kl_div.cpp) on the CPU backend.

Without a served pair, F.kl_div must be PyTorch's own composite, bit for bit, graph included.
With the pair searched offline (`kernelcraft evolve` of both keys), the user's call in a fresh
process must be served by both kernels and give fp64's loss and gradient within budget, with
kernelcraft's node as the graph; 'batchmean' reaches aten as a sum (Python divides by the batch).
Calls the pair does not take (a target that wants a gradient, a broadcast target) stay PyTorch's
own, bit for bit, with the pair in the cache. torch.compile's tracing sees PyTorch's decomposition.
"""
import json
import os

import pytest

from conftest import LIB
from test_cross_entropy import plain_run
from test_evolution import child, search_pair
from test_families import EPS, evolve

SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
AT_REDUCTION = {"none": 0, "mean": 1, "sum": 2, "batchmean": 2}
# (name, shape, F.kl_div's reduction, log_target)
CASES = [
    ("batchmean", "16x50", "batchmean", False),
    ("mean_log_target", "6x40", "mean", True),
    ("none", "7x30", "none", False),
    ("sum_log_target", "5x3x8", "sum", True),
]

# The user's program: the same call on the same values (saved with torch.save so bits can be
# compared across processes), plus what autograd recorded. The target is a distribution with
# exact zeros (xlogy's 0 log 0 = 0) or, with log_target, its log. {tgrad}: the target wants a
# gradient; {bcast}: the target is one row broadcast over the batch.
PROGRAM = """
import torch.nn.functional as F
torch.manual_seed(0)
shape, dev, red, lt = {shape}, "{device}", "{red}", {lt}
x = F.log_softmax(torch.randn(*shape, device=dev) * 2, -1).to(torch.{dtype})
p = torch.softmax(torch.randn(*shape, device=dev) * 3, -1)
p.view(-1)[::7] = 0
t = (torch.log(p.clamp_min(1e-30)) if lt else p).to(x.dtype)
if {bcast}:
    t = t[:1]
cot = torch.randn(*shape, device=dev).to(x.dtype) if red == "none" else torch.tensor(1.7, device=dev).to(x.dtype)
for it in range({calls}):
    xx = x.clone().requires_grad_(True)
    tt = t.clone().requires_grad_({tgrad})
    y = F.kl_div(xx, tt, reduction=red, log_target=lt)
    (y * cot).sum().backward()
with torch.no_grad():   # no graph: the forward alone is served
    ng = F.kl_div(x, t, reduction=red, log_target=lt)
x64 = x.double().requires_grad_(True)
ref = F.kl_div(x64, t.double(), reduction=red, log_target=lt)
(ref * cot.double()).sum().backward()
torch.save({{"y": y.detach(), "gx": xx.grad, "gt": tt.grad}}, {save!r})
s = json.loads(kc.status())["ops"] if {loaded} else {{}}
hits = {{k: s[k]["hits"] for k in ("kl_div", "kl_div_backward")}} if s else {{}}
err = lambda a, b: (a.double() - b).abs().max().item()
fn = y.grad_fn   # batchmean: Python's division by the batch, above aten::kl_div's node
fn = fn.next_functions[0][0] if red == "batchmean" and fn.name() == "DivBackward0" else fn
print(json.dumps({{"grad_fn": fn.name(), "hits": hits, "dtype": str(y.dtype),
                  "edges": [f[0].name() if f[0] is not None else None for f in fn.next_functions],
                  "y_err": err(y.detach(), ref.detach()), "y_scale": ref.detach().abs().max().item(),
                  "ng_err": err(ng, ref.detach()), "ng_fn": ng.grad_fn is None,
                  "gx_err": err(xx.grad, x64.grad), "gx_scale": x64.grad.abs().max().item()}}))
"""


def program(case, save, calls=3, loaded=True, device="cpu", dtype="float32", tgrad=False, bcast=False):
    name, shape, red, lt = case
    sizes = [int(v) for v in shape.split("x")]
    return PROGRAM.format(shape=sizes, device=device, red=red, lt=lt, dtype=dtype, calls=calls, loaded=loaded,
                          save=str(save), tgrad=tgrad, bcast=bcast)


def env_for(cache, **extra):
    return dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache), KERNELCRAFT_EVOLVE="0", KERNELCRAFT_LIB=LIB, **extra)


def assert_pytorchs_own(tmp_path, case, cache, **kw):
    """The user's call with the library loaded is PyTorch's composite, bit for bit, graph included."""
    import torch
    mine = child(program(case, tmp_path / "kc.pt", **kw), env_for(cache))
    theirs = plain_run(program(case, tmp_path / "pt.pt", loaded=False, **kw), env_for(cache))
    a, b = torch.load(tmp_path / "kc.pt"), torch.load(tmp_path / "pt.pt")
    bits = lambda t: t.reshape(-1).view(torch.uint8)   # NaN (the target's gradient at t == 0) included
    for k in ("y", "gx", "gt"):
        assert (a[k] is None and b[k] is None) or torch.equal(bits(a[k]), bits(b[k])), k
    assert mine["grad_fn"] == theirs["grad_fn"] and "Kernelcraft" not in mine["grad_fn"], (mine, theirs)
    assert mine["edges"] == theirs["edges"], (mine, theirs)
    assert mine["hits"] == {"kl_div": 0, "kl_div_backward": 0}, mine
    return mine


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_without_a_kernel_the_composite_answers_bit_for_bit(tmp_path, case):
    assert_pytorchs_own(tmp_path, case, tmp_path / "c")


def serve_pair(tmp_path, case, device="cpu", dtype="float32",
               search=("--generations", "1", "--mu", "2", "--lambda", "3"), forward_may_lose=False):
    """Searches the pair's two keys offline, then checks the user's call in a fresh process.
    forward_may_lose: eager's forward may beat every candidate (a tiny elementwise call on a
    loaded two-core machine, where eager's three small ops stay on one thread); the forward key
    then ends eager_best and the call must be PyTorch's own, bit for bit."""
    name, shape, red, lt = case
    args = {"reduction": AT_REDUCTION[red], "log_target": lt}
    both = lambda cache: [evolve(cache, op, shape, SHORT[dtype], args, "cuda" if device == "cuda" else "cpu", search)
                          for op in ("kl_div", "kl_div_backward")]
    cache, states = search_pair(tmp_path, both, "kernelcraft::kl_div", forward_may_lose)
    if forward_may_lose and states.get("kernelcraft::kl_div") == "eager_best":
        assert states.get("kernelcraft::kl_div_backward") in ("served", "eager_best"), states
        out = assert_pytorchs_own(tmp_path, case, cache, device=device, dtype=dtype)
        print(f"{name} {shape} {dtype}: forward eager_best, {states}: {out}")
        return cache
    assert states == {"kernelcraft::kl_div": "served", "kernelcraft::kl_div_backward": "served"}, states
    # The live check compares the first served calls with eager.
    out = child(program(case, tmp_path / "kc.pt", calls=4, device=device, dtype=dtype),
                env_for(cache, KERNELCRAFT_SHADOW_CALLS="1"))
    print(f"{name} {shape} {dtype}: {out}")
    assert out["grad_fn"] == "KernelcraftKlDivBackward", out
    assert out["edges"] == ["torch::autograd::AccumulateGrad"], out   # nothing between the loss and the input
    assert out["hits"]["kl_div"] >= 1 and out["hits"]["kl_div_backward"] >= 1, out
    e = EPS[SHORT[dtype]]
    tol = 64 * e * max(1.0, out["y_scale"])
    assert out["y_err"] <= tol and out["ng_fn"] and out["ng_err"] <= tol, out
    assert out["gx_err"] <= 16 * e * max(1.0, out["gx_scale"]), out
    return cache


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_searched_pair_serves_forward_and_backward(tmp_path, case):
    # batchmean (KernelBench's KLDivLoss) must be served; the others are timed too close to call.
    cache = serve_pair(tmp_path, case, forward_may_lose=case[0] != "batchmean")
    if case[0] != "batchmean":
        return
    # With the pair in the cache, a target that wants a gradient and a broadcast target are still
    # PyTorch's composite (the target's gradient, broadcasting and its reduction are eager's).
    assert_pytorchs_own(tmp_path, case, cache, tgrad=True)
    assert_pytorchs_own(tmp_path, case, cache, bcast=True)


def test_module_and_compile_run_pytorchs_code_without_kernels(tmp_path):
    """nn.KLDivLoss reaches the same call; a compiled region traces PyTorch's decomposition."""
    code = """
    m = torch.nn.KLDivLoss(reduction="batchmean", log_target=True)
    x = torch.randn(4, 16).log_softmax(-1).requires_grad_(True)
    t = torch.randn(4, 16).log_softmax(-1)
    f = torch.compile(lambda x, t: m(x, t), backend="aot_eager")
    y = f(x, t)
    y.backward()
    ref_x = x.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.kl_div(ref_x, t, reduction="batchmean", log_target=True)
    ref.backward()
    print(json.dumps({"same": bool(torch.allclose(y, ref)), "grad": bool(torch.allclose(x.grad, ref_x.grad)),
                      "graph": y.grad_fn.name(), "eager_graph": m(x, t).grad_fn.name()}))
    """
    out = child(code, env_for(tmp_path / "c"))
    assert out["same"] and out["grad"], out
    assert "Kernelcraft" not in out["graph"] and "Kernelcraft" not in out["eager_graph"], out
