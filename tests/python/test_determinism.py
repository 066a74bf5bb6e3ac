"""PyTorch's determinism switch (torch.use_deterministic_algorithms) and the deterministic_only
setting: only kernels the gauntlet recorded as bitwise deterministic are served; the rest run eager."""
import json

import pytest
import torch

from conftest import kc, kernel_source, status

RELU_SRC, RELU_SPEC = kernel_source("relu_cpu.cpp"), kernel_source("relu_cpu.json")


def miss_key(x):
    before = set(kc.missed_keys())
    torch.relu(x)
    new = [k for k in kc.missed_keys() if k not in before and "aten::relu" in k]
    assert len(new) == 1, new
    return new[0]


@pytest.fixture
def deterministic():
    def on(flag):
        torch.use_deterministic_algorithms(flag)
    yield on
    torch.use_deterministic_algorithms(False)


def hits_after(x, n=3):
    kc.reset_counters()
    for _ in range(n):
        assert torch.equal(torch.relu(x), x.clamp_min(0))
    return status()["ops"]["relu"]


def test_a_kernel_not_recorded_deterministic_runs_eager_under_the_switch(fresh_cache, deterministic):
    x = torch.randn(211, 13)
    summary = json.loads(kc.put_kernel(miss_key(x), RELU_SRC, RELU_SPEC))   # by hand: never observed
    assert summary["determinism"] == "unknown"
    torch.relu(x)   # loads
    deterministic(True)
    c = hits_after(x)
    assert c["hits"] == 0 and c["nondeterministic"] == 3 and status()["determinism_required"], c
    deterministic(False)
    assert hits_after(x)["hits"] == 3
    kc.configure(json.dumps({"deterministic_only": True}))   # the same without torch's switch
    try:
        c = hits_after(x)
        assert c["hits"] == 0 and c["nondeterministic"] == 3, c
    finally:
        kc.configure(json.dumps({"deterministic_only": False}))


def test_a_kernel_the_gauntlet_saw_bitwise_deterministic_is_served_under_the_switch(fresh_cache, deterministic):
    x = torch.randn(223, 13)
    summary = json.loads(kc.put_kernel(miss_key(x), RELU_SRC, RELU_SPEC, verify=True))
    assert summary["determinism"] == "bitwise"
    assert len(summary["budget"]) == 1 and summary["budget"][0] > 0
    torch.relu(x)   # loads
    deterministic(True)
    c = hits_after(x)
    assert c["hits"] == 3 and c["nondeterministic"] == 0, c
