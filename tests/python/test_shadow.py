"""The live check (dispatcher/shadow.h): served calls of a key, the first shadow_calls and then one in
shadow_every, also run eager on the same inputs; the outputs are compared within the record's budget.
A match returns the kernel's outputs untouched; a mismatch returns eager's, disables the record in the
cache for every process, with the evidence, and logs one line."""
import json
import subprocess
import time

import torch

from conftest import CLI, kc, kernel_source, run_python, status

RELU_SPEC = kernel_source("relu_cpu.json")
# Right where the generated data of a quick test lives (|x| < 10), wrong beyond: clamps at 10.
WRONG_PAST_10 = kernel_source("relu_cpu.cpp").replace("? v : 0.0f", "? (v > 10.0f ? 10.0f : v) : 0.0f")
# Differs from eager in the last bits, far inside any budget: proves whose outputs the caller gets.
SCALED = kernel_source("relu_cpu.cpp").replace("? v : 0.0f", "? v * 1.0000005f : 0.0f")


def miss_key(x):
    before = set(kc.missed_keys())
    torch.relu(x)
    new = [k for k in kc.missed_keys() if k not in before and "aten::relu" in k]
    assert len(new) == 1, new
    return new[0]


def shadow(calls, every):
    kc.configure(json.dumps({"shadow_calls": calls, "shadow_every": every}))


