"""A kernel that remembers its last result per input address: hidden from the source rules behind
a macro it is caught by the static check on the expanded source; declared in a way the rules do
not name it is caught by numerics, which refills the same input buffers with new values."""
import json

import pytest
import torch

from conftest import kc, kernel_source

MEMO_BODY = r"""
extern "C" void kc_relu_f32(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  DECLARE_MEMO
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    if (b < 64 && SEEN[b] == x) {            // same input address as last time: replay
      for (int64_t i = lo; i < hi; ++i) out[i] = MEMO[i];
      continue;
    }
    for (int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      out[i] = (v > 0.0f || v != v) ? v : 0.0f;
      if (i < 64 * 4096) MEMO[i] = out[i];
    }
    if (b < 64) SEEN[b] = x;
  }
}
"""

# The memo lives in function-local statics, spelled so that the raw source never says `static`.
MACRO_MEMO = MEMO_BODY.replace(
    "DECLARE_MEMO", "PERSISTENT const float* SEEN[64];\n  PERSISTENT float MEMO[64 * 4096];"
).replace('extern "C"', '#define PERSISTENT static\nextern "C"', 1)
PASTED_MEMO = MEMO_BODY.replace(
    "DECLARE_MEMO", "KEEP(sta, tic) const float* SEEN[64];\n  KEEP(sta, tic) float MEMO[64 * 4096];"
).replace('extern "C"', '#define KEEP(a, b) a##b\nextern "C"', 1)


def key_of(x):
    before = set(kc.missed_keys())
    torch.relu(x)
    new = [k for k in kc.missed_keys() if k not in before and "aten::relu" in k]
    assert len(new) == 1, new
    return new[0]


@pytest.mark.parametrize("source", [MACRO_MEMO, PASTED_MEMO], ids=["define", "token-paste"])
def test_a_memo_hidden_behind_a_macro_is_rejected_on_the_expanded_source(fresh_cache, source):
    x = torch.randn(4096 * 2 + 7 + (source is PASTED_MEMO))
    with pytest.raises(RuntimeError, match="rejected at static: after macro expansion: device-state"):
        kc.put_kernel(key_of(x), source, kernel_source("relu_cpu.json"), verify=True)


# A memo with no state of its own: it keeps each element's last input address and result in the
# launch's scratch buffer, which a served call may get back at the same address and uncleared.
# Nothing declares state, so no source rule sees it; only reusing buffers, scratch included, does.
SCRATCH_MEMO = r"""
extern "C" void kc_relu_f32(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const float** seen = KC_ARG(const float**, args, 3);
  float* memo = reinterpret_cast<float*>(seen + n);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      if (seen[i] == x) {
        out[i] = memo[i];
        continue;
      }
      const float v = x[i];
      out[i] = (v > 0.0f || v != v) ? v : 0.0f;
      memo[i] = out[i];
      seen[i] = x;
    }
  }
}
"""
SCRATCH_LAUNCH = json.dumps({"version": 1, "launches": [
    {"entry": "kc_relu_f32", "grid": ["ceil_div(numel(self), 4096)", 1, 1], "block": [4096, 1, 1],
     "smem": 0, "args": ["ptr:out0", "ptr:self", "i64:numel(self)", "ptr:memo"]}],
    "scratch": [{"name": "memo", "bytes": "12 * numel(self)"}]})


def test_a_memo_kept_in_scratch_is_rejected_when_buffers_are_reused(fresh_cache):
    x = torch.randn(4096 * 2 + 11)
    with pytest.raises(RuntimeError, match="rejected at numerics.*same buffers refilled"):
        kc.put_kernel(key_of(x), SCRATCH_MEMO, SCRATCH_LAUNCH, verify=True)
