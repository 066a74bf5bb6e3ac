"""Interception on the CPU key: every default op is caught, counted, and falls back bit-identically."""
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import kc, status

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def inputs(dtype):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(37, 64, generator=g, dtype=torch.float64).to(dtype)
    return {
        "contiguous": base,
        "transposed": base.t(),
        "sliced": base[:, 1::3],
        "offset": base.reshape(-1)[1:1 + 31 * 64].reshape(31, 64),
        "empty": base[:0],
        "scalar": base[0, 0].clone(),
        "with_nan": torch.where(base > 1.5, torch.full_like(base, float("nan")), base),
    }


def loss_targets(n, classes, ignore_index):
    """n class indices in [0, classes), every fifth one ignore_index."""
    t = (torch.arange(n) * 7) % classes
    t[3::5] = ignore_index
    return t


FORWARD = {
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=0 if x.dim() else -1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]) if x.dim() else x,
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "selu": F.selu,
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=10.0),
    "mish": F.mish,
    "cumsum": lambda x: torch.cumsum(x, dim=-1),
    "cumsum_dim0": lambda x: torch.cumsum(x, dim=0),
    "cumprod": lambda x: torch.cumprod(x, dim=-1),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, dim=-1),
    # (N, C) inputs: group and batch norm over the channels, 1d pooling of (C, L)
    "group_norm": lambda x: F.group_norm(x, 2) if x.dim() == 2 and x.shape[0] and x.shape[1] % 2 == 0 else x,
    "instance_norm": lambda x: F.instance_norm(x.unsqueeze(0)) if x.dim() == 2 and x.shape[1] > 1 else x,
    "batch_norm_eval": lambda x: F.batch_norm(x, torch.zeros(x.shape[1], dtype=x.dtype), torch.ones(
        x.shape[1], dtype=x.dtype), training=False) if x.dim() == 2 and x.shape[0] else x,
    "max_pool": lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True)[0] if x.dim() == 2 and x.shape[0] else x,
    "avg_pool": lambda x: F.avg_pool1d(x, 3, 2, 1) if x.dim() == 2 and x.shape[0] else x,
    # Reductions: the last dim, dim 0, every dim, keepdim, and the vector norm's orders
    "sum": lambda x: x.sum(-1),
    "sum_all": lambda x: x.sum(),
    "mean_dim0": lambda x: x.mean(0, keepdim=True),
    "amax": lambda x: x.amax(-1) if x.numel() else x,
    "amin_dim0": lambda x: x.amin(0) if x.numel() else x,
    "argmax": lambda x: x.argmax(-1) if x.numel() else x,
    "argmin_all": lambda x: x.argmin() if x.numel() else x,
    "var": lambda x: x.var(-1),
    "std_dim0": lambda x: x.std(0, correction=0),
    "var_mean": lambda x: torch.stack(torch.var_mean(x, -1)),
    "std_mean": lambda x: torch.stack(torch.std_mean(x, dim=None, keepdim=True)),
    "norm2": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf")) if x.numel() else x,
    "norm3": lambda x: torch.linalg.vector_norm(x, 3, dim=0),
    # max.dim / min.dim (values and indices, NaN and ties as eager) and prod.dim_int
    "max_dim": lambda x: x.max(-1).values,
    "max_dim_indices": lambda x: x.max(-1, keepdim=True).indices,
    "min_dim0": lambda x: torch.stack([t.to(torch.float64) for t in x.min(0)]) if x.numel() else x,
    "prod": lambda x: x.prod(-1),
    "prod_dim0_f64": lambda x: x.prod(0, dtype=torch.float64),
    # 1d adaptive pooling reaches _adaptive_avg_pool2d (a 1x1 output would be a mean instead)
    "adaptive_avg_pool": lambda x: F.adaptive_avg_pool1d(x, 5) if x.dim() == 2 and x.shape[0] else x,
    # Losses: each reduction, weights, ignored targets (every fifth), nll over (N, C) and as 2d.
    "mse_loss": lambda x: F.mse_loss(x, torch.cos(x)),
    "mse_loss_none": lambda x: F.mse_loss(x, torch.cos(x), reduction="none"),
    "smooth_l1_loss": lambda x: F.smooth_l1_loss(x, 2 * torch.sin(x), reduction="sum", beta=0.5),
    "huber_loss": lambda x: F.huber_loss(x, torch.cos(x), reduction="none", delta=0.7),
    "bce": lambda x: F.binary_cross_entropy(torch.sigmoid(x).nan_to_num(0.5), torch.sigmoid(-x).nan_to_num(0.5).round()),
    "bce_weight_sum": lambda x: F.binary_cross_entropy(torch.sigmoid(x).nan_to_num(0.5), torch.sigmoid(-x).nan_to_num(0.5),
                                                       weight=torch.cos(x).abs(), reduction="sum"),
    # bce with logits: pos_weight along the last dim, a weight of self's sizes (its own
    # CompositeExplicitAutograd function is the fallback: ops.def)
    "bce_with_logits": lambda x: F.binary_cross_entropy_with_logits(
        x, torch.sigmoid(-x).nan_to_num(0.5), pos_weight=torch.linspace(0.5, 2, x.shape[-1], dtype=x.dtype))
    if x.dim() else F.binary_cross_entropy_with_logits(x, torch.sigmoid(x)),
    "bce_with_logits_none": lambda x: F.binary_cross_entropy_with_logits(x, torch.sigmoid(2 * x), weight=torch.cos(x),
                                                                         reduction="none"),
    "nll_loss": lambda x: F.nll_loss(x, loss_targets(x.shape[0], x.shape[1], -100)) if x.dim() == 2 and x.shape[0] else x,
    "nll_loss_weight": lambda x: F.nll_loss(x, loss_targets(x.shape[0], x.shape[1], 2), ignore_index=2, reduction="sum",
                                            weight=torch.linspace(0.5, 2, x.shape[1], dtype=x.dtype))
    if x.dim() == 2 and x.shape[0] else x,
    "nll_loss2d": lambda x: F.nll_loss(x.unsqueeze(0).unsqueeze(-1), loss_targets(x.shape[1], x.shape[0], -100).reshape(1, -1, 1),
                                       reduction="none") if x.dim() == 2 and x.shape[0] else x,
    # Embedding backward: x as grad_output [n, D] into 7 rows, row 3 (every fifth index) padding.
    "embedding_backward": lambda x: torch.ops.aten.embedding_dense_backward(x, loss_targets(x.shape[0], 7, 3), 7, 3, True)
    if x.dim() == 2 and x.shape[0] else x,
}
# Ops and dtypes eager itself does not implement on the CPU.
UNSUPPORTED = {("logcumsumexp", torch.float16), ("avg_pool", torch.float16)}


