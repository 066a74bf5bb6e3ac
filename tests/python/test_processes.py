"""Several processes, one cache; broken caches and bad configuration never break the user's program."""
import json
import os
import stat
import textwrap

import pytest

from conftest import KERNELS, run_python

# Child processes load the library and print one JSON line on stdout.
CHILD_PRELUDE = textwrap.dedent("""
    import json, os, sys, time
    torch.ops.load_library(LIB)
    kc = torch.ops.kernelcraft
""")


def child(code, **env):
    r = run_python(CHILD_PRELUDE + textwrap.dedent(code), env={k: str(v) for k, v in env.items()})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_two_processes_share_one_cache(tmp_path):
    cache = tmp_path / "shared"
    # process A finds the key and puts a kernel; process B, started afterwards, serves it.
    out, _ = child(f"""
        x = torch.randn(300, 7)
        torch.relu(x)
        key = [k for k in kc.missed_keys() if 'aten::relu' in k][0]
        kc.put_kernel(key, open({str(KERNELS / 'relu_cpu.cpp')!r}).read(), open({str(KERNELS / 'relu_cpu.json')!r}).read())
        print(json.dumps({{"key": key}}))
    """, KERNELCRAFT_CACHE_DIR=cache)
    out2, _ = child("""
        x = torch.randn(300, 7)
        torch.relu(x); y = torch.relu(x)
        ok = torch.equal(y, x.clamp_min(0))
        s = json.loads(kc.status())
        print(json.dumps({"hits": s["ops"]["relu"]["hits"], "ok": ok}))
    """, KERNELCRAFT_CACHE_DIR=cache)
    assert out2 == {"hits": 1, "ok": True}