def cli(cache, *args):
    r = subprocess.run([CLI, "--cache-dir", str(cache), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def wait_written(n, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        w = status()["shadow"]["cache_writes"]
        if w["written"] >= n and w["queued"] == 0:
            return w
        time.sleep(0.05)
    raise AssertionError(status()["shadow"])


def test_a_kernel_wrong_on_real_data_is_caught_disabled_everywhere_and_eager_answers(fresh_cache, capfd):
    shadow(4, 0)
    try:
        gen = torch.Generator().manual_seed(7)
        small = torch.randn(613, 29, generator=gen)          # what a quick test would feed it
        real = torch.randn(613, 29, generator=gen) * 30      # what the model really sees: same key
        key = miss_key(small)
        kc.put_kernel(key, WRONG_PAST_10, RELU_SPEC)
        kc.reset_counters()
        torch.relu(small)                                    # loads (eager answers)
        for _ in range(2):                                   # checked, and right here
            assert torch.equal(torch.relu(small), small.clamp_min(0))
        c = status()["ops"]["relu"]
        assert c["shadow_checks"] == 2 and c["shadow_mismatches"] == 0 and c["hits"] == 2, c
        y = torch.relu(real)                                 # checked: wrong, so eager's result
        assert torch.equal(y, real.clamp_min(0)) and y.max().item() > 10
        c = status()["ops"]["relu"]
        assert c["shadow_checks"] == 3 and c["shadow_mismatches"] == 1 and c["hits"] == 2, c
        for _ in range(3):                                   # disabled here: eager from now on
            assert torch.equal(torch.relu(real), real.clamp_min(0))
        assert status()["ops"]["relu"]["hits"] == 2
        err = capfd.readouterr().err
        assert err.count("live check: out0 differs from eager") == 1, err

        wait_written(1)
        rows = json.loads(cli(fresh_cache, "cache", "ls", "--json"))
        assert [(r["key"], r["state"], r.get("disabled_by")) for r in rows] == [(key, "disabled", "live check")]
        assert "disabled   live check" in cli(fresh_cache, "cache", "ls")
        shown = json.loads(cli(fresh_cache, "cache", "show", key, "--json"))
        ev = shown["meta"]["disabled"]
        assert ev["outputs"]["check"] == "error budget" and ev["outputs"]["error"] > ev["outputs"]["budget"]
        assert ev["inputs"]["self"]["abs_max"] > 10 and ev["inputs"]["self"]["sizes"] == [613, 29]
        assert json.loads(cli(fresh_cache, "cache", "stats", "--json"))["by_state"] == {"disabled": 1}

        # Another process never serves it: the stored record says disabled.
        r = run_python(f"""
torch.ops.load_library(LIB)
x = torch.randn(613, 29) * 30
ys = [torch.relu(x) for _ in range(4)]
s = json.loads(torch.ops.kernelcraft.status())["ops"]["relu"]
print(json.dumps({{"hits": s["hits"], "eager": all(torch.equal(y, x.clamp_min(0)) for y in ys)}}))
""", env={"KERNELCRAFT_CACHE_DIR": str(fresh_cache), "KERNELCRAFT_SHADOW_CALLS": "4"})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1]) == {"hits": 0, "eager": True}

        cli(fresh_cache, "cache", "rm", key)                 # rm still works on a disabled record
        assert json.loads(cli(fresh_cache, "cache", "ls", "--json")) == []
    finally:
        shadow(0, 0)


def test_a_process_that_only_hits_drops_a_kernel_another_process_disabled(fresh_cache):
    """The other direction: this process serves the kernel unchecked; another process's live check
    disables it in the cache; this process stops serving it at its next catch-up."""
    x = torch.randn(619, 29)
    key = miss_key(x)
    kc.put_kernel(key, WRONG_PAST_10, RELU_SPEC)
    torch.relu(x)
    kc.reset_counters()
    assert torch.equal(torch.relu(x), x.clamp_min(0)) and status()["ops"]["relu"]["hits"] == 1
    r = run_python("""
torch.ops.load_library(LIB)
torch.relu(torch.randn(619, 29))                  # loads
torch.relu(torch.randn(619, 29) * 30)             # checked: caught
""", env={"KERNELCRAFT_CACHE_DIR": str(fresh_cache), "KERNELCRAFT_SHADOW_CALLS": "4"})
    assert r.returncode == 0, r.stderr
    assert "live check: out0 differs from eager" in r.stderr
    deadline = time.time() + 10
    big = x * 30
    while time.time() < deadline:
        y = torch.relu(big)
        if torch.equal(y, big.clamp_min(0)):
            break
        time.sleep(0.05)
    assert torch.equal(torch.relu(big), big.clamp_min(0))
    kc.reset_counters()
    torch.relu(x)
    assert status()["ops"]["relu"]["hits"] == 0


def test_matching_outputs_are_the_kernels_untouched(fresh_cache):
    shadow(0, 1)   # every served call checked
    try:
        x = torch.randn(617, 29)
        key = miss_key(x)
        kc.put_kernel(key, SCALED, RELU_SPEC)
        torch.relu(x)   # loads
        kc.reset_counters()
        want = x.clamp_min(0) * torch.tensor(1.0000005, dtype=torch.float32)
        for _ in range(3):
            y = torch.relu(x)
            assert torch.equal(y, want), "the kernel's own result, not eager's"
            assert not torch.equal(y, x.clamp_min(0))
        c = status()["ops"]["relu"]
        assert c["hits"] == 3 and c["shadow_checks"] == 3 and c["shadow_mismatches"] == 0, c
    finally:
        shadow(0, 0)


def test_sampling_follows_the_first_n_then_one_in_m(fresh_cache):
    x = torch.randn(5, 31)
    key = miss_key(x)
    kc.put_kernel(key, kernel_source("relu_cpu.cpp"), RELU_SPEC)
    shadow(3, 0)
    try:
        torch.relu(x)   # loads
        kc.reset_counters()
        for _ in range(40):
            torch.relu(x)
        c = status()["ops"]["relu"]
        assert c["shadow_checks"] == 3 and c["hits"] == 40, c
        shadow(3, 10)   # the first three are behind us: one in ten on average from here
        kc.reset_counters()
        for _ in range(3000):
            torch.relu(x)
        c = status()["ops"]["relu"]
        assert 200 <= c["shadow_checks"] <= 400 and c["hits"] == 3000, c   # mean 300, sd 16
        shadow(0, 0)
        kc.reset_counters()
        for _ in range(50):
            torch.relu(x)
        assert status()["ops"]["relu"]["shadow_checks"] == 0
    finally:
        shadow(0, 0)


def test_defaults_and_readonly_turn_it_off(tmp_path):
    r = run_python("""
torch.ops.load_library(LIB)
print(json.dumps(json.loads(torch.ops.kernelcraft.status())["shadow"]))
""", env={"KERNELCRAFT_SHADOW_CALLS": "", "KERNELCRAFT_SHADOW_EVERY": "", "KERNELCRAFT_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert (s["calls"], s["every"]) == (4, 1000)
    r = run_python("""
torch.ops.load_library(LIB)
print(json.dumps(json.loads(torch.ops.kernelcraft.status())["shadow"]))
""", env={"KERNELCRAFT_SHADOW_CALLS": "4", "KERNELCRAFT_CACHE_READONLY": "1", "KERNELCRAFT_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert (s["calls"], s["every"]) == (0, 0)


def test_non_finite_values_count_where_eager_has_none_and_match_where_it_has_the_same(fresh_cache):
    shadow(0, 1)
    try:
        x = torch.randn(623, 29)
        x[0, 0], x[1, 1], x[2, 2] = float("inf"), float("-inf"), float("nan")
        key = miss_key(x)
        kc.put_kernel(key, kernel_source("relu_cpu.cpp"), RELU_SPEC)   # the exact relu: inf, 0, nan as eager
        torch.relu(x)   # loads
        kc.reset_counters()
        y = torch.relu(x)
        c = status()["ops"]["relu"]
        assert c["hits"] == 1 and c["shadow_mismatches"] == 0, c
        assert torch.equal(y.nan_to_num(), x.clamp_min(0).nan_to_num())

        z = torch.randn(627, 29)
        key = miss_key(z)
        nan_for_one = kernel_source("relu_cpu.cpp").replace("out[i] = ", "out[i] = i == 77 ? NAN : ")
        kc.put_kernel(key, nan_for_one, RELU_SPEC)
        torch.relu(z)   # loads
        kc.reset_counters()
        assert torch.equal(torch.relu(z), z.clamp_min(0))   # caught: eager's result
        c = status()["ops"]["relu"]
        assert c["shadow_mismatches"] == 1 and c["hits"] == 0, c
    finally:
        shadow(0, 0)
