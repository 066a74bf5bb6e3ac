"""Background evolution on the CUDA backend, on a real GPU (skipped without one): a miss is
evolved into a served, verified kernel; planted faulting / hanging / wrong candidates are
rejected in the worker's child and the user's process keeps running with correct results."""
import json
import subprocess

import pytest
import torch

from conftest import CLI
from test_evolution import child, evolve_env, records, search_state, wait_for_worker_exit

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

PROGRAM = """
    x = torch.randn(1000, 1027, device="cuda")          # odd sizes: tails everywhere
    expect = {op}(x)
    key = [k for k in kc.missed_keys() if 'aten::' in k][0]
    ok = kc.wait_for_evolution(500.0)
    for _ in range(3):
        y = {op}(x)
    torch.cuda.synchronize()
    s = json.loads(kc.status())["total"]
    print(json.dumps({{"key": key, "waited": ok, "hits": s["hits"],
                      "err": (y - expect).abs().max().item(), "alive": True}}))
"""


@pytest.mark.parametrize("op,ops", [("torch.relu", "relu"), ("torch.sigmoid", "sigmoid")])
def test_cuda_miss_is_evolved_verified_and_served(tmp_path, op, ops):
    cache = tmp_path / "c"
    out = child(PROGRAM.format(op=op), evolve_env(cache, KERNELCRAFT_OPS=ops))
    assert out["waited"]
    rec = records(cache)[out["key"]]
    assert rec["state"] in ("served", "eager_best")
    st = search_state(cache, out["key"])
    assert all(t["verdict"] == "passed" for t in st["tried"]), [t for t in st["tried"] if t["verdict"] != "passed"]
    if rec["state"] == "served":
        assert out["hits"] >= 1
        full = json.loads(subprocess.run([CLI, "--cache-dir", str(cache), "--json", "cache", "show", out["key"]],
                                         capture_output=True, text=True, check=True).stdout)
        stages = {s["name"]: s["outcome"] for s in full["meta"]["verification"]["stages"]}
        assert stages["sanitizer"] == "passed", full["meta"]["verification"]
        assert out["err"] <= 1e-6
    wait_for_worker_exit(cache)


def test_cuda_planted_candidates_are_contained(tmp_path):
    cache = tmp_path / "c"
    env = evolve_env(cache, KERNELCRAFT_OPS="relu", KERNELCRAFT_PLANTED="fault,hang,wrong",
                     KERNELCRAFT_EVOLVE_CANDIDATE_TIMEOUT_S=20, KERNELCRAFT_EVOLVE_GENERATIONS=1)
    out = child(PROGRAM.format(op="torch.relu"), env)
    assert out["alive"] and out["waited"]
    assert out["err"] == 0
    fam = {t["family"]: t for t in search_state(cache, out["key"])["tried"]}
    for f in ("cuda.planted_fault", "cuda.planted_hang", "cuda.planted_wrong"):
        print(f, fam[f]["verdict"], fam[f]["stage"], json.dumps(fam[f]["evidence"])[:600])
    assert fam["cuda.planted_fault"]["verdict"] in ("rejected", "crash")
    assert fam["cuda.planted_hang"]["verdict"] == "timeout", fam["cuda.planted_hang"]
    assert fam["cuda.planted_wrong"]["verdict"] == "rejected"
    rec = records(cache)[out["key"]]
    if rec["state"] == "served":
        full = json.loads(subprocess.run([CLI, "--cache-dir", str(cache), "--json", "cache", "show", out["key"]],
                                         capture_output=True, text=True, check=True).stdout)
        assert "planted" not in full["meta"]["candidate"]["family"]
    wait_for_worker_exit(cache)
