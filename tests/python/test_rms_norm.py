"""RMSNorm caught above autograd (dispatcher/rms_norm.cpp) on the CPU backend.

Without a served pair, F.rms_norm must be PyTorch's own composite, bit for bit, graph included.
With the pair searched offline (`kernelcraft evolve` of both keys), the user's call in a fresh
process must be served by both kernels and give fp64's output and gradients within budget, with
kernelcraft's node as the graph. torch.compile's tracing must see PyTorch's decomposition.
"""
import json
import os

import pytest

from conftest import LIB
from test_cross_entropy import plain_run
from test_evolution import child, search_pair
from test_families import EPS, evolve

FLT_EPS = 1.1920928955078125e-07   # eager's default eps for these dtypes, as the key holds it
# (name, shape, normalized_shape, weight, eps (None: eager's default), dtype, grad of the weight)
CASES = [
    ("weight", "4x6x32", [32], True, 1e-6, "float32", True),
    ("two_dims_no_weight", "5x8x12", [8, 12], False, None, "float32", False),
    ("bf16_frozen_weight", "3x7x40", [40], True, 1e-5, "bfloat16", False),
]
SHORT = {"float32": "f32", "bfloat16": "bf16"}

PROGRAM = """
import torch.nn.functional as F
torch.manual_seed(0)
shape, ns, dev = {shape}, {ns}, "{device}"
x = (torch.randn(*shape, device=dev) * 2 + 0.5).to(torch.{dtype})
w = torch.linspace(0.5, 1.5, ns[-1], device=dev).repeat(*ns[:-1], 1).to(x.dtype) if {weight} else None
cot = torch.randn(*shape, device=dev).to(x.dtype)
for it in range({calls}):
    xx = x.clone().requires_grad_(True)
    ww = w.clone().requires_grad_({wgrad}) if w is not None else None
    y = F.rms_norm(xx, ns, ww, {eps})
    (y * cot).sum().backward()
with torch.no_grad():   # no graph: the forward alone is served
    ng = F.rms_norm(x, ns, w, {eps})
x64 = x.double().requires_grad_(True)
w64 = w.double().requires_grad_(True) if w is not None else None
ref = F.rms_norm(x64, ns, w64, {eps64})
(ref * cot.double()).sum().backward()
torch.save({{"y": y.detach(), "gx": xx.grad, "gw": ww.grad if ww is not None else None}}, {save!r})
s = json.loads(kc.status())["ops"] if {loaded} else {{}}
hits = {{k: s[k]["hits"] for k in ("rms_norm", "rms_norm_backward")}} if s else {{}}
err = lambda a, b: (a.double() - b).abs().max().item()
print(json.dumps({{"grad_fn": y.grad_fn.name(), "hits": hits, "dtype": str(y.dtype),
                  "y_err": err(y.detach(), ref.detach()), "y_scale": ref.detach().abs().max().item(), "ng_err": err(ng, ref.detach()), "ng_fn": ng.grad_fn is None,
                  "gx_err": err(xx.grad, x64.grad), "gx_scale": x64.grad.abs().max().item(),
                  "gw_err": err(ww.grad, w64.grad) if {wgrad} else 0.0,
                  "gw_scale": w64.grad.abs().max().item() if {wgrad} else 1.0}}))
"""


def program(case, save, calls=3, loaded=True, device="cpu"):
    name, shape, ns, weight, eps, dtype, wgrad = case
    sizes = [int(v) for v in shape.split("x")]
    eps64 = "None" if eps is None else repr(eps)
    if eps is None:   # fp64's own default epsilon would differ: give the reference fp32's
        eps64 = repr(FLT_EPS)
    return PROGRAM.format(shape=sizes, ns=ns, device=device, dtype=dtype, weight=weight, wgrad=wgrad and weight,
                          eps=repr(eps), eps64=eps64, calls=calls, loaded=loaded, save=str(save))


def env_for(cache, **extra):
    return dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache), KERNELCRAFT_EVOLVE="0", KERNELCRAFT_LIB=LIB, **extra)


