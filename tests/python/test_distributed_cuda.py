"""Job-wide coordination on one GPU (skipped without one): several torchrun ranks, each with a cache
of its own, share the device. One rank searches the key, every rank ends with the same record and
serves the winner from its own cache, within fp32's budget against fp64.

The call is a whole-sample layer norm, where eager's kernel is far from the memory floor (a served
kernel is the expected verdict on an H200), so "serves the winner" means kernel hits on every rank.
"""
import json
import subprocess
import sys

import pytest
import torch

from test_distributed import job_env, records, script, has_search_state, show
from test_evolution import wait_for_worker_exit

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

GPU_JOB = """
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(1, 64, 256, 256, device="cuda")
    ln = lambda: torch.nn.functional.layer_norm(x, x.shape[1:])
    ln()
    torch.cuda.synchronize()
    keys = sorted(k for k in kc.missed_keys() if "layer_norm" in k)
    ok = kc.wait_for_evolution(240.0)
    dist.barrier()
    for _ in range(40):   # past the serve probe's first calls
        y = ln()
    torch.cuda.synchronize()
    ref = torch.nn.functional.layer_norm(x.double(), x.shape[1:])
    out = {"rank": RANK, "keys": keys, "waited": ok, "job": job(), "err": (y.double() - ref).abs().max().item(),
           "ln": json.loads(kc.status())["ops"]["layer_norm"]}
    with open(os.path.join(os.environ["KC_TEST_BASE"], f"out{RANK}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("nproc", [3])
def test_ranks_sharing_a_gpu_search_once_and_all_serve(tmp_path, nproc):
    base = tmp_path / "job"
    base.mkdir()
    env = job_env(base, KERNELCRAFT_OPS="layer_norm", KERNELCRAFT_EVOLVE_LAMBDA=4)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                        str(script(tmp_path, GPU_JOB))], env=env, capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    outs = [json.loads((base / f"out{i}.json").read_text()) for i in range(nproc)]
    print(json.dumps(outs))
    keys = outs[0]["keys"]
    assert len(keys) == 1 and all(o["keys"] == keys for o in outs), [o["keys"] for o in outs]
    assert all(o["waited"] and o["job"]["state"] == "on" for o in outs), outs
    caches = [base / f"rank{i}" for i in range(nproc)]
    key = keys[0]
    assert len([c for c in caches if has_search_state(c, key)]) == 1, "searched more than once"
    states = [records(c)[key]["state"] for c in caches]
    assert states == ["served"] * nproc, states
    assert len({json.dumps(show(c, key).get("blob")) for c in caches}) == 1, "the rebuilt binaries differ"
    assert sum(o["job"]["claimed"] for o in outs) == 1 and sum(o["job"]["imported"] for o in outs) == nproc - 1
    for o in outs:
        assert o["ln"]["hits"] >= 1, o                      # the winner is served on every rank
        assert o["err"] <= 1e-4, o                          # fp32 against fp64, unit-variance rows
    for c in caches:
        wait_for_worker_exit(c)
