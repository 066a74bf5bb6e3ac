"""A kernel put into the cache for a key is served for that key only, and its result is used."""
import json
import subprocess
import time

import pytest
import torch

from conftest import CLI, kc, kernel_source, run_python, status


def relu_key(x):
    kc.reset_counters()
    before = set(kc.missed_keys())
    torch.relu(x)
    new = [k for k in kc.missed_keys() if k not in before and "aten::relu" in k]
    assert len(new) == 1, new
    return new[0]


def put_relu(key):
    summary = json.loads(kc.put_kernel(key, kernel_source("relu_cpu.cpp"), kernel_source("relu_cpu.json")))
    assert summary["backend"] == "cpu" and summary["blob"]["bytes"] > 0
    return summary


def test_inserted_kernel_is_served_for_its_key_only(fresh_cache):
    x = torch.randn(1000, 37)
    key = relu_key(x)
    put_relu(key)
    kc.reset_counters()
    first = torch.relu(x)          # loads the kernel (this call runs eager)
    assert status()["ops"]["relu"]["fallbacks"] == 1
    for _ in range(3):
        y = torch.relu(x)
        torch.testing.assert_close(y, first, rtol=0, atol=0)
    s = status()
    assert s["ops"]["relu"]["hits"] == 3
    assert s["cache"]["loaded_kernels"] == 1
    # other shapes, strides, dtypes miss
    kc.reset_counters()
    torch.relu(torch.randn(1000, 38))
    torch.relu(x.t())
    torch.relu(x.double())
    torch.relu(x[:, 1:])
    s = status()
    assert s["ops"]["relu"]["hits"] == 0 and s["ops"]["relu"]["misses"] == 4


def test_served_result_is_the_kernels(fresh_cache):
    """Proof that the served path runs the stored kernel and not eager: a deliberately different
    kernel (relu6-like clamp) is put under a relu key; with serve_unverified on (as in these tests)
    the library serves what the cache holds."""
    x = torch.linspace(-10, 10, 4096)
    key = relu_key(x)
    src = kernel_source("relu_cpu.cpp").replace("? v : 0.0f", "? (v > 6.0f ? 6.0f : v) : 0.0f")
    kc.put_kernel(key, src, kernel_source("relu_cpu.json"))
    torch.relu(x)   # load
    y = torch.relu(x)
    assert status()["ops"]["relu"]["hits"] == 1
    assert y.max().item() == 6.0
    kc.disable(["relu"])
    assert torch.relu(x).max().item() == 10.0
    kc.enable(["relu"])


def test_unverified_records_are_not_served_by_default(fresh_cache, capfd):
    """put_kernel skips the gauntlet. With serve_unverified off (the default; these tests turn it on
    for the serving mechanics) the wrong relu6-like kernel below is never launched: eager answers,
    and one line says why and what to do."""
    kc.configure(json.dumps({"serve_unverified": False}))
    try:
        x = torch.linspace(-10, 10, 4099)   # a key no other test in this process has missed
        key = relu_key(x)
        src = kernel_source("relu_cpu.cpp").replace("? v : 0.0f", "? (v > 6.0f ? 6.0f : v) : 0.0f")
        kc.put_kernel(key, src, kernel_source("relu_cpu.json"))
        kc.reset_counters()
        for _ in range(3):
            assert torch.relu(x).max().item() == 10.0
        assert status()["ops"]["relu"]["hits"] == 0
        err = capfd.readouterr().err
        assert err.count("stored without verification") == 1, err
        assert "cache put --verify" in err
    finally:
        kc.configure(json.dumps({"serve_unverified": True}))
    # The default really is off.
    r = run_python("torch.ops.load_library(LIB); print(json.loads(torch.ops.kernelcraft.config())['serve_unverified'])",
                   env={"KERNELCRAFT_SERVE_UNVERIFIED": ""})
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_put_kernel_with_verify_runs_the_gauntlet_first(fresh_cache):
    """verify=True stores only what passes the gauntlet (run by the CLI in a child process), and
    such a record is served under the default policy."""
    kc.configure(json.dumps({"serve_unverified": False}))
    try:
        x = torch.randn(301, 7)
        key = relu_key(x)
        wrong = kernel_source("relu_cpu.cpp").replace("? v : 0.0f", "? v : 0.5f * v")
        with pytest.raises(RuntimeError, match="rejected at numerics"):
            kc.put_kernel(key, wrong, kernel_source("relu_cpu.json"), verify=True)
        torch.relu(x)
        assert status()["ops"]["relu"]["misses"] == 2, "nothing was stored for the rejected kernel"
        summary = json.loads(kc.put_kernel(key, kernel_source("relu_cpu.cpp"), kernel_source("relu_cpu.json"),
                                           verify=True))
        assert summary["meta"]["provenance"]["verified"] is True
        assert summary["meta"]["verification"]["stages"][-1]["name"] == "sanitizer"
        kc.reset_counters()
        torch.relu(x)   # loads
        y = torch.relu(x)
        assert status()["ops"]["relu"]["hits"] == 1
        assert torch.equal(y, x.clamp_min(0))
    finally:
        kc.configure(json.dumps({"serve_unverified": True}))


