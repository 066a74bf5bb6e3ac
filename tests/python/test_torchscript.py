"""torch.ops.kernelcraft.* from TorchScript, and scripted models running through the interception."""
import json

import torch
import torch.nn.functional as F

from conftest import kc


@torch.jit.script
def scripted(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(torch.softmax(x, dim=-1))


@torch.jit.script
def scripted_status() -> str:
    torch.ops.kernelcraft.reset_counters()
    return torch.ops.kernelcraft.status()


def test_scripted_model_is_intercepted(fresh_cache):
    x = torch.randn(6, 7)
    kc.reset_counters()
    y = scripted(x)
    s = json.loads(kc.status())
    assert s["ops"]["softmax"]["misses"] == 1 and s["ops"]["gelu"]["misses"] == 1
    kc.disable()
    torch.testing.assert_close(y, scripted(x), rtol=0, atol=0)
    kc.enable()


def test_control_ops_from_torchscript(fresh_cache):
    torch.relu(torch.randn(3))
    s = json.loads(scripted_status())
    assert s["total"]["calls"] == 0
