"""The operator families of [5/7] end to end on a real GPU (skipped without one): for each op an
offline search (`kernelcraft evolve`) runs the whole gauntlet on the family's CUDA templates; some
template candidate must pass it, the key must end served or eager_best, and a served kernel must
give the fp64 answer within its dtype's budget to the user's own call in a fresh process
(test_families.serve_case). Prints the search's wall time and how many candidates were verified."""
import pytest
import torch
from test_families import serve_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

# (op, shape, dtype, args, a user call on tensor x)
CASES = [
    ("leaky_relu", "4096x4099", "bf16", {}, "F.leaky_relu(x)"),
    ("elu", "4096x4099", "bf16", {}, "F.elu(x)"),
    ("hardswish", "4096x4099", "f32", {}, "F.hardswish(x)"),
    ("softplus", "4096x4099", "bf16", {}, "F.softplus(x)"),
    ("mish", "4096x4099", "bf16", {}, "F.mish(x)"),
    ("mish_backward", "4096x4099", "bf16", {}, "torch.ops.aten.mish_backward(w(4099) * x, x)"),
    ("elu_backward", "4096x4099", "f32", {}, "torch.ops.aten.elu_backward(w(4099) * x, 1.0, 1.0, 1.0, False, x)"),
    ("cumsum", "128x65536", "f32", {"dim": 1}, "torch.cumsum(x, 1)"),
    ("cumsum", "8192x1024", "bf16", {"dim": 0}, "torch.cumsum(x, 0)"),
    ("group_norm", "8x320x64x64", "f32", {"group": 32}, "F.group_norm(x, 32, w(320), w(320, -1.0))"),
    ("batch_norm", "1x512x128x128", "f32", {"affine": False, "running": False},
     "F.batch_norm(x, None, None, training=True)"),
    ("max_pool2d", "16x64x128x128", "bf16", {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]},
     "F.max_pool2d(x, 3, 2, 1, return_indices=True)[0]"),
    ("avg_pool3d", "8x32x32x64x64", "f32", {"kernel_size": [3, 3, 3], "stride": [2, 2, 2], "padding": [1, 1, 1]},
     "F.avg_pool3d(x, 3, 2, 1)"),
    ("embedding_backward", "8192x768", "bf16", {"num_weights": 50257},
     "torch.ops.aten.embedding_dense_backward(x, idx(8192, 50257), 50257, -1, False)"),
    ("bce_with_logits", "32768x2048", "bf16", {"pos_weight": "last"},
     "F.binary_cross_entropy_with_logits(x, torch.sigmoid(x.flip(0)), pos_weight=w(2048))"),
    ("logsumexp", "64x2048x1023", "f32", {"dim": [1]}, "torch.logsumexp(x, 1)"),
    ("logsumexp", "4096x8192", "bf16", {"dim": [1]}, "torch.logsumexp(x, 1)"),
    ("var_mean", "32x256x56x56", "bf16", {"dim": [0, 2, 3], "correction": 1}, "torch.var_mean(x, (0, 2, 3))[0]"),
    # CompositeExplicitAutograd backward ops reached through autograd (eager: zeros_like, then a pass)
    ("smooth_l1_loss_backward", "4096x4099", "bf16", {"beta": 0.5},
     "torch.autograd.grad(F.smooth_l1_loss(l := x.detach().requires_grad_(), torch.sin(x), beta=0.5), l)[0]"),
    ("huber_loss_backward", "4096x4099", "f32", {"reduction": 2, "delta": 0.7},
     "torch.autograd.grad(F.huber_loss(l := x.detach().requires_grad_(), torch.cos(x), reduction='sum', delta=0.7), l)[0]"),
]


@pytest.mark.parametrize("op,shape,dtype,args,call", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_family_op_is_searched_verified_and_served(tmp_path, op, shape, dtype, args, call):
    serve_case(tmp_path, op, shape, dtype, args, call, "cuda")
