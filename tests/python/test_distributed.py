"""Job-wide coordination through a distributed job's c10d store (dispatcher/coordinator.h).

Ranks act as nodes: each has a cache directory of its own, so only the job's store connects them.
The torchrun tests start the job as users do (`python -m torch.distributed.run --standalone`,
gloo); the tests that kill a node or the store host the store themselves, as torchrun's agent
does, since torchrun tears the whole job down when one rank dies. Searches are tiny (lambda 2,
one generation) to stay fast on two cores.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import CLI, LIB
from test_evolution import evolve_env, records, wait_for_worker_exit

PRELUDE = textwrap.dedent(f"""
    import json, os, sys, time
    RANK = int(os.environ.get("RANK", "0"))
    os.environ["KERNELCRAFT_CACHE_DIR"] = os.path.join(os.environ["KC_TEST_BASE"], f"rank{{RANK}}")
    import torch
    torch.ops.load_library({LIB!r})
    kc = torch.ops.kernelcraft
    def job():
        return json.loads(kc.evolution_status())["job"]
    def until(pred, timeout=60):
        deadline = time.time() + timeout
        while not pred() and time.time() < deadline:
            time.sleep(0.05)
        return pred()
""")

# Every rank misses the same two keys; the one whose claim wins searches each key, the others
# import its record; all ranks then serve from their own caches.
JOB_PROGRAM = """
    import torch.distributed as dist
    dist.init_process_group("gloo")
    xs = [torch.randn(256, 129), torch.randn(64, 300)]
    t0 = time.time()
    for x in xs:
        torch.relu(x)
    miss_s = time.time() - t0
    keys = sorted(k for k in kc.missed_keys() if "aten::relu" in k)
    ok = kc.wait_for_evolution(120.0)
    dist.barrier()
    for _ in range(3):
        same = all(torch.equal(torch.relu(x), x.clamp_min(0)) for x in xs)
    out = {"rank": RANK, "keys": keys, "waited": ok, "same": same, "miss_s": miss_s, "job": job(),
           "relu": json.loads(kc.status())["ops"]["relu"], "cache": os.environ["KERNELCRAFT_CACHE_DIR"]}
    with open(os.path.join(os.environ["KC_TEST_BASE"], f"out{RANK}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
"""


def job_env(base, **extra):
    env = dict(os.environ)
    env.update(evolve_env(base / "unused", KERNELCRAFT_EVOLVE_LAMBDA=2, KERNELCRAFT_EVOLVE_GENERATIONS=1,
                          KERNELCRAFT_EVOLVE_MU=1, KERNELCRAFT_JOB_POLL_MS=200, KERNELCRAFT_JOB_LEASE_S=4,
                          KERNELCRAFT_LOG_LEVEL="info"))
    env.pop("KERNELCRAFT_CACHE_DIR")
    env["KC_TEST_BASE"] = str(base)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def script(tmp_path, body):
    p = tmp_path / "program.py"
    p.write_text(PRELUDE + textwrap.dedent(body))
    return p


def has_search_state(cache, key):
    r = subprocess.run([CLI, "--cache-dir", str(cache), "--json", "search-state", key], capture_output=True,
                       text=True, timeout=60)
    return r.returncode == 0


def search_state(cache, key):
    r = subprocess.run([CLI, "--cache-dir", str(cache), "--json", "search-state", key], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def show(cache, key):
    r = subprocess.run([CLI, "--cache-dir", str(cache), "--json", "cache", "show", key], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nproc", [2, 3])
def test_each_key_is_searched_once_and_reaches_every_rank(tmp_path, nproc):
    base = tmp_path / "job"
    base.mkdir()
    prog = script(tmp_path, JOB_PROGRAM)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                        str(prog)], env=job_env(base), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    outs = [json.loads((base / f"out{i}.json").read_text()) for i in range(nproc)]
    keys = outs[0]["keys"]
    assert len(keys) == 2 and all(o["keys"] == keys for o in outs), [o["keys"] for o in outs]
    assert all(o["waited"] and o["same"] for o in outs), outs
    assert all(o["miss_s"] < 5 for o in outs), "a miss waited for the store"
    assert all(o["job"]["state"] == "on" for o in outs), [o["job"] for o in outs]
    caches = [base / f"rank{i}" for i in range(nproc)]
    for key in keys:
        searched = [c for c in caches if has_search_state(c, key)]
        assert len(searched) == 1, f"{key} searched in {searched}"
        recs = [records(c).get(key) for c in caches]
        assert all(rec is not None for rec in recs), recs
        assert len({rec["state"] for rec in recs}) == 1, recs
        shown = [show(c, key) for c in caches]
        assert len({json.dumps(s.get("blob")) for s in shown}) == 1, "the rebuilt binaries differ"
        for c, s in zip(caches, shown):
            prov = s["meta"].get("provenance", {})
            if c == searched[0] or s["state"] != "served":
                continue
            # Verified by a peer: kept as its word, and live-checked here on the first calls even
            # though the tests' default is shadow_calls=0.
            assert prov.get("verified") is True and prov.get("verified_here") is False, prov
    assert sum(o["job"]["claimed"] for o in outs) == 2
    assert sum(o["job"]["published"] for o in outs) == 2
    assert sum(o["job"]["imported"] for o in outs) == 2 * (nproc - 1)
    served = [key for key in keys if records(caches[0])[key]["state"] == "served"]
    for o in outs:
        if served and o["job"]["claimed"] < 2:
            assert o["relu"]["shadow_checks"] >= 1, o
    for c in caches:
        wait_for_worker_exit(c)


def host_store(port):
    """The job's store, hosted by a process of its own as torchrun's agent hosts it."""
    code = textwrap.dedent(f"""
        import time, torch.distributed as dist
        s = dist.TCPStore("127.0.0.1", {port}, is_master=True, wait_for_workers=False)
        print("up", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    return p


def rank(prog, env, r):
    e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
    return subprocess.Popen([sys.executable, str(prog)], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


# One key. The owner claims it, says so once its worker searches, and hangs until killed; the
# waiter says so once connected and then waits for the key to be resolved here.
NODE_PROGRAM = """
    torch.relu(torch.randn(256, 129))
    if os.environ["KC_TEST_ROLE"] == "owner":
        until(lambda: job()["owned"] == 1 and json.loads(kc.evolution_status())["worker_alive"])
        if os.environ.get("KC_TEST_WAIT_STATE"):   # a generation persisted, then two renewals ship it
            import subprocess
            cmd = [os.environ["KERNELCRAFT_WORKER"], "--cache-dir", os.environ["KERNELCRAFT_CACHE_DIR"], "--json",
                   "search-state", kc.missed_keys()[0]]
            until(lambda: subprocess.run(cmd, capture_output=True).returncode == 0, timeout=90)
            time.sleep(2)
        print("claimed", flush=True)
        time.sleep(600)
    until(lambda: job()["state"] == "on")
    time.sleep(1)
    print("waiting" if job()["owned"] == 0 and job()["waiting"] == 1 else "not waiting", flush=True)
    ok = kc.wait_for_evolution(120.0)
    print(json.dumps({"waited": ok, "job": job(), "keys": kc.missed_keys()}), flush=True)
"""


def test_a_node_killed_mid_search_loses_its_key_to_another(tmp_path):
    base = tmp_path / "job"
    base.mkdir()
    port = free_port()
    store = host_store(port)
    try:
        env = job_env(base, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, KERNELCRAFT_JOB_LEASE_S=3,
                      KERNELCRAFT_EVOLVE_GENERATIONS=6)
        prog = script(tmp_path, NODE_PROGRAM)
        a = rank(prog, dict(env, KC_TEST_ROLE="owner", KC_TEST_WAIT_STATE="1"), 0)
        assert a.stdout.readline().strip() == "claimed"
        b = rank(prog, dict(env, KC_TEST_ROLE="waiter"), 1)
        assert b.stdout.readline().strip() == "waiting"
        # Node A dies: the user's process and its worker (mid-search).
        worker = int((base / "rank0" / "worker.lock").read_text().split()[0] or 0)
        a.kill()
        if worker:
            os.kill(worker, signal.SIGKILL)
        a.wait()
        t0 = time.time()
        line = b.stdout.readline()
        b.wait(timeout=120)
        assert b.returncode == 0, b.stderr.read()
        out = json.loads(line)
        assert out["waited"], out
        assert out["job"]["taken_over"] == 1 and out["job"]["claimed"] == 1, out
        key = out["keys"][0]
        assert records(base / "rank1")[key]["state"] in ("served", "eager_best")
        # The survivor resumed from the search state the dead node shipped with its renewals:
        # every candidate the dead node had evaluated is in the survivor's history.
        assert out["job"]["resumed"] == 1, out
        dead = {t["id"] for t in search_state(base / "rank0", key)["tried"]}
        alive = {t["id"] for t in search_state(base / "rank1", key)["tried"]}
        assert dead and dead <= alive, (dead, alive)
        assert time.time() - t0 < 90
        wait_for_worker_exit(base / "rank1")
    finally:
        store.kill()


def test_a_dead_store_means_local_searches_and_one_log_line(tmp_path):
    base = tmp_path / "job"
    base.mkdir()
    env = job_env(base, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(),
                  KERNELCRAFT_JOB_STORE_TIMEOUT_MS=1000, KERNELCRAFT_LOG_LEVEL="warn")
    prog = script(tmp_path, """
        x = torch.randn(256, 129)
        t0 = time.time()
        y = torch.relu(x)
        miss_s = time.time() - t0
        ok = kc.wait_for_evolution(120.0)
        for _ in range(3):
            same = torch.equal(torch.relu(x), y)
        print(json.dumps({"miss_s": miss_s, "waited": ok, "same": same, "job": job(), "keys": kc.missed_keys()}))
    """)
    r = subprocess.run([sys.executable, str(prog)], env=dict(env, RANK="0"), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["miss_s"] < 0.5 and out["same"] and out["waited"], out
    assert out["job"]["state"] == "off" and "unreachable" in out["job"]["error"], out
    lines = [line for line in r.stderr.splitlines() if "job-wide coordination" in line]
    assert len(lines) == 1, r.stderr
    assert records(base / "rank0")[out["keys"][0]]["state"] in ("served", "eager_best")
    wait_for_worker_exit(base / "rank0")


def test_a_store_that_stops_answering_hands_its_keys_back(tmp_path):
    base = tmp_path / "job"
    base.mkdir()
    port = free_port()
    store = host_store(port)
    try:
        env = job_env(base, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      KERNELCRAFT_JOB_STORE_TIMEOUT_MS=1000, KERNELCRAFT_LOG_LEVEL="warn")
        prog = script(tmp_path, """
            torch.relu(torch.randn(8, 8))                     # connects; its own key is searched too
            until(lambda: job()["state"] == "on")
            print("on", flush=True)
            sys.stdin.readline()                              # the store is stopped now
            x = torch.randn(256, 129)
            t0 = time.time()
            torch.relu(x)
            miss_s = time.time() - t0
            ok = kc.wait_for_evolution(120.0)
            print(json.dumps({"miss_s": miss_s, "waited": ok, "job": job()}), flush=True)
        """)
        p = subprocess.Popen([sys.executable, str(prog)], env=dict(env, RANK="0"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "on"
        os.kill(store.pid, signal.SIGSTOP)
        p.stdin.write("go\n")
        p.stdin.flush()
        out_text, err = p.communicate(timeout=150)
        assert p.returncode == 0, err
        out = json.loads(out_text.strip().splitlines()[-1])
        assert out["miss_s"] < 0.5 and out["waited"], out
        assert out["job"]["state"] == "off", out
        assert len([line for line in err.splitlines() if "job-wide coordination" in line]) == 1, err
        wait_for_worker_exit(base / "rank0")
    finally:
        os.kill(store.pid, signal.SIGCONT)
        store.kill()
