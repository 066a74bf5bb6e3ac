"""The cases of benchmarks/model_shapes.py: layers of well-known models and single-operator
benchmark sizes (CASES), and how each call is built (OPS). The runner is model_shapes.py."""
from collections import namedtuple
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


MODES = ("fwd", "fwd+bwd")


def label(case):
    """The table's call column: the op and its keyword arguments."""
    args = ", ".join(f"{k}={v}" for k, v in case.args.items())
    return f"{case.call}({args})" if args else case.call


@dataclass
class Case:
    model: str
    call: str                 # a key of OPS
    shape: tuple              # the op builder's sizes (OPS says what each means where not obvious)
    keep: tuple = ()          # dims a smoke run shrinks last: reduced or structural ones
    args: dict = field(default_factory=dict)   # keyword arguments of the call
    dtypes: tuple = ("float32", "bfloat16")


GPT2, LLAMA, VIT, RN50, UNET, VIDEO, KB = ("GPT-2 small", "Llama-3 8B", "ViT-B/16", "ResNet-50",
                                           "SD U-Net", "3D video", "single-op")
RN50_BN = [(32, 64, 112, 112), (32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14), (32, 2048, 7, 7)]

CASES = [
    # GPT-2 small: batch 8, seq 1024, hidden 768, 12 heads, vocabulary 50257
    Case(GPT2, "layer_norm", (8, 1024, 768), (-1,)),
    Case(GPT2, "softmax", (8, 12, 1024, 1024), (-1,), dict(dim=-1)),
    Case(GPT2, "gelu", (8, 1024, 3072), args=dict(approximate="tanh")),
    Case(GPT2, "cross_entropy", (8192, 50257), (1,)),
    Case(GPT2, "embedding_dense_backward", (8192, 768, 50257)),
    # Llama-3 8B: batch 4, seq 2048, hidden 4096, FFN 14336, 32 heads, vocabulary 128256
    Case(LLAMA, "rms_norm", (4, 2048, 4096), (-1,)),
    Case(LLAMA, "silu", (4, 2048, 14336)),
    Case(LLAMA, "softmax", (1, 32, 2048, 2048), (-1,), dict(dim=-1)),   # batch 4 is 2 GiB a tensor
    Case(LLAMA, "cross_entropy", (8192, 128256), (1,), dtypes=("bfloat16",)),   # fp32: 4 GiB a tensor
    # ViT-B/16: batch 64, 197 tokens, hidden 768, 12 heads, MLP 3072
    Case(VIT, "layer_norm", (64, 197, 768), (-1,)),
    Case(VIT, "gelu", (64, 197, 3072)),
    Case(VIT, "softmax", (64, 12, 197, 197), (-1,), dict(dim=-1)),
    # ResNet-50, batch 32: the batch norm of each stage, training and eval
    *[Case(RN50, "batch_norm", s, (0, 2, 3), dict(training=t)) for s in RN50_BN for t in (True, False)],
    Case(RN50, "relu", (32, 256, 56, 56)),
    Case(RN50, "max_pool2d", (32, 64, 112, 112), args=dict(kernel_size=3, stride=2, padding=1)),
    Case(RN50, "adaptive_avg_pool2d", (32, 2048, 7, 7), (2, 3), dict(output_size=1)),
    # F.adaptive_avg_pool2d(x, 1) is a mean in eager; the aten op itself takes the global kernel
    Case(RN50, "_adaptive_avg_pool2d", (32, 2048, 7, 7), (2, 3), dict(output_size=[1, 1])),
    # Stable Diffusion U-Net, batch 8 at 64x64 latents: group norm with 32 groups, silu
    Case(UNET, "group_norm", (8, 320, 64, 64), (1,), dict(groups=32)),
    Case(UNET, "group_norm", (8, 640, 32, 32), (1,), dict(groups=32)),
    Case(UNET, "group_norm", (8, 1280, 16, 16), (1,), dict(groups=32)),
    Case(UNET, "silu", (8, 320, 64, 64)),
    # 3D U-Net / C3D: the first pooling of a 16-frame 112x112 clip
    Case(VIDEO, "max_pool3d", (8, 64, 16, 112, 112), args=dict(kernel_size=2, stride=2)),
    Case(VIDEO, "avg_pool3d", (8, 64, 16, 112, 112), args=dict(kernel_size=2, stride=2)),
    # Scans and reductions at LLM and CNN sizes
    Case("scans", "cumsum", (8, 4096 * 64), (-1,), dict(dim=-1)),
    Case("scans", "cumsum", (4096, 4096), (0,), dict(dim=0)),
    Case("reductions", "sum", (8, 1024, 4096), (-1,), dict(dim=-1)),
    Case("reductions", "mean", (8, 1024, 4096), (-1,), dict(dim=-1)),
    Case("reductions", "amax", (8, 1024, 4096), (-1,), dict(dim=-1)),
    Case("reductions", "var_mean", (32, 256, 56, 56), (0, 2, 3), dict(dim=(0, 2, 3))),
    Case("reductions", "logsumexp", (8192, 50257), (-1,), dict(dim=-1)),
    # Single-operator benchmark sizes (memory-bound, eager well over 50 us): norms at 256 MiB,
    # 3D pooling, long scans, activations
    Case(KB, "instance_norm", (16, 64, 256, 256), (0, 1)),
    Case(KB, "batch_norm", (16, 64, 256, 256), (0, 2, 3), dict(training=True)),
    Case(KB, "group_norm", (16, 64, 256, 256), (1,), dict(groups=8)),
    Case(KB, "max_pool3d", (16, 32, 64, 64, 64), args=dict(kernel_size=3, stride=2, padding=1, dilation=3)),
    Case(KB, "avg_pool3d", (16, 32, 64, 64, 64), args=dict(kernel_size=3, stride=2, padding=1)),
    Case(KB, "avg_pool2d", (16, 64, 256, 256), args=dict(kernel_size=3, stride=1, padding=1)),
    # Stride-1 max pooling: forward without a gradient is served as the values alone (no indices)
    Case(KB, "max_pool2d", (16, 32, 256, 256), args=dict(kernel_size=4, stride=1, padding=1)),
    Case(KB, "max_pool1d", (64, 192, 16384), args=dict(kernel_size=8, stride=1, padding=4, dilation=3)),
    Case(KB, "cumsum", (128, 4096 * 64), (-1,), dict(dim=1)),
    Case(KB, "cumsum", (32768, 1024), (0,), dict(dim=0)),
    Case(KB, "cumprod", (128, 4096 * 64), (-1,), dict(dim=1)),
    *[Case(KB, a, (16, 1024, 4096)) for a in ("leaky_relu", "elu", "softplus", "mish", "hardswish")],
    # Reductions over a middle dim (strided) and the last dim (rows), odd inner extents, 256 MiB
    *[Case(KB, r, (16, 4096, 1023), (1,), dict(dim=1)) for r in ("sum", "amax", "argmax", "argmin", "var", "std")],
    *[Case(KB, r, (16, 4096, 1023), (-1,), dict(dim=-1)) for r in ("mean", "amin", "argmax", "var_mean")],
    *[Case(KB, r, (16, 4096, 1023), (1,), dict(dim=1)) for r in ("max", "prod")],
    Case(KB, "min", (16, 4096, 1023), (-1,), dict(dim=-1)),
    # logsumexp: CompositeExplicitAutograd in eager (amax, sub, exp, sum, log, add)
    *[Case(KB, "logsumexp", (16, 4096, 1023), (d,), dict(dim=d)) for d in (1, -1)],
    Case(KB, "vector_norm", (16, 64, 256, 256), (0, 1, 2, 3)),   # Frobenius norm: every dim
    # Losses: nll over Llama-3's vocabulary for 4096 tokens (its log-probabilities as input), and
    # elementwise losses over 64 MiB of fp32, mean-reduced (eager: a map, then a reduction)
    Case(LLAMA, "nll_loss", (4096, 128256), (1,), dtypes=("bfloat16",)),
    *[Case(KB, a, (16, 1024, 1024)) for a in ("mse_loss", "smooth_l1_loss", "binary_cross_entropy", "bce_with_logits")],
    # KL divergence as nn.KLDivLoss(reduction="batchmean") calls it (aten::kl_div with a sum,
    # then a division in Python): log-probabilities against probabilities, 128 MiB a tensor
    Case(KB, "kl_div", (8192, 4096), (1,), dict(reduction="batchmean")),
]

