"""pytest setup: every test process loads libkernelcraft.so with a private cache directory.

KERNELCRAFT_LIB names the library (ctest sets it); otherwise build/torch_ops/libkernelcraft.so.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIB = os.environ.get("KERNELCRAFT_LIB", str(ROOT / "build" / "torch_ops" / "libkernelcraft.so"))
CLI = os.environ.get("KERNELCRAFT_CLI", str(ROOT / "build" / "torch_ops" / "kernelcraft"))
KERNELS = ROOT / "examples" / "kernels"

# The cache directory must be chosen before the library loads (it reads its configuration then).
_session_cache = tempfile.mkdtemp(prefix="kc-pytest-")
os.environ["KERNELCRAFT_CACHE_DIR"] = _session_cache
os.environ.setdefault("KERNELCRAFT_CATCH_UP_MS", "50")
# Background evolution is off for the serving tests (their misses would start workers that compete
# for the CI machine's two cores); test_evolution.py turns it on for its own child processes.
os.environ.setdefault("KERNELCRAFT_EVOLVE", "0")
# The serving tests store hand-written kernels with put_kernel (unverified); test_serving.py checks
# that they are left alone when this is off, which is the default outside the tests.
os.environ.setdefault("KERNELCRAFT_SERVE_UNVERIFIED", "1")
# The serve probe (first calls of a served key also run eager, timed) would turn the serving tests'
# exact hit counts into probe counts; test_probe.py turns it on where it is the subject.
os.environ.setdefault("KERNELCRAFT_SERVE_PROBE_CALLS", "0")
# The live check (first calls of a served key compared with eager) would catch the serving tests'
# deliberately different kernels and disable them; test_shadow.py turns it on where it is the subject.
os.environ.setdefault("KERNELCRAFT_SHADOW_CALLS", "0")
os.environ.setdefault("KERNELCRAFT_SHADOW_EVERY", "0")

import torch  # noqa: E402

torch.ops.load_library(LIB)
kc = torch.ops.kernelcraft


def status():
    return json.loads(kc.status())


@pytest.fixture
def fresh_cache(tmp_path):
    """A new, empty cache directory for this test, counters reset, everything intercepted."""
    d = tmp_path / "cache"
    kc.configure(json.dumps({"cache_dir": str(d), "enabled": True, "ops": "default"}))
    kc.reset_counters()
    yield d
    kc.configure(json.dumps({"cache_dir": _session_cache, "enabled": True, "ops": "default"}))


def run_python(code, env=None, timeout=120):
    """Runs `code` in a fresh interpreter with the library path available as LIB."""
    e = dict(os.environ)
    e.update(env or {})
    prelude = f"import json, torch\nLIB = {LIB!r}\n"
    return subprocess.run([sys.executable, "-c", prelude + code], env=e, capture_output=True, text=True,
                          timeout=timeout)


def kernel_source(name):
    return (KERNELS / name).read_text()