def eager(fn, x):
    kc.disable()
    try:
        return fn(x)
    finally:
        kc.enable()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", FORWARD)
def test_fallback_is_bit_identical(fresh_cache, name, dtype):
    fn = FORWARD[name]
    if (name, dtype) in UNSUPPORTED:
        pytest.skip(f"eager has no CPU {name} for {dtype}")
    for label, x in inputs(dtype).items():
        if name in ("softmax", "log_softmax", "layer_norm") and dtype in (torch.float16,) and label == "scalar":
            continue
        want = eager(fn, x)
        got = fn(x)
        assert got.dtype == want.dtype and got.shape == want.shape, label
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=f"{name}/{label}")


def test_calls_are_counted(fresh_cache):
    x = torch.randn(8, 16)
    torch.relu(x)
    torch.relu(x)
    torch.softmax(x, dim=1)
    F.layer_norm(x, (16,))
    s = status()
    assert s["ops"]["relu"]["misses"] == 2
    assert s["ops"]["softmax"]["misses"] == 1
    assert s["ops"]["layer_norm"]["misses"] == 1
    assert s["total"]["calls"] == 4
    assert s["ops"]["relu"]["intercepted"] is True
    # one key per distinct call signature
    keys = kc.missed_keys()
    assert any("aten::relu" in k for k in keys)
    assert any("aten::native_layer_norm" in k for k in keys)


