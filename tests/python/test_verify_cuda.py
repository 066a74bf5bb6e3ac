"""Verification's trust mechanisms on a real GPU (skipped without one): the key's alignment class on
the device, a bundle of CUDA records rebuilt by NVRTC on import and checked against its hashes, and
the evaluation child under evolve_sandbox=all (the seccomp filter with the CUDA driver inside)."""
import json
import os
import subprocess

import pytest
import torch

from conftest import CLI, ROOT, kc, kernel_source, status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

KERNELS = ROOT / "examples" / "kernels"
CORPUS = ROOT / "tests" / "corpus" / "cuda"

# relu by aligned float4 loads and stores: right only where x and out start on 16 bytes, which the
# kernel takes for granted (a misaligned float4 access faults on the device).
VEC4_RELU = r"""
extern "C" __global__ void kc_relu_v4(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i + 4 <= n) {
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    float4 r;
    r.x = (v.x > 0.0f || v.x != v.x) ? v.x : 0.0f;
    r.y = (v.y > 0.0f || v.y != v.y) ? v.y : 0.0f;
    r.z = (v.z > 0.0f || v.z != v.z) ? v.z : 0.0f;
    r.w = (v.w > 0.0f || v.w != v.w) ? v.w : 0.0f;
    *reinterpret_cast<float4*>(out + i) = r;
  } else {
    for (long long j = i; j < n; ++j) out[j] = (x[j] > 0.0f || x[j] != x[j]) ? x[j] : 0.0f;
  }
}
"""
VEC4_LAUNCH = json.dumps({"version": 1, "launches": [
    {"entry": "kc_relu_v4", "grid": ["ceil_div(numel(self), 1024)", 1, 1], "block": [256, 1, 1],
     "smem": 0, "args": ["ptr:out0", "ptr:self", "i64:numel(self)"]}]})


def key_of(x):
    before = set(kc.missed_keys())
    torch.relu(x)
    new = [k for k in kc.missed_keys() if k not in before and "aten::relu" in k]
    assert len(new) == 1, new
    return new[0]


def cli(*args, env=None, timeout=300):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return r.returncode, r.stdout, r.stderr


def test_a_vec4_kernel_is_rejected_under_an_offset_key_and_passes_under_an_aligned_one(fresh_cache):
    base = torch.randn(4096 * 5 + 3 + 1, device="cuda")
    view = base[1:]
    assert view.data_ptr() % 16 == 4
    with pytest.raises(RuntimeError, match="rejected at"):
        kc.put_kernel(key_of(view), VEC4_RELU, VEC4_LAUNCH, verify=True)
    x = torch.randn(4096 * 5 + 7, device="cuda")
    assert x.data_ptr() % 16 == 0
    summary = json.loads(kc.put_kernel(key_of(x), VEC4_RELU, VEC4_LAUNCH, verify=True))
    assert summary["meta"]["provenance"]["verified"] is True
    torch.relu(x)                                   # loads the record
    assert torch.equal(torch.relu(x), x.clamp_min(0))
    assert status()["ops"]["relu"]["hits"] >= 1


def test_a_signed_cuda_bundle_is_rebuilt_on_import_and_served(fresh_cache, tmp_path):
    x = torch.randn(777, 35, device="cuda")
    key = key_of(x)
    src, launch = KERNELS / "relu_cuda.cu", KERNELS / "relu_cuda.json"
    rc, out, err = cli("--cache-dir", tmp_path / "a", "cache", "put", "--key", key, "--source", src,
                       "--launch", launch, "--verify")
    assert rc == 0, out + err
    assert cli("keygen", "--out", tmp_path / "keys")[0] == 0
    bundle = tmp_path / "relu.kcb"
    rc, out, err = cli("--cache-dir", tmp_path / "a", "cache", "export", bundle, "--sign",
                       tmp_path / "keys" / "bundle-signing.key")
    assert rc == 0, out + err
    rc, out, err = cli("--cache-dir", tmp_path / "b", "--json", "cache", "import", bundle, "--trust",
                       tmp_path / "keys" / "bundle-signing.pub")
    assert rc == 0, out + err
    j = json.loads(out)
    assert j["imported"] == 1 and j["rejected"] == 0, j
    # Unsigned, the verified claim is earned again on this GPU by the whole gauntlet.
    rc, out, err = cli("--cache-dir", tmp_path / "c", "--json", "cache", "import", bundle, "--reverify")
    assert rc == 0, out + err
    assert json.loads(out)["imported"] == 1
    kc.configure(json.dumps({"cache_dir": str(tmp_path / "b")}))
    kc.reset_counters()
    torch.relu(x)
    assert torch.equal(torch.relu(x), x.clamp_min(0))
    assert status()["ops"]["relu"]["hits"] >= 1


@pytest.mark.parametrize("name,expect_rc", [("honest_softmax_warp", 0), ("d01_oob_tail", 1), ("d03_smem_race", 1)])
def test_cuda_verification_under_the_full_sandbox(tmp_path, name, expect_rc):
    entry = next(e for e in json.loads((ROOT / "tests" / "corpus" / "manifest.json").read_text())
                 if e["name"] == name)
    shape = "x".join(str(d) for d in entry["shapes"][0])
    rc, out, err = cli("--cache-dir", tmp_path / "c", "verify", "--op", entry["op"], "--shape", shape,
                       "--source", CORPUS / (name + ".cu"), "--launch", CORPUS / (name + ".json"),
                       "--backend", "cuda", "--json", env={"KERNELCRAFT_EVOLVE_SANDBOX": "all"}, timeout=600)
    assert rc == expect_rc, out[-3000:] + err[-3000:]
    verdict = json.loads(out)
    assert verdict["stage"] != "sandbox", verdict["summary"]   # what CUDA itself does is not a violation
    if expect_rc == 1:
        assert verdict["stage"] in ("numerics", "sanitizer"), verdict["summary"]
