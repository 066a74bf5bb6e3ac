"""Cross-entropy caught above autograd (dispatcher/cross_entropy.cpp) on the CPU backend.

Without a served pair, F.cross_entropy must be PyTorch's own composite, bit for bit, graph
included. With the pair searched offline (`kernelcraft evolve` of both keys), the user's call in a
fresh process must be served by both kernels, give fp64's loss and gradient within budget, and
keep no log-probability tensor: the loss's grad_fn is kernelcraft's node, whose only edge is the
logits'. torch.compile's tracing must see PyTorch's decomposition, whatever the cache holds.
"""
import json
import os

import pytest

from conftest import LIB, run_python
from test_evolution import PRELUDE, child, search_pair
from test_families import EPS, evolve

SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
# (name, shape, evolve args, the call's keyword arguments, target kind)
CASES = [
    ("classes_mean", "6x50", {"ignore_index": 3, "label_smoothing": 0.1, "weight": True},
     "ignore_index=3, label_smoothing=0.1, weight=wt", "classes"),
    ("probs_sum", "5x40", {"probs": True, "reduction": 2}, "reduction='sum'", "probs"),
    ("classes_none", "7x30", {"reduction": 0}, "reduction='none'", "classes"),
]

# The user's program: the same call on the same values, as the loss and the logits' gradient
# (saved with torch.save so bits can be compared across processes), plus what autograd recorded.
PROGRAM = """
import torch.nn.functional as F
torch.manual_seed(0)
import contextlib
N, C, dev = {N}, {C}, "{device}"
x = (torch.randn(N, C, device=dev) * 3).to(torch.{dtype})
if "{kind}" == "probs":
    t = torch.softmax(torch.randn(N, C, device=dev), -1).to(x.dtype)
else:
    t = torch.randint(0, C, (N,), device=dev)
    t[::3] = 3
wt = torch.linspace(0.5, 1.5, C, device=dev).to(x.dtype)
ctx = (lambda: torch.autocast(dev, torch.bfloat16)) if {autocast} else contextlib.nullcontext
for it in range({calls}):
    xx = x.clone().requires_grad_(True)
    with ctx():
        loss = F.cross_entropy(xx, t, {kw})
    loss.sum().backward()
with torch.no_grad(), ctx():   # no graph: the forward alone is served
    ng = F.cross_entropy(x, t, {kw})
if x.is_cuda: torch.cuda.synchronize()
x64 = x.double().requires_grad_(True)
t64 = t.double() if t.is_floating_point() else t
ref = F.cross_entropy(x64, t64, {kw64})
ref.sum().backward()
torch.save({{"loss": loss.detach(), "grad": xx.grad}}, {save!r})
s = json.loads(kc.status())["ops"] if {loaded} else {{}}
hits = {{k: s[k]["hits"] for k in ("cross_entropy", "cross_entropy_backward")}} if s else {{}}
edges = [type(f[0]).__name__ if f[0] is not None else None for f in loss.grad_fn.next_functions]
print(json.dumps({{"grad_fn": loss.grad_fn.name(), "edges": edges, "hits": hits, "loss_dtype": str(loss.dtype),
                  "loss_err": (loss.double() - ref.detach()).abs().max().item(),
                  "loss_scale": ref.detach().abs().max().item(),
                  "nograd_err": (ng.double() - ref.detach()).abs().max().item(), "nograd_fn": ng.grad_fn is None,
                  "grad_err": (xx.grad.double() - x64.grad).abs().max().item(),
                  "grad_scale": x64.grad.abs().max().item()}}))
"""


def program(case, save, calls=3, loaded=True, device="cpu", dtype="float32", autocast=False):
    name, shape, _, kw, kind = case
    n, c = shape.split("x")
    kw64 = kw.replace("weight=wt", "weight=wt.double()")
    return PROGRAM.format(N=n, C=c, kind=kind, kw=kw, kw64=kw64, save=str(save), calls=calls, loaded=loaded,
                          device=device, dtype=dtype, autocast=autocast)


