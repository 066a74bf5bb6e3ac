"""CUDA key, on a real GPU (skipped without one): serving, fallback, autograd, graphs, failures."""
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import kc, kernel_source, run_python, status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def key_of(fn, x):
    before = set(kc.missed_keys())
    fn(x)
    new = [k for k in kc.missed_keys() if k not in before]
    assert len(new) == 1, new
    return new[0]


def put_cuda_relu(key, spec=None):
    return json.loads(kc.put_kernel(key, kernel_source("relu_cuda.cu"), spec or kernel_source("relu_cuda.json")))


def eager(fn, *a):
    kc.disable()
    try:
        return fn(*a)
    finally:
        kc.enable()


def test_key_names_the_architecture(fresh_cache):
    x = torch.randn(1000, device="cuda")
    key = key_of(torch.relu, x)
    major, minor = torch.cuda.get_device_capability()
    assert f"|cuda-sm_{major}{minor}+" in key, key


def test_served_on_its_key_only(fresh_cache):
    x = torch.randn(4096, 33, device="cuda")
    key = key_of(torch.relu, x)
    summary = put_cuda_relu(key)
    assert summary["backend"] == "cuda" and summary["blob"]["bytes"] > 0
    kc.reset_counters()
    torch.relu(x)                      # loads
    for _ in range(5):
        y = torch.relu(x)
    torch.cuda.synchronize()
    s = status()
    assert s["ops"]["relu"]["hits"] == 5, s
    torch.testing.assert_close(y, eager(torch.relu, x), rtol=0, atol=0)
    kc.reset_counters()
    torch.relu(torch.randn(4096, 34, device="cuda"))
    torch.relu(x.t())
    torch.relu(x.double())
    torch.relu(x.half())
    torch.relu(x[:, 1:])
    torch.relu(x.cpu())                # another device kind
    assert status()["ops"]["relu"]["hits"] == 0
    assert status()["ops"]["relu"]["misses"] == 6


ALL = {
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: torch.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ALL)
def test_fallback_equals_eager(fresh_cache, name, dtype):
    x = torch.randn(67, 129, device="cuda", dtype=dtype)
    for v in (x, x.t(), x[:, 3:]):
        torch.testing.assert_close(ALL[name](v), eager(ALL[name], v), rtol=0, atol=0, equal_nan=True)


def test_autograd_on_cuda_matches_eager(fresh_cache):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64), torch.nn.SiLU(), torch.nn.Softmax(-1)).cuda()
    x = torch.randn(32, 64, device="cuda")

    def step():
        model.zero_grad()
        y = model(x)
        (y * torch.arange(64, device="cuda")).sum().backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()]

    y, g = step()
    assert status()["ops"]["layer_norm_backward"]["misses"] >= 1
    ry, rg = eager(step)
    torch.testing.assert_close(y, ry, rtol=0, atol=0)
    for a, b in zip(g, rg):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cuda_graph_capture_with_hit_and_miss(fresh_cache):
    x = torch.randn(8192, device="cuda")
    key = key_of(torch.relu, x)
    put_cuda_relu(key)
    torch.relu(x)                       # load outside capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.relu(x); torch.sigmoid(x)  # warm-up on the side stream as torch.cuda.graph wants
    torch.cuda.current_stream().wait_stream(s)
    kc.reset_counters()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.relu(x)               # hit: launched on the capturing stream
        z = torch.sigmoid(x)            # miss: eager inside capture
    c = status()["ops"]
    assert c["relu"]["hits"] == 1 and c["sigmoid"]["misses"] == 1
    x.copy_(torch.randn(8192, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x.clamp_min(0), rtol=0, atol=0)
    torch.testing.assert_close(z, eager(torch.sigmoid, x), rtol=0, atol=0)


def test_failed_launch_disables_and_falls_back(fresh_cache, capfd):
    x = torch.randn(5000, device="cuda")
    key = key_of(torch.relu, x)
    bad = json.loads(kernel_source("relu_cuda.json"))
    bad["launches"][0]["block"] = [2048, 1, 1]     # over the 1024-thread limit: the launch fails
    bad["launches"][0]["grid"] = ["ceil_div(numel(self), 2048)", 1, 1]
    put_cuda_relu(key, json.dumps(bad))
    for _ in range(4):
        torch.testing.assert_close(torch.relu(x), x.clamp_min(0), rtol=0, atol=0)
    assert status()["ops"]["relu"]["hits"] == 0
    assert "kernel disabled" in capfd.readouterr().err
    # the process and its CUDA context are fine afterwards
    torch.testing.assert_close(torch.softmax(x, 0).sum(), torch.tensor(1.0, device="cuda"))


def test_cache_write_close_reopen_in_cuda_process(tmp_path):
    """The RocksDB crash seen on the H200 happened at flush/close inside a CUDA-initialised torch
    process; write, close and reopen there, several times."""
    r = run_python(f"""
torch.ops.load_library(LIB)
kc = torch.ops.kernelcraft
src = open({str(kernel_source.__globals__['KERNELS'] / 'relu_cuda.cu')!r}).read()
spec = open({str(kernel_source.__globals__['KERNELS'] / 'relu_cuda.json')!r}).read()
torch.zeros(1, device='cuda'); torch.cuda.synchronize()
hits = []
for n in (100, 200, 300):
    x = torch.randn(n, device='cuda')
    kc.reset_counters()
    torch.relu(x)
    key = [k for k in kc.missed_keys() if '[%d]' % n in k][0]
    kc.put_kernel(key, src, spec)           # opens the writer, puts, closes (flush) each time
    torch.relu(x); y = torch.relu(x)
    hits.append(json.loads(kc.status())['ops']['relu']['hits'])
    assert torch.equal(y, x.clamp_min(0))
print(json.dumps(hits))
""", env={"KERNELCRAFT_CACHE_DIR": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [1, 1, 1]