def test_a_composite_eager_intercepts_nothing_inside(fresh_cache):
    """logsumexp's and bce_with_logits' eager (CompositeExplicitAutograd) call intercepted ops
    (amax, sum, ...). A miss of theirs must count and record only their own key: the inner keys
    would be searched for nothing, since a served op never reaches them."""
    before = set(kc.missed_keys())   # the process's, since it started
    x = torch.randn(8, 16)
    y = torch.logsumexp(x, 1)
    loss = F.binary_cross_entropy_with_logits(x, torch.rand(8, 16))
    assert torch.equal(y, torch.ops.aten.logsumexp.default(x, [1]))
    assert torch.isfinite(loss)
    s = status()
    assert s["ops"]["logsumexp"]["misses"] >= 1 and s["ops"]["bce_with_logits"]["misses"] == 1
    assert s["ops"]["amax"]["misses"] == 0 and s["ops"]["sum"]["misses"] == 0, s["ops"]
    ops = sorted({k.split("|")[2] for k in set(kc.missed_keys()) - before})
    assert set(ops) <= {"aten::binary_cross_entropy_with_logits", "aten::logsumexp"}, ops


def test_loss_backward_composites_are_caught_as_one_op(fresh_cache):
    """smooth_l1_loss_backward and huber_loss_backward have no CPU kernel (CompositeExplicitAutograd):
    caught at the CPU key, each call is one miss of its own key, and eager's answer is kept bit for
    bit, at the branch edges too (d = 0 with beta 0, where CPU eager gives -grad, d = +-beta, NaN)."""
    before = set(kc.missed_keys())
    x = torch.tensor([0.0, 0.5, -0.5, float("nan"), 2.0, -3.0, 1e-30, -0.0] * 3)
    t = torch.zeros_like(x)
    g = torch.tensor(0.75)
    calls = [lambda: torch.ops.aten.smooth_l1_loss_backward(g, x, t, 1, 0.5),
             lambda: torch.ops.aten.smooth_l1_loss_backward(g, x, t, 2, 0.0),
             lambda: torch.ops.aten.huber_loss_backward(torch.ones_like(x), x, t, 0, 0.5)]
    got = [f() for f in calls]
    s = status()
    assert s["ops"]["smooth_l1_loss_backward"]["misses"] == 2 and s["ops"]["huber_loss_backward"]["misses"] == 1
    ops = sorted({k.split("|")[2] for k in set(kc.missed_keys()) - before})
    assert ops == ["aten::huber_loss_backward", "aten::smooth_l1_loss_backward"], ops
    assert got[1][0].item() == -0.75   # beta 0, d = 0: the vectorized CPU kernel's -1
    want = [eager(lambda _, f=f: f(), None) for f in calls]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_max_pool_values_are_caught_only_without_a_gradient(fresh_cache):
    """aten::max_pool1d / 2d / 3d (no return_indices) are caught above autograd as their values
    alone when no gradient is wanted: one miss of max_pool*_values and none of the
    max_pool*_with_indices their composite calls inside. With a gradient wanted, the composite runs
    as PyTorch's (its with_indices call intercepted as ever) and backward gives eager's gradient."""
    before = set(kc.missed_keys())
    x = torch.randn(2, 3, 9, 11)
    x[0, 0, 1, 1] = float("nan")
    v3 = torch.randn(2, 2, 5, 6, 7)
    x1 = torch.randn(2, 3, 20)
    got = [F.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, (2, 3), 1, 0, dilation=2, ceil_mode=True),
           F.max_pool3d(v3, 3, 2, 1), F.max_pool1d(x1, 4, 1, 2, dilation=2)]
    with torch.no_grad():
        got.append(F.max_pool2d(x.clone().requires_grad_(), 3, 2, 1))
    s = status()   # max_pool1d is a 2d pool over a one-high plane
    assert s["ops"]["max_pool2d_values"]["misses"] == 4 and s["ops"]["max_pool3d_values"]["misses"] == 1
    assert s["ops"]["max_pool2d"]["misses"] == 0 and s["ops"]["max_pool3d"]["misses"] == 0, s["ops"]
    new = set(kc.missed_keys()) - before
    ops = sorted({k.split("|")[2] for k in new})
    assert ops == ["kernelcraft::max_pool2d", "kernelcraft::max_pool3d"], ops
    # Every key carries its input and window (max_pool1d's once lost them: its helper call
    # resolved to std::bind); max_pool1d's is the 2d window over the one-high plane.
    assert all("|self=T:" in k and "|ceil_mode=b:" in k for k in new), new
    assert any("f32[2,3,1,20]" in k and "kernel_size=L:[1,4]" in k and "dilation=L:[1,2]" in k for k in new), new
    want = [eager(lambda t: F.max_pool2d(t, 3, 2, 1), x),
            eager(lambda t: F.max_pool2d(t, (2, 3), 1, 0, dilation=2, ceil_mode=True), x),
            eager(lambda t: F.max_pool3d(t, 3, 2, 1), v3), eager(lambda t: F.max_pool1d(t, 4, 1, 2, dilation=2), x1),
            eager(lambda t: F.max_pool2d(t, 3, 2, 1), x)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)

    xg = x.clone().requires_grad_()
    y = F.max_pool2d(xg, 3, 2, 1)
    assert y.grad_fn is not None
    y.sum().backward()
    assert status()["ops"]["max_pool2d"]["misses"] == 1
    xe = x.clone().requires_grad_()
    eager(lambda t: F.max_pool2d(t, 3, 2, 1).sum().backward(), xe)
    torch.testing.assert_close(xg.grad, xe.grad, rtol=0, atol=0)


