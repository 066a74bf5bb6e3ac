"""Batch norm in training with running statistics (dispatcher/running_stats.h): keyed and served as
the statistics-free call, with eager's running-statistics update done after a served kernel, and
left to eager itself when eager answers."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import kc, status

# A plain CPU training batch norm for the stats-free key (one block per channel, fp64 sums), put
# by hand so the test does not depend on a search's outcome.
KERNEL = r"""
extern "C" void kc_bn_train(const kc_cpu_ctx* ctx, void* const* args) {
  float* y = KC_ARG(float*, args, 0);
  float* mean = KC_ARG(float*, args, 1);
  float* invstd = KC_ARG(float*, args, 2);
  const float* x = KC_ARG(const float*, args, 3);
  const float* w = KC_ARG(const float*, args, 4);
  const float* b = KC_ARG(const float*, args, 5);
  const int64_t n = KC_ARG(int64_t, args, 6), C = KC_ARG(int64_t, args, 7), hw = KC_ARG(int64_t, args, 8);
  const double eps = KC_ARG(double, args, 9);
  for (int64_t c = ctx->begin; c < ctx->end; ++c) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) s += x[(i * C + c) * hw + j];
    const double m = s / (double)(n * hw);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) { const double d = x[(i * C + c) * hw + j] - m; ss += d * d; }
    const double is = 1.0 / __builtin_sqrt(ss / (double)(n * hw) + eps);
    mean[c] = (float)m;
    invstd[c] = (float)is;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) {
        const int64_t k = (i * C + c) * hw + j;
        y[k] = (float)((x[k] - m) * is * w[c] + b[c]);
      }
  }
}
"""
SPEC = json.dumps({"version": 1, "launches": [{
    "entry": "kc_bn_train", "grid": ["size(input,1)", 1, 1], "block": [1, 1, 1], "smem": 0,
    "args": ["ptr:out0", "ptr:out1", "ptr:out2", "ptr:input", "ptr:weight", "ptr:bias", "i64:size(input,0)",
             "i64:size(input,1)", "i64:numel(input) / (size(input,0) * size(input,1))", "f64:eps"]}]})


def call(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3, eps=1e-5)


def eager(fn):
    kc.disable()
    try:
        return fn()
    finally:
        kc.enable()


def test_running_stats_are_updated_after_a_served_kernel_as_eager_does(fresh_cache):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 6, generator=g) * 2 + 0.5
    w, b = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
    before = set(kc.missed_keys())
    call(x, w, b, torch.zeros(3), torch.ones(3))
    new = [k for k in kc.missed_keys() if k not in before and "native_batch_norm" in k]
    # The key is the statistics-free call's: a training call with them is not a key of its own.
    assert len(new) == 1 and "running_mean=none" in new[0] and "running_var=none" in new[0], new
    kc.put_kernel(new[0], KERNEL, SPEC)

    got_m, got_v = torch.zeros(3), torch.ones(3)
    want_m, want_v = got_m.clone(), got_v.clone()
    kc.reset_counters()
    for _ in range(3):   # three steps, each update from the last: the first loads the record
        y = call(x, w, b, got_m, got_v)   # (eager answers it, updating), the others are served
        want = eager(lambda: call(x, w, b, want_m, want_v))
    assert status()["ops"]["batch_norm"]["hits"] == 2
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_m, want_m, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_v, want_v, rtol=1e-6, atol=1e-7)
    assert not torch.equal(got_v, torch.ones(3))

    # Without running statistics the same key serves, and nothing else is written.
    kc.reset_counters()
    F.batch_norm(x, None, None, w, b, training=True, momentum=0.3)   # momentum is part of the key
    assert status()["ops"]["batch_norm"]["hits"] == 1


def test_eager_answers_with_its_own_update_when_nothing_is_served(fresh_cache):
    """A miss runs eager once, with the statistics: updated once, bit for bit as eager's."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, 7, generator=g)
    got_m, got_v = torch.zeros(4), torch.ones(4)
    y = F.batch_norm(x, got_m, got_v, training=True, momentum=0.2)
    want_m, want_v = torch.zeros(4), torch.ones(4)
    want = eager(lambda: F.batch_norm(x, want_m, want_v, training=True, momentum=0.2))
    assert status()["ops"]["batch_norm"]["misses"] >= 1
    assert torch.equal(y, want) and torch.equal(got_m, want_m) and torch.equal(got_v, want_v)


