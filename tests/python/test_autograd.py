"""Training keeps working: forward and backward of a small block match eager exactly on a miss,
and the backward ops are intercepted as ops in their own right."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import kc, status


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.q = nn.Linear(d, d)

    def forward(self, x):
        h = self.ln(x)
        att = torch.softmax(self.q(h) @ h.transpose(-1, -2) / h.shape[-1] ** 0.5, dim=-1)
        h = att @ h
        h = self.fc2(F.gelu(self.fc1(h)))
        h = h + torch.tanh(h) * torch.sigmoid(h) + F.silu(h) + torch.relu(h)
        return F.log_softmax(h, dim=-1)


def run(model, x):
    model.zero_grad()
    out = model(x)
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_forward_backward_identical_to_eager(fresh_cache):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 10, 32)
    out, grads = run(model, x)
    s = status()
    for op in ["layer_norm", "softmax", "gelu", "tanh", "sigmoid", "silu", "relu", "log_softmax",
               "layer_norm_backward", "softmax_backward", "gelu_backward", "tanh_backward",
               "sigmoid_backward", "silu_backward", "relu_backward", "log_softmax_backward"]:
        assert s["ops"][op]["misses"] >= 1, op
    kc.disable()
    ref_out, ref_grads = run(model, x)
    kc.enable()
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_gradcheck_through_intercepted_ops(fresh_cache):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    f = lambda x, w, b: torch.softmax(F.gelu(F.layer_norm(x, (5,), w, b)), dim=-1)
    assert torch.autograd.gradcheck(f, (x, w, b))


def test_new_activation_and_norm_backward_identical_to_eager(fresh_cache):
    """The [5/7] backward operators (activations; group norm, pooling and scans run their own
    eager backward through autograd) are caught on a miss and change nothing."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 10, 10, requires_grad=True)

    def f(t):
        h = F.leaky_relu(t) + F.elu(t) + F.hardtanh(t) + F.hardsigmoid(t) + F.hardswish(t) + F.softplus(t)
        h = F.mish(F.group_norm(h, 3)) + torch.cumsum(t, dim=-1) * 1e-2
        return F.avg_pool2d(F.max_pool2d(h, 2), 2, ceil_mode=True)

    def grad():
        x.grad = None
        out = f(x)
        out.sum().backward()
        return out.detach(), x.grad.clone()

    out, g = grad()
    s = status()
    for op in ["leaky_relu_backward", "elu_backward", "hardtanh_backward", "hardsigmoid_backward",
               "hardswish_backward", "softplus_backward", "mish_backward", "group_norm", "cumsum",
               "max_pool2d", "avg_pool2d"]:
        assert s["ops"][op]["misses"] >= 1, op
    kc.disable()
    ref_out, ref_g = grad()
    kc.enable()
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(g, ref_g, rtol=0, atol=0)


def test_losses_identical_to_eager(fresh_cache):
    """The losses and their backward operators (smooth_l1 and huber's backward are not intercepted:
    README) are caught on a miss and change nothing, in values or gradients."""
    torch.manual_seed(0)
    x = torch.randn(12, 7, requires_grad=True)
    t = torch.randn(12, 7)
    cls = torch.tensor([0, 3, 6, -100, 2, 2, 5, 1, 0, 4, -100, 6])

    def f():
        h = F.mse_loss(x, t) + F.smooth_l1_loss(x, t, beta=0.5, reduction="sum") + F.huber_loss(x, t, delta=2.0)
        h = h + F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(t), weight=t.abs())
        h = h + F.nll_loss(F.log_softmax(x, dim=1), cls, weight=torch.linspace(0.5, 2, 7))
        return h + F.nll_loss(F.log_softmax(x, dim=1).t().contiguous().reshape(1, 7, 3, 4), cls.clamp(0).reshape(1, 3, 4),
                              reduction="sum")

    def grad():
        x.grad = None
        out = f()
        out.backward()
        return out.detach(), x.grad.clone()

    out, g = grad()
    s = status()
    for op in ["mse_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "nll_loss", "nll_loss2d",
               "mse_loss_backward", "binary_cross_entropy_backward", "nll_loss_backward", "nll_loss2d_backward"]:
        assert s["ops"][op]["misses"] >= 1, op
    kc.disable()
    ref_out, ref_g = grad()
    kc.enable()
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(g, ref_g, rtol=0, atol=0)
