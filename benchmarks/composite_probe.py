"""Which ATen operators F.rms_norm, nn.RMSNorm and F.cross_entropy reach on this torch and device,
with and without autocast, and which dispatch keys have kernels for the composites. The interception
level of the fused composites (docs/DESIGN.md) depends on these answers, which change between torch
releases.
    python3 benchmarks/composite_probe.py [--device cuda]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from eager_gaps import Reached  # noqa: E402  (records every aten operator a call reaches)


def trace(name, fn, autocast_dtype, device):
    ctx = torch.autocast(device, dtype=autocast_dtype) if autocast_dtype else torch.autocast(device, enabled=False)
    with ctx, Reached() as log:
        out = fn()
        out.sum().backward()
    print(f"{name} autocast={autocast_dtype}: {' '.join(log.ops)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    d = ap.parse_args().device
    print("torch", torch.__version__)
    for op in ["rms_norm", "_fused_rms_norm", "cross_entropy_loss", "log_softmax", "nll_loss"]:
        try:
            schema = getattr(torch.ops.aten, op).default._schema
        except (AttributeError, RuntimeError):
            print(op, "absent")
            continue
        keys = [k for k in ["CompositeImplicitAutograd", "CompositeExplicitAutograd", "Autograd",
                            "AutogradCUDA", "CUDA", "CPU", "AutocastCUDA", "AutocastCPU"]
                if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", k)]
        print(op, schema, "kernels:", keys)
    x = torch.randn(64, 4096, device=d, requires_grad=True)
    w = torch.ones(4096, device=d, requires_grad=True)
    logits = torch.randn(64, 32000, device=d, requires_grad=True)
    tgt = torch.randint(0, 32000, (64,), device=d)
    for ac in [None, torch.bfloat16]:
        trace("F.rms_norm", lambda: F.rms_norm(x, (4096,), w, 1e-6), ac, d)
        trace("F.rms_norm(no eps)", lambda: F.rms_norm(x, (4096,), w), ac, d)
        trace("F.cross_entropy", lambda: F.cross_entropy(logits, tgt), ac, d)
        trace("F.cross_entropy(smooth)", lambda: F.cross_entropy(logits, tgt, label_smoothing=0.1), ac, d)
        trace("F.cross_entropy(prob)", lambda: F.cross_entropy(logits, logits.detach().softmax(-1)), ac, d)


if __name__ == "__main__":
    main()