def test_disable_some_ops(fresh_cache):
    x = torch.randn(4, 4)
    kc.disable(["relu"])
    torch.relu(x)
    torch.sigmoid(x)
    s = status()
    assert s["ops"]["relu"]["misses"] == 0 and s["ops"]["relu"]["intercepted"] is False
    assert s["ops"]["sigmoid"]["misses"] == 1
    kc.enable(["relu"])
    torch.relu(x)
    assert status()["ops"]["relu"]["misses"] == 1


def test_unknown_op_is_a_user_error(fresh_cache):
    with pytest.raises(RuntimeError, match="unknown op"):
        kc.disable(["not_an_op"])


def test_out_and_inplace_variants_still_work(fresh_cache):
    x = torch.randn(10, 10)
    out = torch.empty(10, 10)
    torch.sigmoid(x, out=out)
    torch.testing.assert_close(out, eager(torch.sigmoid, x), rtol=0, atol=0)
    y = x.clone()
    torch.relu_(y)
    torch.testing.assert_close(y, eager(torch.relu, x), rtol=0, atol=0)


def test_integer_and_bool_inputs_fall_back(fresh_cache):
    x = torch.arange(-5, 5)
    torch.testing.assert_close(torch.relu(x), eager(torch.relu, x), rtol=0, atol=0)


def test_status_is_json_with_cache_path(fresh_cache):
    s = status()
    assert s["cache"]["dir"] == str(fresh_cache)
    assert s["cache"]["state"] in ("missing", "open", "not opened")
    assert set(s["total"]) >= {"hits", "misses", "fallbacks", "calls"}


def test_configure_rejects_bad_json(fresh_cache):
    with pytest.raises(RuntimeError):
        kc.configure("{not json")
    with pytest.raises(RuntimeError):
        kc.configure(json.dumps({"no_such_setting": 1}))
    # still working afterwards
    torch.relu(torch.randn(3))
    assert status()["ops"]["relu"]["misses"] == 1


def test_batch_norm_training_updates_running_stats_as_eager(fresh_cache):
    """Training batch norm updates its running statistics in place: intercepted (a miss), the
    update still happens, exactly as eager's."""
    torch.manual_seed(0)
    x = torch.randn(8, 5, 6, 7)
    got_m, got_v = torch.zeros(5), torch.ones(5)
    y = F.batch_norm(x, got_m, got_v, training=True, momentum=0.3)
    assert status()["ops"]["batch_norm"]["misses"] >= 1
    want_m, want_v = torch.zeros(5), torch.ones(5)
    want = eager(lambda t: F.batch_norm(t, want_m, want_v, training=True, momentum=0.3), x)
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    torch.testing.assert_close(got_m, want_m, rtol=0, atol=0)
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=0)
    assert not torch.equal(got_m, torch.zeros(5))


def test_every_operator_is_intercepted_at_load():
    """Every op of the table registers: none is refused because its schema has more tensor or
    scalar arguments than a call binds (dispatcher/call.h), or a name the table does not match."""
    ops = json.loads(kc.status())["ops"]
    assert len(ops) == len(json.loads(kc.config())["ops"])
    assert [n for n, o in ops.items() if not o["intercepted"]] == []
