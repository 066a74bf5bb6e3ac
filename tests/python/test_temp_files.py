"""Temporary files and directories never outlive the processes that make them: removed on the normal
path, and swept (by the next `kernelcraft` run) when their owner died without cleaning up."""
import os
import subprocess

from conftest import CLI, KERNELS, run_python


def ours(tmpdir):
    return sorted(n for n in os.listdir(tmpdir) if n.startswith("kc-"))


def test_a_serving_process_and_the_cli_leave_nothing_in_tmpdir(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    code = f"""
torch.ops.load_library(LIB)
kc = torch.ops.kernelcraft
x = torch.randn(333, 3)
torch.relu(x)
key = [k for k in kc.missed_keys() if 'aten::relu' in k][0]
kc.put_kernel(key, open({str(KERNELS / 'relu_cpu.cpp')!r}).read(), open({str(KERNELS / 'relu_cpu.json')!r}).read())
torch.relu(x); y = torch.relu(x)
assert torch.equal(y, x.clamp_min(0))
print(json.loads(kc.status())["ops"]["relu"]["hits"])
"""
    r = run_python(code, env={"TMPDIR": str(tmpdir), "KERNELCRAFT_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0 and r.stdout.split()[-1] == "1", r.stderr
    for args in (["ops"], ["--cache-dir", str(tmp_path / "cache"), "cache", "ls"]):
        c = subprocess.run([CLI, *args], env={**os.environ, "TMPDIR": str(tmpdir)}, capture_output=True, timeout=60)
        assert c.returncode == 0, c.stderr
    assert ours(tmpdir) == []


def test_what_a_dead_process_left_is_swept_and_nothing_else(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = os.getpid()
    left = [f"kc-calls-{dead.pid}", f"kc-put-{dead.pid}-Ab12Cd", f"kc-cc-{dead.pid}-xyz", f"kc-sanitize-{dead.pid}"]
    kept = [f"kc-calls-{live}", f"kc-put-{live}-Ab12Cd", "kc-pytest-12345678", f"kc-other-{dead.pid}"]
    for n in left + kept:
        (tmpdir / n).mkdir()
        (tmpdir / n / "file").write_text("x")
    (tmpdir / f"kc-asan-path-{dead.pid}").write_text("a file, not a directory")
    c = subprocess.run([CLI, "ops"], env={**os.environ, "TMPDIR": str(tmpdir)}, capture_output=True, timeout=60)
    assert c.returncode == 0, c.stderr
    assert ours(tmpdir) == sorted(kept)
