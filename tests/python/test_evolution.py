"""Background evolution on the CPU backend: miss -> job -> worker -> verified kernel or eager_best.

Each test runs the user's program in a fresh interpreter with its own cache directory, so the
worker it starts is its own. Searches are kept small (lambda 4, 2 generations) to stay fast.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import CLI, LIB, run_python

PRELUDE = textwrap.dedent("""
    import json, os, sys, time
    torch.ops.load_library(LIB)
    kc = torch.ops.kernelcraft
""")


def evolve_env(cache, **extra):
    env = {
        "KERNELCRAFT_CACHE_DIR": str(cache),
        "KERNELCRAFT_EVOLVE": "1",
        "KERNELCRAFT_WORKER": CLI,
        "KERNELCRAFT_EVOLVE_GPU_SHARE": "1",
        "KERNELCRAFT_EVOLVE_LAMBDA": "4",
        "KERNELCRAFT_EVOLVE_GENERATIONS": "2",
        "KERNELCRAFT_WORKER_IDLE_S": "3",
        "KERNELCRAFT_CATCH_UP_MS": "50",
        "KERNELCRAFT_OPS": "relu",
        # Evolved records carry the gauntlet's verdict; they must be served under the default policy.
        "KERNELCRAFT_SERVE_UNVERIFIED": "0",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def child(code, env, timeout=600):
    r = run_python(PRELUDE + textwrap.dedent(code), env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def cli_json(*args, cache):
    r = subprocess.run([CLI, "--cache-dir", str(cache), "--json", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def records(cache):
    return {r["key"]: r for r in cli_json("cache", "ls", cache=cache)}


def search_pair(tmp_path, search, forward, may_lose=False, tries=3):
    """Runs `search(cache)` (the offline search of a composite's forward and backward keys) in a
    fresh cache until both records are served, or the forward ended eager_best where `may_lose`;
    returns (cache, {op: state}) of the last try. A fused pair is served because it won a paired
    timing race against eager, and on a CI machine running tests beside it eager can win a race
    it usually loses: the tests check the serve path, not the speed, so a lost race is searched
    again, at most `tries` times, before the caller's assertion sees it."""
    for attempt in range(tries):
        cache = tmp_path / ("c" if attempt == 0 else f"c{attempt}")
        search(cache)
        states = {r["op"]: r["state"] for r in records(cache).values()}
        if set(states.values()) == {"served"} or (may_lose and states.get(forward) == "eager_best"):
            break
        print(f"search {attempt}: {states}; searching again in a fresh cache")
    return cache, states


def search_state(cache, key):
    return cli_json("search-state", key, cache=cache)


def wait_for_worker_exit(cache, timeout=30):
    """The worker exits after its idle time; later tests must not share CPU with it."""
    lock = cache / "worker.lock"
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = subprocess.run(["flock", "-n", "-s", str(lock), "true"], capture_output=True)
        if r.returncode == 0:
            return
        time.sleep(0.2)


SERVE_PROGRAM = """
    x = torch.randn(256, 129)
    expect = torch.relu(x)                      # miss: eager, job submitted
    key = [k for k in kc.missed_keys() if 'aten::relu' in k][0]
    ok = kc.wait_for_evolution(500.0)
    for _ in range(3):
        y = torch.relu(x)
    s = json.loads(kc.status())["ops"]["relu"]
    print(json.dumps({"key": key, "waited": ok, "hits": s["hits"], "same": torch.equal(y, expect)}))
"""


def test_miss_evolves_a_verified_kernel_or_remembers_eager(tmp_path):
    cache = tmp_path / "c"
    out = child(SERVE_PROGRAM, evolve_env(cache))
    assert out["waited"], "the job did not finish"
    assert out["same"], "results changed"
    rec = records(cache)[out["key"]]
    assert rec["state"] in ("served", "eager_best")
    st = search_state(cache, out["key"])
    assert st["finished"]
    tried = st["tried"]
    assert len(tried) >= 4
    ids = [t["id"] for t in tried]
    assert len(ids) == len(set(ids)), "a variant was proposed twice"
    assert all(t["verdict"] == "passed" for t in tried), [t for t in tried if t["verdict"] != "passed"]
    assert any(t["origin"] in ("mutation", "crossover") for t in tried), "no second generation"
    if rec["state"] == "served":
        assert out["hits"] >= 1
        full = cli_json("cache", "show", out["key"], cache=cache)
        meta = full["meta"]
        assert meta["provenance"]["verified"] is True
        stages = {s["name"]: s["outcome"] for s in meta["verification"]["stages"]}
        assert stages["numerics"] == "passed" and stages["timing"] == "passed"
        assert meta["timing"]["median_ms"] < meta["timing"]["eager_median_ms"]
    else:
        assert out["hits"] == 0
    wait_for_worker_exit(cache)


def test_planted_bad_candidates_never_reach_the_cache(tmp_path):
    cache = tmp_path / "c"
    env = evolve_env(cache, KERNELCRAFT_PLANTED="fault,hang,wrong", KERNELCRAFT_EVOLVE_CANDIDATE_TIMEOUT_S=8,
                     KERNELCRAFT_EVOLVE_GENERATIONS=1)
    out = child(SERVE_PROGRAM, env)
    assert out["waited"] and out["same"]
    st = search_state(cache, out["key"])
    by_family = {t["family"]: t for t in st["tried"]}
    # The crash is replayed under AddressSanitizer on the set it died on, which names the access.
    fault = by_family["cpu.planted_fault"]
    assert fault["verdict"] == "crash" or (fault["verdict"] == "rejected" and fault["stage"] == "sanitizer"), fault
    assert by_family["cpu.planted_hang"]["verdict"] == "timeout"
    assert by_family["cpu.planted_wrong"]["verdict"] == "rejected"
    assert by_family["cpu.planted_wrong"]["stage"] == "numerics"
    rec = records(cache)[out["key"]]
    if rec["state"] == "served":
        full = cli_json("cache", "show", out["key"], cache=cache)
        assert "planted" not in full["meta"]["candidate"]["family"]
    wait_for_worker_exit(cache)


def test_killed_worker_is_replaced_and_the_search_resumes(tmp_path):
    cache = tmp_path / "c"
    env = evolve_env(cache, KERNELCRAFT_EVOLVE_GENERATIONS=3, KERNELCRAFT_EVOLVE_GPU_SHARE=0.5)
    program = """
        x = torch.randn(256, 129)
        torch.relu(x)
        key = [k for k in kc.missed_keys() if 'aten::relu' in k][0]
        cache = os.environ["KERNELCRAFT_CACHE_DIR"]
        # Wait until the worker has evaluated a few candidates, then kill it mid-search.
        import subprocess
        def tried():
            r = subprocess.run([os.environ["KERNELCRAFT_WORKER"], "--cache-dir", cache, "--json", "search-state", key],
                               capture_output=True, text=True)
            return json.loads(r.stdout)["tried"] if r.returncode == 0 else []
        deadline = time.time() + 300
        while len(tried()) < 2 and time.time() < deadline:
            time.sleep(0.2)
        before = len(tried())
        pid = int(open(os.path.join(cache, "worker.lock")).read().split()[0])
        os.kill(pid, 9)
        ok = kc.wait_for_evolution(500.0)     # the background thread starts a new worker
        print(json.dumps({"key": key, "before": before, "waited": ok, "killed": pid}))
    """
    out = child(program, env)
    assert out["before"] >= 2
    assert out["waited"]
    log = (cache / "worker.log").read_text()
    assert "resuming: " in log, log[-2000:]
    st = search_state(cache, out["key"])
    ids = [t["id"] for t in st["tried"]]
    assert len(ids) == len(set(ids)), "work was repeated after the restart"
    assert len(ids) >= out["before"]
    assert out["key"] in records(cache)
    wait_for_worker_exit(cache)


def test_two_processes_one_search(tmp_path):
    cache = tmp_path / "c"
    env = evolve_env(cache, KERNELCRAFT_EVOLVE_GENERATIONS=1)
    program = """
        x = torch.randn(64, 33)
        torch.relu(x)
        print(json.dumps({"ok": kc.wait_for_evolution(500.0)}))
    """
    procs = [subprocess.Popen([sys.executable, "-c", f"import json, torch\nLIB = {LIB!r}\n" +
                               PRELUDE + textwrap.dedent(program)],
                              env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se
        assert json.loads(so.strip().splitlines()[-1])["ok"]
    log = (cache / "worker.log").read_text()
    assert log.count("] job kc1|") == 1, log
    assert log.count("worker: pid ") == 1, "more than one worker served the cache"
    wait_for_worker_exit(cache)


def test_offline_evolve_from_a_miss_log_then_ship_the_cache(tmp_path):
    """The deployment workflow: record misses, evolve offline, export, import elsewhere, serve."""
    miss_log = tmp_path / "misses.txt"
    build_cache, ship_cache = tmp_path / "build", tmp_path / "ship"
    env = evolve_env(build_cache, KERNELCRAFT_EVOLVE=0, KERNELCRAFT_MISS_LOG=miss_log)
    child("""
        torch.relu(torch.randn(128, 65))
        print(json.dumps({}))
    """, env)
    keys = [k for k in miss_log.read_text().splitlines() if k]
    assert len(keys) == 1
    r = subprocess.run([CLI, "--cache-dir", str(build_cache), "evolve", "--keys", str(miss_log), "--lambda", "4",
                        "--generations", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    state = records(build_cache)[keys[0]]["state"]
    assert state in ("served", "eager_best")
    bundle, keys = tmp_path / "kernels.kcb", tmp_path / "keys"
    # The verified claim travels only under a signature the importer trusts (kernel_cache/bundle.h);
    # an unsigned bundle's verified records are refused.
    subprocess.run([CLI, "keygen", "--out", str(keys)], check=True, timeout=60)
    subprocess.run([CLI, "--cache-dir", str(build_cache), "cache", "export", str(bundle), "--sign",
                    str(keys / "bundle-signing.key")], check=True, timeout=120)
    if state == "served":
        r = subprocess.run([CLI, "--cache-dir", str(tmp_path / "unsigned"), "cache", "import", str(bundle)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "claims to be verified" in r.stdout, r.stdout + r.stderr
    subprocess.run([CLI, "--cache-dir", str(ship_cache), "cache", "import", str(bundle), "--trust",
                    str(keys / "bundle-signing.pub")], check=True, timeout=120)
    out = child("""
        x = torch.randn(128, 65)
        torch.relu(x); y = torch.relu(x)
        s = json.loads(kc.status())["ops"]["relu"]
        print(json.dumps({"hits": s["hits"], "same": torch.equal(y, x.clamp_min(0)), "jobs": os.path.exists(os.path.join(os.environ["KERNELCRAFT_CACHE_DIR"], "jobs"))}))
    """, evolve_env(ship_cache, KERNELCRAFT_CACHE_READONLY=1))
    assert out["same"]
    assert out["jobs"] is False, "a read-only shipped cache must not get jobs"
    assert (out["hits"] >= 1) == (state == "served")


def test_a_worker_that_keeps_dying_is_restarted_with_back_off(tmp_path):
    """A broken worker install must not cost the training job a process start every few seconds."""
    cache = tmp_path / "c"
    starts = tmp_path / "starts.txt"
    fake = tmp_path / "fake-worker.sh"
    fake.write_text(f"#!/bin/sh\necho started >> {starts}\nexit 0\n")
    fake.chmod(0o755)
    program = """
        x = torch.randn(64, 33)
        y = torch.relu(x)
        t0 = time.time()
        ok = kc.wait_for_evolution(20.0)          # never finishes: the "worker" exits at once
        print(json.dumps({"waited": ok, "same": torch.equal(y, torch.relu(x)), "secs": time.time() - t0}))
    """
    out = child(program, evolve_env(cache, KERNELCRAFT_WORKER=fake))
    assert out["waited"] is False and out["same"]
    n = len(starts.read_text().splitlines())
    assert 2 <= n <= 4, f"{n} worker starts in {out['secs']:.0f} s"