def test_reader_sees_a_kernel_written_while_it_runs(tmp_path):
    cache = tmp_path / "live"
    flag = tmp_path / "go"
    # B starts first and misses; A writes; B keeps calling and is served after catching up.
    code_b = f"""
        x = torch.randn(513)
        torch.relu(x)
        key = kc.missed_keys()[0]
        open({str(tmp_path / 'key')!r}, 'w').write(key)
        deadline = time.time() + 60
        while not os.path.exists({str(flag)!r}) and time.time() < deadline:
            time.sleep(0.05)
        hits = 0
        while time.time() < deadline and hits == 0:
            torch.relu(x); time.sleep(0.02)
            hits = json.loads(kc.status())["ops"]["relu"]["hits"]
        print(json.dumps({{"hits": hits}}))
    """
    import subprocess, sys, time
    from conftest import LIB
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache), KERNELCRAFT_CATCH_UP_MS="20")
    b = subprocess.Popen([sys.executable, "-c", f"import json, torch\nLIB={LIB!r}\n" + CHILD_PRELUDE + textwrap.dedent(code_b)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    keyfile = tmp_path / "key"
    t0 = time.time()
    while not keyfile.exists() and time.time() - t0 < 60:
        time.sleep(0.05)
    key = keyfile.read_text()
    child(f"""
        kc.put_kernel({key!r}, open({str(KERNELS / 'relu_cpu.cpp')!r}).read(), open({str(KERNELS / 'relu_cpu.json')!r}).read())
        print(json.dumps({{}}))
    """, KERNELCRAFT_CACHE_DIR=cache)
    flag.write_text("go")
    out, err = b.communicate(timeout=120)
    assert b.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["hits"] >= 1


def test_concurrent_writers_do_not_corrupt(tmp_path):
    cache = tmp_path / "writers"
    import subprocess, sys
    from conftest import LIB
    code = CHILD_PRELUDE + textwrap.dedent(f"""
        n = int(sys.argv[1])
        for i in range(4):
            x = torch.randn(100 + 10 * n + i)
            torch.relu(x)
        for key in kc.missed_keys():
            kc.put_kernel(key, open({str(KERNELS / 'relu_cpu.cpp')!r}).read(), open({str(KERNELS / 'relu_cpu.json')!r}).read())
        print(json.dumps({{"n": len(kc.missed_keys())}}))
    """)
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", f"import json, torch\nLIB={LIB!r}\n" + code, str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    out, _ = child("""
        hits = 0
        for n in range(3):
            for i in range(4):
                x = torch.randn(100 + 10 * n + i)
                torch.relu(x); y = torch.relu(x)
                assert torch.equal(y, x.clamp_min(0))
        print(json.dumps(json.loads(kc.status())["ops"]["relu"]))
    """, KERNELCRAFT_CACHE_DIR=cache)
    assert out["hits"] == 12


def test_a_forked_child_serves_without_the_parents_threads(tmp_path):
    """DataLoader workers fork without exec: the child has none of the parent's threads (the store
    thread). Its calls must not wait for them, and it opens the cache on its own and serves from it."""
    out, err = child(f"""
        x = torch.randn(300, 7)
        torch.relu(x)                       # the parent's store thread opens the (missing) cache
        key = [k for k in kc.missed_keys() if 'aten::relu' in k][0]
        kc.put_kernel(key, open({str(KERNELS / 'relu_cpu.cpp')!r}).read(), open({str(KERNELS / 'relu_cpu.json')!r}).read())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            t0 = time.time()
            ok = True
            for i in range(20):             # new keys, with catch-ups falling due (every 50 ms)
                y = torch.randn(10 + i, 5)
                ok = ok and torch.equal(torch.relu(y), y.clamp_min(0))
                time.sleep(0.03)
            torch.relu(x); y = torch.relu(x)   # load, then serve the parent's kernel
            s = json.loads(kc.status())
            res = {{"ok": ok and torch.equal(y, x.clamp_min(0)), "secs": time.time() - t0,
                    "hits": s["ops"]["relu"]["hits"], "state": s["cache"]["state"]}}
            os.write(w, json.dumps(res).encode())
            os._exit(0)
        os.close(w)
        got = b""
        while chunk := os.read(r, 4096):
            got += chunk
        os.waitpid(pid, 0)
        print(got.decode())
    """, KERNELCRAFT_CACHE_DIR=tmp_path / "cache", KERNELCRAFT_CATCH_UP_MS=50)
    assert out["ok"] and out["state"] == "open" and out["hits"] >= 1, out
    # Each wait for a store thread that does not exist costs 2 s, and about 20 catch-ups fall due
    # (the pre-fix build took ~45 s); 10 s leaves room for a loaded machine.
    assert out["secs"] < 10, out


def test_many_threads_while_the_cache_changes(tmp_path):
    """Four threads call intercepted ops (hits, misses, new keys) while the main thread stores kernels
    and drops the table, with catch-ups due every millisecond: every result equals eager."""
    out, err = child(f"""
        import threading
        src = open({str(KERNELS / 'relu_cpu.cpp')!r}).read()
        spec = open({str(KERNELS / 'relu_cpu.json')!r}).read()
        x = torch.randn(300, 7)
        torch.relu(x)
        kc.put_kernel([k for k in kc.missed_keys() if 'aten::relu' in k][0], src, spec)
        bad = []
        # The workers keep going until the main thread has stored a few kernels: on a fast machine
        # 150 iterations ended before the second put (the test's point is calls racing the puts).
        enough = threading.Event()
        def work(t):
            i = 0
            while i < 150 or (not enough.is_set() and i < 5000):
                i += 1
                for y in (x, torch.randn(50 + (i * 7 + t) % 40, 3)):
                    if not torch.equal(torch.relu(y), y.clamp_min(0)):
                        bad.append((t, i))
                z = torch.randn(8, 33)
                torch.testing.assert_close(torch.softmax(z, -1), torch.exp(z) / torch.exp(z).sum(-1, keepdim=True))
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads: th.start()
        stored = 0
        while any(th.is_alive() for th in threads):
            keys = [k for k in kc.missed_keys() if 'aten::relu' in k]
            if stored < len(keys):
                kc.put_kernel(keys[stored], src, spec); stored += 1
            else:
                kc.forget()
            if stored >= 3:
                enough.set()
            time.sleep(0.01)
        for th in threads: th.join()
        s = json.loads(kc.status())["ops"]["relu"]
        print(json.dumps({{"bad": bad, "hits": s["hits"], "stored": stored}}))
    """, KERNELCRAFT_CACHE_DIR=tmp_path / "cache", KERNELCRAFT_CATCH_UP_MS=1)
    assert out["bad"] == [], out
    assert out["hits"] > 0 and out["stored"] > 1, out


@pytest.mark.parametrize("damage", ["garbage_files", "not_a_directory", "unreadable"])
def test_broken_cache_means_eager_and_one_line(tmp_path, damage):
    cache = tmp_path / "broken"
    if damage == "garbage_files":
        cache.mkdir()
        (cache / "CURRENT").write_text("MANIFEST-999999\n")
        (cache / "MANIFEST-999999").write_bytes(os.urandom(300))
    elif damage == "not_a_directory":
        cache.write_text("I am a file")
    else:
        cache.mkdir()
        (cache / "CURRENT").write_text("MANIFEST-000001\n")
        os.chmod(cache, 0)
    try:
        out, err = child("""
            x = torch.randn(50, 3)
            ok = all(torch.equal(torch.relu(x), x.clamp_min(0)) for _ in range(5))
            s = json.loads(kc.status())
            print(json.dumps({"ok": ok, "state": s["cache"]["state"], "misses": s["ops"]["relu"]["misses"]}))
        """, KERNELCRAFT_CACHE_DIR=cache)
    finally:
        if cache.is_dir():
            os.chmod(cache, stat.S_IRWXU)
    assert out["ok"] and out["misses"] == 5
    lines = [l for l in err.splitlines() if l.startswith("[kernelcraft]")]
    assert len(lines) <= 1, err


def test_ops_env_and_config_file(tmp_path):
    cfg = tmp_path / "kc.json"
    cfg.write_text(json.dumps({"ops": ["relu", "softmax"]}))
    out, _ = child("""
        x = torch.randn(4, 4)
        torch.relu(x); torch.softmax(x, 1); torch.sigmoid(x)
        s = json.loads(kc.status())["ops"]
        print(json.dumps({k: v["misses"] for k, v in s.items()}))
    """, KERNELCRAFT_CONFIG=cfg, KERNELCRAFT_CACHE_DIR=tmp_path / "c")
    assert out == {"relu": 1, "softmax": 1}
    out, _ = child("""
        x = torch.randn(4, 4)
        torch.relu(x); torch.softmax(x, 1); torch.sigmoid(x)
        s = json.loads(kc.status())["ops"]
        print(json.dumps({k: v["misses"] for k, v in s.items()}))
    """, KERNELCRAFT_OPS="default,-relu", KERNELCRAFT_CACHE_DIR=tmp_path / "c")
    assert "relu" not in out and out["softmax"] == 1 and out["sigmoid"] == 1


def test_bad_config_warns_once_and_runs(tmp_path):
    cfg = tmp_path / "bad.json"
    cfg.write_text("{ this is not json")
    out, err = child("""
        x = torch.randn(4)
        print(json.dumps({"ok": torch.equal(torch.relu(x), x.clamp_min(0))}))
    """, KERNELCRAFT_CONFIG=cfg, KERNELCRAFT_OPS="relu,bogus", KERNELCRAFT_CACHE_DIR=tmp_path / "c")
    assert out["ok"]
    assert "KERNELCRAFT_CONFIG" in err and "KERNELCRAFT_OPS" in err


def test_loading_twice_and_late_loading_is_safe(tmp_path):
    out, err = child("""
        x = torch.randn(5)
        a = torch.relu(x)                      # ops ran before the library was loaded
        torch.ops.load_library(LIB)            # second load of the same path
        import shutil, tempfile
        copy = os.path.join(tempfile.mkdtemp(), "libkernelcraft_copy.so")
        shutil.copy(LIB, copy)
        torch.ops.load_library(copy)           # another copy of the library: stays inactive
        kc.reset_counters(); torch.relu(x)
        print(json.dumps({"misses": json.loads(kc.status())["ops"]["relu"]["misses"]}))
    """, KERNELCRAFT_CACHE_DIR=tmp_path / "c")
    assert out == {"misses": 1}
    assert "already loaded" in err


def test_global_disable_env(tmp_path):
    out, _ = child("""
        torch.relu(torch.randn(3))
        s = json.loads(kc.status())
        print(json.dumps({"enabled": s["enabled"], "calls": s["total"]["calls"]}))
    """, KERNELCRAFT_DISABLE=1, KERNELCRAFT_CACHE_DIR=tmp_path / "c")
    assert out == {"enabled": False, "calls": 0}


def test_readonly_serving_and_miss_log(tmp_path):
    """A shipped cache served read-only (the deployment mode), and the miss log for pre-warming."""
    cache = tmp_path / "shipped"
    out, _ = child(f"""
        x = torch.randn(257)
        torch.relu(x)
        key = [k for k in kc.missed_keys() if 'aten::relu' in k][0]
        kc.put_kernel(key, open({str(KERNELS / 'relu_cpu.cpp')!r}).read(), open({str(KERNELS / 'relu_cpu.json')!r}).read())
        print(json.dumps({{"key": key}}))
    """, KERNELCRAFT_CACHE_DIR=cache)
    misses = tmp_path / "missed.txt"
    out2, _ = child("""
        x = torch.randn(257)
        torch.relu(x); y = torch.relu(x)
        torch.sigmoid(x); torch.sigmoid(x)
        s = json.loads(kc.status())
        try:
            kc.put_kernel("kc1|x|aten::relu|fp32", "", "{}")
            refused = False
        except RuntimeError:
            refused = True
        print(json.dumps({"hits": s["ops"]["relu"]["hits"], "ok": torch.equal(y, x.clamp_min(0)),
                          "readonly": s["cache"]["readonly"], "refused": refused}))
    """, KERNELCRAFT_CACHE_DIR=cache, KERNELCRAFT_CACHE_READONLY=1, KERNELCRAFT_MISS_LOG=misses)
    assert out2 == {"hits": 1, "ok": True, "readonly": True, "refused": True}
    logged = misses.read_text().splitlines()
    assert len(logged) == 1 and "aten::sigmoid" in logged[0]   # each new miss once; hits not logged
