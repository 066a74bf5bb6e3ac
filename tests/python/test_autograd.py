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


def flat(r):
    """The tensors of a result: a tensor, or (nested) tuples and lists of them."""
    return [r] if isinstance(r, torch.Tensor) else [t for x in r for t in flat(x)]


def caught_and_eager(fn, ops):
    """Runs fn with the library on: each of `ops` must be a miss, and the tensors fn returns must be
    eager's (fn with the library off) bit for bit."""
    got = flat(fn())
    s = status()
    for op in ops:
        assert s["ops"][op]["misses"] >= 1, op
    kc.disable()
    try:
        want = flat(fn())
    finally:
        kc.enable()
    assert len(got) == len(want)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_forward_backward_identical_to_eager(fresh_cache):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 10, 32)
    caught_and_eager(lambda: run(model, x), ["layer_norm", "softmax", "gelu", "tanh", "sigmoid", "silu", "relu", "log_softmax",
               "layer_norm_backward", "softmax_backward", "gelu_backward", "tanh_backward",
               "sigmoid_backward", "silu_backward", "relu_backward", "log_softmax_backward"])


def test_gradcheck_through_intercepted_ops(fresh_cache):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    f = lambda x, w, b: torch.softmax(F.gelu(F.layer_norm(x, (5,), w, b)), dim=-1)
    assert torch.autograd.gradcheck(f, (x, w, b))


def test_new_activation_and_norm_backward_identical_to_eager(fresh_cache):
    """The [5/7] backward operators (activations, group norm's; pooling and scans run their own
    eager backward through autograd) are caught on a miss and change nothing."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 10, 10, requires_grad=True)

    def f(t):
        h = F.leaky_relu(t) + F.elu(t) + F.hardtanh(t) + F.hardsigmoid(t) + F.hardswish(t) + F.softplus(t)
        h = F.mish(F.group_norm(h, 3)) + torch.cumsum(t, dim=-1) * 1e-2
        h = F.avg_pool2d(F.max_pool2d(h, 2), 2, ceil_mode=True)
        r = t.sum(-1) + t.mean(-1) + t.amax(-1) + t.var(-1) + torch.linalg.vector_norm(t, dim=-1)
        r = r + t.max(-1).values - t.min(-1)[0] + t.prod(-1) * 1e-3
        return h + (torch.std_mean(r, dim=(1, 2), keepdim=True)[0].sum() + t.mean(1).sum()) * 1e-3

    def grad():
        x.grad = None
        out = f(x)
        out.sum().backward()
        return out.detach(), x.grad.clone()

    caught_and_eager(grad, ["leaky_relu_backward", "elu_backward", "hardtanh_backward", "hardsigmoid_backward",
               "hardswish_backward", "softplus_backward", "mish_backward", "group_norm", "group_norm_backward", "cumsum",
               "max_pool2d", "avg_pool2d", "sum", "mean", "amax", "var", "vector_norm", "std_mean", "max", "min",
               "prod"])


def test_pooling_backward_identical_to_eager(fresh_cache):
    """Pooling backward (max with overlapping windows, avg with count_include_pad off and a
    divisor, adaptive with non-divisible sizes, 2d and 3d) is caught on a miss and changes nothing."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11, requires_grad=True)
    v = torch.randn(2, 2, 5, 7, 6, requires_grad=True)

    def f(t, u):
        h = F.max_pool2d(t, 3, 2, 1) + F.avg_pool2d(t, 3, 2, 1, count_include_pad=False)
        h = F.adaptive_avg_pool2d(h, (2, 3)).sum() + F.avg_pool2d(t, 2, divisor_override=3).sum()
        w = F.max_pool3d(u, 3, 2, 1) + F.avg_pool3d(u, 3, 2, 1)
        return h + F.adaptive_avg_pool3d(w, (2, 3, 2)).sum() + F.avg_pool3d(u, 2, ceil_mode=True).sum()

    def grad():
        x.grad = v.grad = None
        out = f(x, v)
        out.backward()
        return out.detach(), x.grad.clone(), v.grad.clone()

    caught_and_eager(grad, ["max_pool2d_backward", "avg_pool2d_backward", "adaptive_avg_pool2d_backward",
               "max_pool3d_backward", "avg_pool3d_backward", "adaptive_avg_pool3d_backward",
               "adaptive_avg_pool2d", "adaptive_avg_pool3d"])


def test_losses_identical_to_eager(fresh_cache):
    """The losses and their backward operators (smooth_l1's and huber's backward have no CPU kernel,
    CompositeExplicitAutograd, and are caught at the CPU key all the same) are caught on a miss and
    change nothing, in values or gradients."""
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

    caught_and_eager(grad, ["mse_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "nll_loss", "nll_loss2d",
               "mse_loss_backward", "binary_cross_entropy_backward", "nll_loss_backward", "nll_loss2d_backward",
               "smooth_l1_loss_backward", "huber_loss_backward"])


def test_bce_with_logits_identical_to_eager(fresh_cache):
    """binary_cross_entropy_with_logits has no backend kernel (CompositeExplicitAutograd): caught at
    the CPU key below autograd, whose own derivative still gives the gradient; a miss changes
    nothing, in values or gradients."""
    torch.manual_seed(0)
    x = torch.randn(12, 7, requires_grad=True)
    t = torch.sigmoid(torch.randn(12, 7))

    def grad():
        x.grad = None
        out = F.binary_cross_entropy_with_logits(x, t, weight=t.abs(), pos_weight=torch.linspace(0.5, 2, 7))
        out = out + F.binary_cross_entropy_with_logits(x, t, reduction="none").sum()
        out.backward()
        return out.detach(), x.grad.clone()

    caught_and_eager(grad, ["bce_with_logits"])


def test_batch_norm_training_backward_falls_back_bit_identically(fresh_cache):
    """F.batch_norm in training on the CPU: native_batch_norm_backward is intercepted (a miss) and,
    with nothing served, its gradients are eager's bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 5)
    w, b = torch.randn(6), torch.randn(6)

    def grads():
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        torch.nn.functional.batch_norm(xs, None, None, ws, bs, training=True).pow(2).sum().backward()
        return [xs.grad, ws.grad, bs.grad]

    caught_and_eager(grads, ["batch_norm_backward"])


def test_group_norm_backward_falls_back_bit_identically(fresh_cache):
    """F.group_norm with a weight and bias on the CPU: native_group_norm_backward is intercepted (a
    miss) and, with nothing served, its three gradients are eager's bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 5)
    w, b = torch.randn(6), torch.randn(6)

    def grads():
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        F.group_norm(xs, 3, ws, bs).pow(2).sum().backward()
        return [xs.grad, ws.grad, bs.grad]

    caught_and_eager(grads, ["group_norm", "group_norm_backward"])
def test_embedding_backward_falls_back_bit_identically(fresh_cache):
    """nn.Embedding's backward on the CPU (dense gradients, padding_idx, scale_grad_by_freq):
    embedding_dense_backward is intercepted (a miss) and its gradient is eager's bit for bit."""
    torch.manual_seed(0)
    idx = torch.randint(0, 11, (3, 17))
    w = torch.randn(11, 8)

    def grads():
        out = []
        for scale in (False, True):
            ws = w.clone().requires_grad_()
            F.embedding(idx, ws, padding_idx=2, scale_grad_by_freq=scale).pow(2).sum().backward()
            out.append(ws.grad)
        return out

    caught_and_eager(grads, ["embedding_backward"])
