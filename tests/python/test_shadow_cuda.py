"""The live check and the determinism switch on a real GPU (skipped without one): the comparison runs
on the device; a kernel the gauntlet saw vary bit for bit is not served in deterministic mode."""
import json
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, kc, kernel_source, status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

CORPUS = ROOT / "tests" / "corpus" / "cuda"
WRONG_PAST_10 = kernel_source("relu_cuda.cu").replace("? v : 0.0f", "? (v > 10.0f ? 10.0f : v) : 0.0f")


def key_of(fn, x):
    before = set(kc.missed_keys())
    fn(x)
    new = [k for k in kc.missed_keys() if k not in before]
    assert len(new) == 1, new
    return new[0]


def test_live_check_on_the_device_catches_a_kernel_wrong_on_real_data(fresh_cache):
    kc.configure(json.dumps({"shadow_calls": 4, "shadow_every": 0}))
    try:
        small = torch.randn(4099, 33, device="cuda")
        real = torch.randn(4099, 33, device="cuda") * 30
        key = key_of(torch.relu, small)
        kc.put_kernel(key, WRONG_PAST_10, kernel_source("relu_cuda.json"))
        kc.reset_counters()
        torch.relu(small)                                  # loads
        assert torch.equal(torch.relu(small), small.clamp_min(0))
        y = torch.relu(real)
        assert torch.equal(y, real.clamp_min(0))           # eager's result
        c = status()["ops"]["relu"]
        assert c["shadow_checks"] == 2 and c["shadow_mismatches"] == 1 and c["hits"] == 1, c
        # Both checks were bounded by the comparison kernel stored beside the record (put_kernel
        # built it): no ATen kernel had to be loaded for them.
        assert status()["shadow"]["fused_outputs"] >= 2, status()["shadow"]
        assert (fresh_cache / "live-check").is_dir()
        deadline = time.time() + 20
        while status()["shadow"]["cache_writes"]["written"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        assert status()["shadow"]["cache_writes"]["written"] == 1, status()["shadow"]
    finally:
        kc.configure(json.dumps({"shadow_calls": 0, "shadow_every": 0}))


def test_a_kernel_recorded_varies_runs_eager_in_deterministic_mode(fresh_cache):
    x = torch.randn(512, 4096, device="cuda")
    w, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    ln = lambda t: F.layer_norm(t, (4096,), w, b)  # noqa: E731
    key = key_of(ln, x)
    src = (CORPUS / "honest_layer_norm_atomic.cu").read_text()
    spec = (CORPUS / "honest_layer_norm_atomic.json").read_text()
    summary = json.loads(kc.put_kernel(key, src, spec, verify=True))
    if summary["determinism"] != "varies":
        pytest.skip("the atomics happened to agree in all the gauntlet's repeats on this device")
    ln(x)   # loads
    kc.reset_counters()
    torch.use_deterministic_algorithms(True)
    try:
        ln(x)
        torch.cuda.synchronize()
        c = status()["ops"]["layer_norm"]
        assert c["hits"] == 0 and c["nondeterministic"] == 1, c
    finally:
        torch.use_deterministic_algorithms(False)
    ln(x)
    assert status()["ops"]["layer_norm"]["hits"] == 1