def assert_pytorchs_own(tmp_path, case, cache, device="cpu"):
    """The user's call with the library loaded is PyTorch's composite, bit for bit, graph included."""
    import torch
    env = env_for(cache)
    mine = child(program(case, tmp_path / "kc.pt", device=device), env)
    theirs = plain_run(program(case, tmp_path / "pt.pt", loaded=False, device=device), env)
    a, b = torch.load(tmp_path / "kc.pt"), torch.load(tmp_path / "pt.pt")
    for k in ("y", "gx", "gw"):
        assert (a[k] is None and b[k] is None) or torch.equal(a[k], b[k]), k
    assert mine["grad_fn"] == theirs["grad_fn"] != "KernelcraftRmsNormBackward"
    assert mine["hits"] == {"rms_norm": 0, "rms_norm_backward": 0}
    return mine


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_without_a_kernel_the_composite_answers_bit_for_bit(tmp_path, case):
    assert_pytorchs_own(tmp_path, case, tmp_path / "c")


def serve_pair(tmp_path, case, device="cpu", search=("--generations", "1", "--mu", "2", "--lambda", "3"),
               forward_may_lose=False):
    """Searches the pair's two keys offline, then checks the user's call in a fresh process.
    forward_may_lose: eager's forward may beat every candidate (CUDA torch's fused rms_norm); the
    forward key then ends eager_best and the call must be PyTorch's own, bit for bit."""
    name, shape, ns, weight, eps, dtype, wgrad = case
    args = {"normalized_shape": ns, "weight": weight, "eps": FLT_EPS if eps is None else eps}
    both = lambda cache: (evolve(cache, "rms_norm", shape, SHORT[dtype], args, device, search),
                          evolve(cache, "rms_norm_backward", shape, SHORT[dtype],
                                 dict(args, output_mask=[1, int(wgrad and weight)]), device, search))
    cache, states = search_pair(tmp_path, both, "kernelcraft::rms_norm", forward_may_lose)
    if forward_may_lose and states.get("kernelcraft::rms_norm") == "eager_best":
        assert states.get("kernelcraft::rms_norm_backward") in ("served", "eager_best"), states
        out = assert_pytorchs_own(tmp_path, case, cache, device)
        print(f"{name} {shape} {dtype}: forward eager_best, {states}: {out}")
        return out
    assert states == {"kernelcraft::rms_norm": "served", "kernelcraft::rms_norm_backward": "served"}, states
    out = child(program(case, tmp_path / "kc.pt", calls=4, device=device), env_for(cache, KERNELCRAFT_SHADOW_CALLS="1"))
    print(f"{name} {shape} {dtype}: {out}")
    assert out["grad_fn"] == "KernelcraftRmsNormBackward", out
    assert out["hits"]["rms_norm"] >= 1 and out["hits"]["rms_norm_backward"] >= 1, out
    e = EPS[SHORT[dtype]]
    y_tol = 16 * e * max(1.0, out["y_scale"])
    assert out["y_err"] <= y_tol and out["ng_fn"] and out["ng_err"] <= y_tol, out
    assert out["gx_err"] <= 64 * e * max(1.0, out["gx_scale"]), out
    assert out["gw_err"] <= 64 * e * max(1.0, out["gw_scale"]), out
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_searched_pair_serves_forward_and_backward(tmp_path, case):
    serve_pair(tmp_path, case)


def test_module_and_compile_run_pytorchs_code_without_kernels(tmp_path):
    """nn.RMSNorm reaches the same call; a compiled region traces PyTorch's decomposition."""
    code = """
    m = torch.nn.RMSNorm(16)
    x = torch.randn(4, 16, requires_grad=True)
    f = torch.compile(lambda x: m(x), backend="aot_eager")
    y = f(x)
    y.sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.rms_norm(ref_x, (16,), m.weight, None)
    ref.sum().backward()
    print(json.dumps({"same": bool(torch.allclose(y, ref)), "grad": bool(torch.allclose(x.grad, ref_x.grad)),
                      "graph": y.grad_fn.name(), "eager_graph": m(x).grad_fn.name()}))
    """
    out = child(code, env_for(tmp_path / "c"))
    assert out["same"] and out["grad"], out
    assert "Kernelcraft" not in out["graph"] and "Kernelcraft" not in out["eager_graph"], out
