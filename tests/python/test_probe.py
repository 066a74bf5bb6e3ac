"""The serve probe (dispatcher/probe.h): the first calls of a kernel newly served in this process
run eager too, both timed here; a kernel that is not faster than eager where it runs is demoted to
eager for the rest of the process, with one log line and a count in status()."""
import json

import torch

from conftest import kc, kernel_source, status

# A correct relu that burns time per element: honest results, far slower than eager's relu.
# (volatile: the compiler may not drop the busy loop, whose result is otherwise unused)
SLOW = kernel_source("relu_cpu.cpp").replace(
    "      const float v = x[i];",
    "      const float v = x[i];\n      volatile float burn = v;\n      for (int k = 0; k < 64; ++k) burn = burn * 0.5f;")


def miss_key(x):
    before = set(kc.missed_keys())
    torch.relu(x)
    new = [k for k in kc.missed_keys() if k not in before and "aten::relu" in k]
    assert len(new) == 1, new
    return new[0]


def put(key, src):
    kc.put_kernel(key, src, kernel_source("relu_cpu.json"))


def test_a_kernel_slower_than_eager_here_is_demoted_and_results_stay_eager(fresh_cache):
    kc.configure(json.dumps({"serve_probe_calls": 4}))
    try:
        x = torch.randn(256, 1031)              # shapes of this file's own: keys no other test missed
        put(miss_key(x), SLOW)
        kc.reset_counters()
        want = torch.relu(x)                    # loads the kernel (eager answers)
        for _ in range(5):                      # 1 warm-up pair + 4 counted pairs
            torch.testing.assert_close(torch.relu(x), want, rtol=0, atol=0)
        c = status()["ops"]["relu"]
        assert c["probes"] == 5 and c["hits"] == 0, c
        assert c["demoted"] == 1, c
        for _ in range(3):                      # demoted: eager from now on, no more probing
            torch.testing.assert_close(torch.relu(x), want, rtol=0, atol=0)
        c = status()["ops"]["relu"]
        assert c["probes"] == 5 and c["hits"] == 0 and c["misses"] == 3, c
    finally:
        kc.configure(json.dumps({"serve_probe_calls": 0}))


def test_probe_off_serves_the_same_kernel(fresh_cache):
    x = torch.randn(256, 1033)
    put(miss_key(x), SLOW)
    kc.reset_counters()
    want = torch.relu(x)
    for _ in range(3):
        torch.testing.assert_close(torch.relu(x), want, rtol=0, atol=0)
    c = status()["ops"]["relu"]
    assert c["hits"] == 3 and c["probes"] == 0 and c["demoted"] == 0, c


def test_probe_calls_return_eagers_result_not_the_kernels(fresh_cache):
    """During probation the caller gets eager's output: a deliberately different kernel (a clamp at
    6) under a relu key is never seen while it is on probation."""
    kc.configure(json.dumps({"serve_probe_calls": 3}))
    try:
        x = torch.linspace(-10, 10, 8209)
        src = kernel_source("relu_cpu.cpp").replace("? v : 0.0f", "? (v > 6.0f ? 6.0f : v) : 0.0f")
        put(miss_key(x), src)
        torch.relu(x)                           # load
        for _ in range(4):
            assert torch.relu(x).max().item() == 10.0
    finally:
        kc.configure(json.dumps({"serve_probe_calls": 0}))
