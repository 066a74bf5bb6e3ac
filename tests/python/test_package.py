"""The `kernelcraft` Python package (torch_ops/python/kernelcraft): loading, the typed API, the CLI
entry point. Imported from the source tree with the build tree's library (KERNELCRAFT_LIB), as an
installed package imports it from site-packages."""
import json
import os
import subprocess
import sys

import torch

from conftest import CLI, LIB, ROOT, status

sys.path.insert(0, str(ROOT / "torch_ops" / "python"))
os.environ.setdefault("KERNELCRAFT_LIB", LIB)
import kernelcraft  # noqa: E402


def test_import_loads_the_library_and_names_it():
    assert kernelcraft.library_path() == LIB
    assert os.path.samefile(kernelcraft.cli_path(), CLI)
    # conftest loaded the same file first; the package's load of it must be a no-op, not a second copy.
    assert kernelcraft._ops is torch.ops.kernelcraft and callable(torch.ops.kernelcraft.status)


def test_status_and_config_are_dicts():
    s = kernelcraft.status()
    assert isinstance(s, dict) and "relu" in s["ops"] and s.keys() == status().keys()
    assert isinstance(s["enabled"], bool)
    c = kernelcraft.config()
    assert isinstance(c, dict) and isinstance(c["catch_up_ms"], int)


def test_configure_takes_keywords_and_rejects_nonsense():
    before = kernelcraft.config()["catch_up_ms"]
    kernelcraft.configure(catch_up_ms=before + 7)
    assert kernelcraft.config()["catch_up_ms"] == before + 7
    kernelcraft.configure(catch_up_ms=before)
    try:
        kernelcraft.configure(no_such_setting=1)
    except RuntimeError as e:
        assert "no_such_setting" in str(e)
    else:
        raise AssertionError("an unknown setting was accepted")


def test_disabled_turns_interception_off_and_restores_it(fresh_cache):
    x = torch.randn(67)   # a shape no other test misses (their key tests look for new misses)
    torch.relu(x)
    misses = status()["ops"]["relu"]["misses"]
    with kernelcraft.disabled():
        torch.relu(x)
        assert kernelcraft.config()["enabled"] is False
    assert status()["ops"]["relu"]["misses"] == misses, "a call inside disabled() went through kernelcraft"
    assert kernelcraft.config()["enabled"] is True
    with kernelcraft.disabled("relu"):
        assert "relu" not in kernelcraft.config()["ops"]
        assert "gelu" in kernelcraft.config()["ops"]
    assert "relu" in kernelcraft.config()["ops"]


def test_disabled_restores_even_when_the_block_raises():
    try:
        with kernelcraft.disabled():
            raise ValueError("inside")
    except ValueError:
        pass
    assert kernelcraft.config()["enabled"] is True


def test_wait_for_evolution_and_evolution_status_are_typed():
    assert kernelcraft.wait_for_evolution(0.0) in (True, False)
    assert isinstance(kernelcraft.evolution_status(), dict)
    assert isinstance(kernelcraft.missed_keys(), list)


def test_console_script_runs_the_cli():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "torch_ops" / "python"), "KERNELCRAFT_CLI": CLI}
    r = subprocess.run([sys.executable, "-c", "from kernelcraft._cli import main; main()", "--json", "targets"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    targets = json.loads(r.stdout)
    assert any("cpu" in json.dumps(t) for t in (targets if isinstance(targets, list) else [targets]))


def test_a_fresh_interpreter_imports_the_package_alone():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "torch_ops" / "python"), "KERNELCRAFT_LIB": LIB}
    code = "import kernelcraft, torch; print(kernelcraft.status()['enabled'], torch.relu(torch.ones(3)).sum().item())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "3.0"]
