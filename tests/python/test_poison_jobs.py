"""Job files are untrusted input (issue 9, items 2 and 4).

A poison job beside a good one: the worker rejects every job that does not validate into
jobs/rejected/ with a .reason file, keeps going, and still searches the good job. Mutated job files
through `kernelcraft job-check` and mutated bundles through `kernelcraft cache import` never abort.
Symlinks planted where the project writes are never written through.
"""
import json
import os
import random
import signal
import subprocess
import time

from conftest import CLI, run_python

MAKE_JOB = """
import os, time
torch.ops.load_library(LIB)
torch.relu(torch.randn(48, 40))
jobs = os.path.join(os.environ["KERNELCRAFT_CACHE_DIR"], "jobs")
for _ in range(200):
    if os.path.isdir(jobs) and any(n.endswith(".job") for n in os.listdir(jobs)):
        break
    time.sleep(0.05)
"""


def make_good_job(cache):
    """One real job written by the library (no worker: the configured one does not exist)."""
    env = {"KERNELCRAFT_CACHE_DIR": str(cache), "KERNELCRAFT_EVOLVE": "1", "KERNELCRAFT_OPS": "relu",
           "KERNELCRAFT_WORKER": str(cache) + "-no-such-worker", "KERNELCRAFT_EVOLVE_CAPTURE_MB": "0",
           "KERNELCRAFT_EVOLVE_LAMBDA": "2", "KERNELCRAFT_EVOLVE_GENERATIONS": "1",
           "KERNELCRAFT_EVOLVE_MU": "1"}
    r = run_python(MAKE_JOB, env=env)
    assert r.returncode == 0, r.stderr
    jobs = [n for n in os.listdir(cache / "jobs") if n.endswith(".job")]
    assert len(jobs) == 1, jobs
    return cache / "jobs" / jobs[0]