def test_broken_record_falls_back_with_one_line(fresh_cache, capfd):
    x = torch.randn(64)
    key = relu_key(x)
    spec = json.loads(kernel_source("relu_cpu.json"))
    spec["launches"][0]["entry"] = "no_such_symbol"
    kc.put_kernel(key, kernel_source("relu_cpu.cpp"), json.dumps(spec))
    for _ in range(3):
        torch.testing.assert_close(torch.relu(x), x.clamp_min(0), rtol=0, atol=0)
    err = capfd.readouterr().err
    assert err.count("kernel disabled") == 1
    assert status()["ops"]["relu"]["hits"] == 0


def test_put_kernel_rejects_bad_input(fresh_cache):
    x = torch.randn(8)
    key = relu_key(x)
    with pytest.raises(RuntimeError, match="compile"):
        kc.put_kernel(key, "this is not C++", kernel_source("relu_cpu.json"))
    with pytest.raises(RuntimeError):
        kc.put_kernel("not-a-key", kernel_source("relu_cpu.cpp"), kernel_source("relu_cpu.json"))
    with pytest.raises(RuntimeError):
        kc.put_kernel(key, kernel_source("relu_cpu.cpp"), "{}")


def test_a_removed_record_stops_being_served_while_every_call_hits(fresh_cache):
    """`kernelcraft cache rm` reaches a running process within a few catch-up intervals (50 ms in
    the tests) though no call misses to prompt a catch-up: before, 371 of 371 calls kept hitting."""
    x = torch.randn(640, 3)
    key = relu_key(x)
    put_relu(key)
    torch.relu(x)                  # loads it
    kc.reset_counters()
    torch.relu(x)
    assert status()["ops"]["relu"]["hits"] == 1
    r = subprocess.run([CLI, "--cache-dir", str(fresh_cache), "cache", "rm", key], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    t0, calls = time.time(), 0
    kc.reset_counters()
    while status()["ops"]["relu"]["misses"] == 0 and time.time() - t0 < 5:
        torch.testing.assert_close(torch.relu(x), x.clamp_min(0), rtol=0, atol=0)
        calls += 1
        time.sleep(0.002)
    assert status()["ops"]["relu"]["misses"] == 1, (calls, status()["ops"]["relu"])
    assert time.time() - t0 < 2, "removal took longer than a few catch-up intervals"
    kc.reset_counters()
    for _ in range(5):
        torch.relu(x)
    s = status()["ops"]["relu"]
    assert (s["hits"], s["misses"], s["fallbacks"]) == (0, 5, 0), s
