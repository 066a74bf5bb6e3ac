"""The key's alignment class is honoured by verification: a kernel that assumes more alignment
than its key gives (aligned 16-byte vector loads on an offset view) is rejected, and the same
kernel passes under a key whose tensors really are 16-byte aligned."""
import json

import pytest
import torch

from conftest import kc, kernel_source

# relu with aligned 16-byte vector loads and stores (movaps): right only when x and out start on
# 16 bytes, which the kernel takes for granted.
ALIGNED_RELU = r"""
typedef float kc_v4 __attribute__((vector_size(16)));
extern "C" void kc_relu_f32(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  const kc_v4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    int64_t i = lo;
    for (; i + 4 <= hi; i += 4) {
      const kc_v4 v = *reinterpret_cast<const kc_v4*>(x + i);
      *reinterpret_cast<kc_v4*>(out + i) = ((v > zero) | (v != v)) ? v : zero;
    }
    for (; i < hi; ++i) out[i] = (x[i] > 0.0f || x[i] != x[i]) ? x[i] : 0.0f;
  }
}
"""


def key_of(x):
    before = set(kc.missed_keys())
    torch.relu(x)
    new = [k for k in kc.missed_keys() if k not in before and "aten::relu" in k]
    assert len(new) == 1, new
    return new[0]


def test_a_kernel_assuming_more_alignment_than_its_key_is_rejected(fresh_cache):
    base = torch.randn(4096 * 3 + 17 + 1)
    view = base[1:]                              # starts 4 bytes into a 64-byte aligned block
    assert view.data_ptr() % 16 == 4
    with pytest.raises(RuntimeError, match="rejected at (crash|sanitizer)"):
        kc.put_kernel(key_of(view), ALIGNED_RELU, kernel_source("relu_cpu.json"), verify=True)


def test_the_same_kernel_passes_where_the_key_is_16_byte_aligned(fresh_cache):
    x = torch.randn(4096 * 3 + 19)
    assert x.data_ptr() % 16 == 0
    summary = json.loads(kc.put_kernel(key_of(x), ALIGNED_RELU, kernel_source("relu_cpu.json"), verify=True))
    assert summary["meta"]["provenance"]["verified"] is True