def poisons(good):
    """Byte strings that are never a valid job: the issue's string-for-a-number, every truncation
    (a strict CBOR map cut short), wrong types spliced into settings, deep nesting, garbage."""
    out = []
    assert b"\x66lambda\x02" in good
    out.append(good.replace(b"\x66lambda\x02", b"\x66lambda\x61\x32"))      # "2" for 2
    out.append(good.replace(b"\x66lambda\x02", b"\x66lambda\x1b" + b"\xff" * 8))   # 2^64-1
    out.append(good.replace(b"\x66lambda\x02", b"\x66lambda\x80"))          # []
    out.append(good.replace(b"\x66format\x01", b"\x66format\xf5"))          # true
    out += [good[:n] for n in range(0, len(good), max(1, len(good) // 150))]
    out.append(b"\x81" * 200000 + b"\x00")
    out.append(b"\xa1\x61k" + b"\x5b" + b"\xff" * 8)
    rng = random.Random(3)
    out += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(40)]
    return out


def test_poison_jobs_beside_a_good_one(tmp_path):
    cache = tmp_path / "c"
    good_path = make_good_job(cache)
    good = good_path.read_bytes()
    bad = poisons(good)
    past = time.time() - 3600
    for i, b in enumerate(bad):   # all older than the good job: the worker meets them first
        p = cache / "jobs" / f"poison{i:04d}.job"
        p.write_bytes(b)
        os.utime(p, (past, past))
    env = dict(os.environ, KERNELCRAFT_CACHE_DIR=str(cache))
    r = subprocess.run([CLI, "--cache-dir", str(cache), "worker", "--idle-s", "1", "--gpu-share", "1"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    rejected = os.listdir(cache / "jobs" / "rejected")
    assert len([n for n in rejected if n.endswith(".job")]) == len(bad)
    assert len([n for n in rejected if n.endswith(".reason")]) == len(bad)
    assert "lambda" in (cache / "jobs" / "rejected" / "poison0000.job.reason").read_text()
    assert r.stderr.count("rejected job") == len(bad), "one log line per rejected job"
    assert not good_path.exists(), "the good job was not taken"
    ls = subprocess.run([CLI, "--cache-dir", str(cache), "--json", "cache", "ls"], capture_output=True, text=True)
    states = [rec["state"] for rec in json.loads(ls.stdout)]
    assert len(states) == 1 and states[0] in ("served", "eager_best"), states


def test_mutated_job_files_never_abort_job_check(tmp_path):
    cache = tmp_path / "c"
    good = make_good_job(cache).read_bytes()
    rng = random.Random(5)
    files = []
    for i in range(300):
        b = bytearray(good)
        for _ in range(rng.randrange(1, 5)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        p = tmp_path / f"m{i}.job"
        p.write_bytes(bytes(b))
        files.append(str(p))
    r = subprocess.run([CLI, "job-check", *files], capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-2000:])
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == len(files)
    assert sum(not line["ok"] for line in lines) > 0


def test_mutated_bundles_never_abort_import(tmp_path):
    cache = tmp_path / "c"
    src = tmp_path / "k.cpp"
    src.write_text(open(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "kernels", "relu_cpu.cpp")).read())
    bundle = tmp_path / "b.kcb"
    key = "kc1|cpu-test|aten::relu|fp32|self=T:f32[8]s[1]a16"
    subprocess.run([CLI, "--cache-dir", str(cache), "cache", "rm", key], capture_output=True)
    subprocess.run([CLI, "--cache-dir", str(cache), "cache", "export", str(bundle)], capture_output=True, timeout=60)
    base = bundle.read_bytes() if bundle.exists() else b"\xa0"
    rng = random.Random(9)
    for i in range(60):
        b = bytearray(base)
        if i % 3 == 0:
            b = b[:rng.randrange(len(b) + 1)]
        else:
            for _ in range(rng.randrange(1, 6)):
                if b:
                    b[rng.randrange(len(b))] = rng.randrange(256)
        p = tmp_path / f"b{i}.kcb"
        p.write_bytes(bytes(b))
        r = subprocess.run([CLI, "--cache-dir", str(tmp_path / "dst"), "cache", "import", str(p)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode in (0, 1), (i, r.returncode, r.stderr[-1000:])
    deep = tmp_path / "deep.kcb"
    deep.write_bytes(b"\x81" * 200000 + b"\x00")
    r = subprocess.run([CLI, "--cache-dir", str(tmp_path / "dst"), "cache", "import", str(deep)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.returncode != -signal.SIGSEGV


def test_planted_symlinks_are_not_written_through(tmp_path):
    cache = tmp_path / "c"
    cache.mkdir(mode=0o700)
    (cache / "jobs").mkdir(mode=0o700)
    victims = {}
    for name in ("worker.lock", "worker.log", "worker.log.1"):
        v = tmp_path / f"victim-{name}"
        v.write_text("precious")
        victims[name] = v
        os.symlink(v, cache / name)
    r = subprocess.run([CLI, "--cache-dir", str(cache), "worker", "--idle-s", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    # A library process that misses starts no worker through the linked log, writes its job.
    env = {"KERNELCRAFT_CACHE_DIR": str(cache), "KERNELCRAFT_EVOLVE": "1", "KERNELCRAFT_OPS": "relu",
           "KERNELCRAFT_WORKER": CLI, "KERNELCRAFT_EVOLVE_CAPTURE_MB": "0"}
    r = run_python(MAKE_JOB, env=env)
    assert r.returncode == 0, r.stderr
    for v in victims.values():
        assert v.read_text() == "precious", v
    # A world-writable cache directory is refused unless shared.
    os.chmod(cache, 0o777)
    r = subprocess.run([CLI, "--cache-dir", str(cache), "cache", "put", "--key", "kc1|x|aten::relu|fp32|self=none",
                        "--source", "/dev/null", "--launch", "/dev/null"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    os.chmod(cache, 0o700)