# Single-operator benchmark scale (`--cases large`): 1-8 GiB a tensor, eager at 2-6 ms, the size
# class of public single-op kernel suites. Not in the table's default run: each key's search then
# moves gigabytes per input set (the gauntlet's fp64 references, its sanitizer replay's files), so
# this set checks that pre-warming finishes and serves at that scale, one family each.
BIG = "large"
LARGE = [
    Case(BIG, "sum", (128, 4096, 4095), (1,), dict(dim=1)),
    Case(BIG, "argmax", (128, 4096, 4095), (1,), dict(dim=1)),
    Case(BIG, "max_pool1d", (64, 192, 65536), args=dict(kernel_size=8, stride=1, padding=4, dilation=3)),
    Case(BIG, "cumsum", (32768, 32768), (1,), dict(dim=1)),
    Case(BIG, "batch_norm", (64, 64, 512, 512), (0, 2, 3), dict(training=True)),
    Case(BIG, "smooth_l1_loss", (32768, 32768)),
    Case(BIG, "max_pool3d", (16, 32, 128, 128, 128), args=dict(kernel_size=3, stride=2, padding=1, dilation=3)),
    Case(BIG, "group_norm", (112, 64, 512, 512), (1,), dict(groups=8)),
    Case(BIG, "softmax", (4096, 393216), (-1,), dict(dim=-1)),
]
CASE_SETS = {"models": CASES, "large": LARGE}