def plain_run(code, env):
    """The program without kernelcraft: PyTorch's own composite."""
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_without_a_kernel_the_composite_answers_bit_for_bit(tmp_path, case):
    import torch
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(tmp_path / "c"), KERNELCRAFT_EVOLVE="0", KERNELCRAFT_LIB=LIB)
    mine = child(program(case, tmp_path / "kc.pt"), env)
    theirs = plain_run(program(case, tmp_path / "pt.pt", loaded=False), env)
    a, b = torch.load(tmp_path / "kc.pt"), torch.load(tmp_path / "pt.pt")
    assert torch.equal(a["loss"], b["loss"]) and torch.equal(a["grad"], b["grad"])
    assert mine["grad_fn"] == theirs["grad_fn"] != "KernelcraftCrossEntropyBackward"
    assert mine["hits"] == {"cross_entropy": 0, "cross_entropy_backward": 0}


def serve_pair(tmp_path, case, device="cpu", dtype="float32", autocast=False,
               search=("--generations", "1", "--mu", "2", "--lambda", "3")):
    """Searches the pair's two keys offline, then checks the user's call in a fresh process."""
    name, shape, args, _, _ = case
    short = SHORT[dtype]
    args = dict(args, upcast=True) if autocast else args
    both = lambda cache: [evolve(cache, op, shape, short, args, "cuda" if device == "cuda" else "cpu", search)
                          for op in ("cross_entropy", "cross_entropy_backward")]
    cache, states = search_pair(tmp_path, both, "kernelcraft::cross_entropy")
    assert states == {"kernelcraft::cross_entropy": "served", "kernelcraft::cross_entropy_backward": "served"}, states
    # The live check compares the first served calls with eager (its lse included).
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache), KERNELCRAFT_EVOLVE="0", KERNELCRAFT_LIB=LIB,
               KERNELCRAFT_SHADOW_CALLS="1")
    out = child(program(case, tmp_path / "kc.pt", calls=4, device=device, dtype=dtype, autocast=autocast), env)
    print(f"{name} {shape} {dtype}{' autocast' if autocast else ''}: {out}")
    assert out["grad_fn"] == "KernelcraftCrossEntropyBackward", out
    assert out["edges"] == ["AccumulateGrad"], out   # no log_softmax node: nothing logits-sized saved
    assert out["hits"]["cross_entropy"] >= 1 and out["hits"]["cross_entropy_backward"] >= 1, out
    # The loss is computed in fp32 (and, without autocast, rounded once to the logits' dtype).
    loss_eps = EPS["f32"] if autocast else EPS[short]
    assert out["loss_err"] <= 64 * loss_eps * max(1.0, out["loss_scale"]), out
    assert out["nograd_fn"] and out["nograd_err"] <= 64 * loss_eps * max(1.0, out["loss_scale"]), out
    assert out["grad_err"] <= 64 * EPS[short] * max(1.0, out["grad_scale"]), out
    if autocast:
        assert out["loss_dtype"] == "torch.float32", out   # what eager under autocast returns
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_searched_pair_serves_forward_and_backward(tmp_path, case):
    serve_pair(tmp_path, case)


def test_compile_traces_pytorchs_decomposition(tmp_path):
    """A compiled region runs PyTorch's code: tracing sees fake tensors, so the composite answers."""
    code = """
    import torch.nn.functional as F
    x = torch.randn(8, 20, requires_grad=True)
    t = torch.randint(0, 20, (8,))
    f = torch.compile(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.2), backend="aot_eager")
    y = f(x, t)
    y.backward()
    ref_x = x.detach().clone().requires_grad_(True)
    ref = F.cross_entropy(ref_x, t, label_smoothing=0.2)
    ref.backward()
    print(json.dumps({"same": bool(torch.allclose(y, ref)), "grad": bool(torch.allclose(x.grad, ref_x.grad)),
                      "graph": y.grad_fn.name()}))
    """
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(tmp_path / "c"), KERNELCRAFT_EVOLVE="0", KERNELCRAFT_LIB=LIB)
    out = child(code, env)
    assert out["same"] and out["grad"], out
    assert out["graph"] != "KernelcraftCrossEntropyBackward", out