def test_one_value_per_channel_is_left_to_eager(fresh_cache):
    """n = 1: eager's unbiased variance divides by zero; the call is eager's, statistics and all."""
    x = torch.randn(1, 3)
    got_m, got_v = torch.zeros(3), torch.ones(3)
    want_m, want_v = torch.zeros(3), torch.ones(3)
    torch.ops.aten.native_batch_norm(x, None, None, got_m, got_v, True, 0.1, 1e-5)
    eager(lambda: torch.ops.aten.native_batch_norm(x, None, None, want_m, want_v, True, 0.1, 1e-5))
    assert torch.equal(got_m, want_m) and torch.equal(got_v.nan_to_num(7.0), want_v.nan_to_num(7.0))


def backward_keys(before):
    return [k for k in kc.missed_keys() if k not in before and "native_batch_norm_backward" in k]


def test_training_backward_is_keyed_without_the_running_statistics_it_never_reads(fresh_cache):
    """native_batch_norm_backward in training: one key with or without running statistics; eval
    keeps them (it reads them). Every call here is a miss, answered by eager bit for bit."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, 5, generator=g)
    w, b = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
    for training, with_stats in [(True, True), (True, False), (False, True)]:
        before = set(kc.missed_keys())
        grads = []
        for on in [True, False]:
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            rm, rv = (torch.zeros(3), torch.ones(3)) if with_stats else (None, None)
            run = lambda: F.batch_norm(xx, rm, rv, ww, b, training=training).sum().backward()   # noqa: E731
            run() if on else eager(run)
            grads.append((xx.grad, ww.grad))
        assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
        keys = backward_keys(before)
        if training and not with_stats:
            assert keys == [], keys   # the same key as with statistics: already missed
            continue
        assert len(keys) == 1, keys
        assert ("running_mean=none" in keys[0]) == training, keys[0]


CUDA_KERNEL = r"""
extern "C" __global__ void kc_bn_train(float* y, float* mean, float* invstd, const float* x, const float* w,
                                       const float* b, long long n, long long C, long long hw, double eps) {
  __shared__ double part[256];
  const long long c = blockIdx.x, m = n * hw;
  double s = 0, q = 0;
  for (long long k = threadIdx.x; k < m; k += blockDim.x) s += x[(k / hw * C + c) * hw + k % hw];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) { if (threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o]; __syncthreads(); }
  const double mu = part[0] / (double)m;
  __syncthreads();
  for (long long k = threadIdx.x; k < m; k += blockDim.x) { double d = x[(k / hw * C + c) * hw + k % hw] - mu; q += d * d; }
  part[threadIdx.x] = q;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) { if (threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o]; __syncthreads(); }
  const double is = rsqrt(part[0] / (double)m + eps);
  if (threadIdx.x == 0) { mean[c] = (float)mu; invstd[c] = (float)is; }
  for (long long k = threadIdx.x; k < m; k += blockDim.x) {
    const long long e = (k / hw * C + c) * hw + k % hw;
    y[e] = (float)((x[e] - mu) * is * w[c] + b[c]);
  }
}
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_training_batch_norm_through_cudnn_is_served_with_its_update_and_gradients(fresh_cache):
    """fp32 nn.BatchNorm2d in training reaches cudnn_batch_norm (dispatcher/cudnn_batch_norm.cpp):
    served under native_batch_norm's statistics-free key, running statistics updated, and cuDNN's
    backward takes the served saved statistics: outputs, statistics and gradients as eager's."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(16).cuda()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-1, 1)
    ref = copy.deepcopy(bn)
    x = (torch.randn(4, 16, 9, 7, device="cuda") * 3 + 1).requires_grad_()
    before = set(kc.missed_keys())
    with torch.no_grad():
        bn(x)
    new = [k for k in kc.missed_keys() if k not in before and "native_batch_norm" in k]
    assert len(new) == 1 and "running_mean=none" in new[0], new
    spec = json.loads(SPEC)
    spec["launches"][0]["block"] = [256, 1, 1]
    kc.put_kernel(new[0], CUDA_KERNEL, json.dumps(spec))
    ref.running_mean.copy_(bn.running_mean), ref.running_var.copy_(bn.running_var)
    ref.num_batches_tracked.copy_(bn.num_batches_tracked)

    kc.reset_counters()
    g = torch.randn(4, 16, 9, 7, device="cuda")
    for _ in range(3):
        x.grad = None
        bn.zero_grad()
        y = bn(x)
        y.backward(g)
        gx, gw = x.grad.clone(), bn.weight.grad.clone()
        x.grad = None
        want = eager(lambda: ref(x))
        eager(lambda: want.backward(g))
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gw, ref.weight.grad, rtol=1e-4, atol=1e-4)
        ref.zero_grad()
    torch.cuda.synchronize()
    assert status()["ops"]["batch_norm"]["hits"] >= 2
    torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=1e-6, atol=1e-6)


# Training batch norm backward for one channel per block (fp64 sums): the key's inputs in order
# grad_out, input, weight, (running statistics absent), save_mean, save_invstd.
CUDA_BACKWARD = r"""
extern "C" __global__ void kc_bn_bwd(float* gx, float* gw, float* gb, const float* gy, const float* x,
                                     const float* w, const float* mean, const float* invstd, long long n,
                                     long long C, long long hw) {
  __shared__ double part[2][256];
  const long long c = blockIdx.x, m = n * hw;
  double s = 0, q = 0;
  for (long long k = threadIdx.x; k < m; k += blockDim.x) {
    const long long e = (k / hw * C + c) * hw + k % hw;
    s += gy[e];
    q += (double)gy[e] * (x[e] - mean[c]);
  }
  part[0][threadIdx.x] = s;
  part[1][threadIdx.x] = q;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if (threadIdx.x < o) { part[0][threadIdx.x] += part[0][threadIdx.x + o]; part[1][threadIdx.x] += part[1][threadIdx.x + o]; }
    __syncthreads();
  }
  const double sum = part[0][0], dot = part[1][0], is = invstd[c];
  if (threadIdx.x == 0) { gw[c] = (float)(dot * is); gb[c] = (float)sum; }
  for (long long k = threadIdx.x; k < m; k += blockDim.x) {
    const long long e = (k / hw * C + c) * hw + k % hw;
    const double xh = (x[e] - mean[c]) * is;
    gx[e] = (float)(w[c] * is * (gy[e] - sum / m - xh * dot * is / m));
  }
}
"""
BACKWARD_SPEC = json.dumps({"version": 1, "launches": [{
    "entry": "kc_bn_bwd", "grid": ["size(input,1)", 1, 1], "block": [256, 1, 1], "smem": 0,
    "args": ["ptr:out0", "ptr:out1", "ptr:out2", "ptr:grad_out", "ptr:input", "ptr:weight", "ptr:save_mean",
             "ptr:save_invstd", "i64:size(input,0)", "i64:size(input,1)",
             "i64:numel(input) / (size(input,0) * size(input,1))"]}]})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_training_backward_through_cudnn_is_served_under_the_native_key(fresh_cache):
    """fp32 training backward reaches cudnn_batch_norm_backward (dispatcher/cudnn_batch_norm.cpp):
    a miss is cuDNN's answer bit for bit; with a kernel on native_batch_norm_backward's key it is
    served, with eager's gradients."""
    torch.manual_seed(1)
    bn = torch.nn.BatchNorm2d(16).cuda()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-1, 1)
    # Not the shape of the test above, whose backward has missed this key already in this process.
    x = (torch.randn(5, 16, 9, 7, device="cuda") * 3 + 1).requires_grad_()
    g = torch.randn(5, 16, 9, 7, device="cuda")

    def grads():
        x.grad = None
        bn.zero_grad()
        bn(x).backward(g)
        return x.grad.clone(), bn.weight.grad.clone(), bn.bias.grad.clone()

    before = set(kc.missed_keys())
    missed = grads()
    want = eager(grads)
    assert all(torch.equal(a, b) for a, b in zip(missed, want))
    keys = backward_keys(before)
    assert len(keys) == 1 and "running_mean=none" in keys[0] and "|fp32|" in keys[0], keys
    kc.put_kernel(keys[0], CUDA_BACKWARD, BACKWARD_SPEC)
    kc.reset_counters()
    for _ in range(2):
        got = grads()
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.cuda.synchronize()
    assert status()["ops"]["batch_norm_backward"]["hits"] >= 1