# build(shape, dtype, device, **args) -> (fn, inputs): fn(*inputs) is the call.
# grads: indices of the inputs a fwd+bwd run differentiates; none means no fwd+bwd mode.
# reads(inputs) -> bytes: what the call must read, where that is less than all of every input
# (None: all of it); the backward's re-read of its inputs counts the same.
Op = namedtuple("Op", "build grads reads", defaults=(None,))


def _randn(shape, dtype, device):
    return torch.randn(shape, dtype=dtype, device=device)


def _one(f):
    """An op of one input of the case's shape; the table's args are f's keyword arguments."""
    def build(shape, dtype, device, **args):
        return (lambda x: f(x, **args)), [_randn(shape, dtype, device)]
    return Op(build, (0,))


def _layer_norm(shape, dtype, device):
    h = shape[-1:]
    ins = [_randn(shape, dtype, device), _randn(h, dtype, device), _randn(h, dtype, device)]
    return (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b)), ins


def _rms_norm(shape, dtype, device):
    return (lambda x, w: F.rms_norm(x, x.shape[-1:], w)), [_randn(shape, dtype, device),
                                                           _randn(shape[-1:], dtype, device)]


def _group_norm(shape, dtype, device, groups):
    c = shape[1:2]
    ins = [_randn(shape, dtype, device), _randn(c, dtype, device), _randn(c, dtype, device)]
    return (lambda x, w, b: F.group_norm(x, groups, w, b)), ins


def _batch_norm(shape, dtype, device, training):
    c = shape[1:2]
    # Parameters and running statistics in the input's dtype, as in a model cast with .to(dtype).
    ins = [_randn(shape, dtype, device), _randn(c, dtype, device), _randn(c, dtype, device),
           torch.zeros(c, dtype=dtype, device=device), torch.ones(c, dtype=dtype, device=device)]
    return (lambda x, w, b, mean, var: F.batch_norm(x, mean, var, w, b, training)), ins


def _cross_entropy(shape, dtype, device):
    n, classes = shape
    return F.cross_entropy, [_randn(shape, dtype, device), torch.randint(classes, (n,), device=device)]


def _nll_loss(shape, dtype, device):
    n, classes = shape
    return F.nll_loss, [_randn(shape, dtype, device), torch.randint(classes, (n,), device=device)]


def _nll_reads(ins):
    """nll_loss reads one element of each row, so one 32-byte DRAM sector a row, and the targets."""
    x, target = ins
    return x.shape[0] * 32 + target.numel() * target.element_size()


def _pair_loss(f, probs=False, logits=False):
    """A loss of self and a target of the case's shape (probs: both in (0, 1), for bce; logits:
    self any value and the target in (0, 1), for bce with logits)."""
    def build(shape, dtype, device, **args):
        x, t = _randn(shape, dtype, device), _randn(shape, dtype, device)
        if probs:
            x, t = torch.sigmoid(x), torch.sigmoid(t)
        if logits:
            t = torch.sigmoid(t)
        return (lambda a, b: f(a, b, **args)), [x, t]
    return Op(build, (0,))


def _kl_div(shape, dtype, device, reduction):
    x = torch.log_softmax(_randn(shape, torch.float32, device), -1).to(dtype)
    t = torch.softmax(_randn(shape, torch.float32, device), -1).to(dtype)
    return (lambda a, b: F.kl_div(a, b, reduction=reduction)), [x, t]


def _embedding_backward(shape, dtype, device):
    """shape = (tokens, hidden, rows): the gradient of `tokens` looked-up rows of a (rows, hidden)
    table, as the backward of nn.Embedding calls it."""
    tokens, hidden, rows = shape
    ins = [_randn((tokens, hidden), dtype, device), torch.randint(rows, (tokens,), device=device)]
    return (lambda g, idx: torch.ops.aten.embedding_dense_backward(g, idx, rows, -1, False)), ins


OPS = {
    "layer_norm": Op(_layer_norm, (0, 1, 2)),
    "rms_norm": Op(_rms_norm, (0, 1)),
    "group_norm": Op(_group_norm, (0, 1, 2)),
    "batch_norm": Op(_batch_norm, (0, 1, 2)),
    "cross_entropy": Op(_cross_entropy, (0,)),
    "embedding_dense_backward": Op(_embedding_backward, ()),   # itself a backward: fwd only
    "softmax": _one(torch.softmax), "gelu": _one(F.gelu), "silu": _one(F.silu), "relu": _one(F.relu),
    "max_pool2d": _one(F.max_pool2d), "adaptive_avg_pool2d": _one(F.adaptive_avg_pool2d),
    "_adaptive_avg_pool2d": _one(torch.ops.aten._adaptive_avg_pool2d),
    "max_pool3d": _one(F.max_pool3d), "max_pool1d": _one(F.max_pool1d), "avg_pool3d": _one(F.avg_pool3d),
    "instance_norm": _one(F.instance_norm), "avg_pool2d": _one(F.avg_pool2d), "cumprod": _one(torch.cumprod),
    "leaky_relu": _one(F.leaky_relu), "elu": _one(F.elu), "softplus": _one(F.softplus), "mish": _one(F.mish),
    "hardswish": _one(F.hardswish),
    "cumsum": _one(torch.cumsum), "sum": _one(torch.sum), "mean": _one(torch.mean),
    "amax": _one(torch.amax), "var_mean": _one(torch.var_mean), "logsumexp": _one(torch.logsumexp),
    "amin": _one(torch.amin), "argmax": Op(_one(torch.argmax).build, ()),
    "argmin": Op(_one(torch.argmin).build, ()), "var": _one(torch.var),
    "std": _one(torch.std), "vector_norm": _one(torch.linalg.vector_norm),
    # torch.max / torch.min over a dim: values and indices (max.dim / min.dim); timed as one call
    "max": Op(_one(lambda x, dim: torch.max(x, dim)).build, ()),
    "min": Op(_one(lambda x, dim: torch.min(x, dim)).build, ()), "prod": _one(torch.prod),
    "nll_loss": Op(_nll_loss, (0,), _nll_reads), "mse_loss": _pair_loss(F.mse_loss), "smooth_l1_loss": _pair_loss(F.smooth_l1_loss),
    "binary_cross_entropy": _pair_loss(F.binary_cross_entropy, probs=True),
    "bce_with_logits": _pair_loss(F.binary_cross_entropy_with_logits, logits=True),
    "kl_div": Op(_kl_div, (0,)),
}
