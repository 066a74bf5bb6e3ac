"""kernelcraft: verified, evolved kernels served through the PyTorch dispatcher.

``import kernelcraft`` loads ``libkernelcraft.so`` into torch (as ``import torchvision`` loads its
ops): from then on the intercepted ATen operators are served from the kernel cache where a verified
kernel exists for the exact call, and run eager otherwise. This module is a small typed layer over
``torch.ops.kernelcraft``; ``torch.ops.load_library(kernelcraft.library_path())`` does the same
loading without it.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
from typing import Any, Iterator

import torch

__all__ = ["library_path", "cli_path", "status", "config", "configure", "enable", "disable",
           "disabled", "missed_keys", "reset_counters", "wait_for_evolution", "evolution_status"]

_HERE = pathlib.Path(__file__).resolve().parent


def library_path() -> str:
    """The libkernelcraft.so this package loads (``KERNELCRAFT_LIB`` overrides, for build trees)."""
    return os.environ.get("KERNELCRAFT_LIB") or str(_HERE / "libkernelcraft.so")


def cli_path() -> str:
    """The ``kernelcraft`` executable installed beside the library (``KERNELCRAFT_CLI`` overrides)."""
    return os.environ.get("KERNELCRAFT_CLI") or str(pathlib.Path(library_path()).with_name("kernelcraft"))


# A second load of the same file is a no-op in torch; a different copy stays inactive (one log line).
torch.ops.load_library(library_path())
_ops = torch.ops.kernelcraft


def status() -> dict[str, Any]:
    """Intercepted ops, hits/misses/fallbacks per op and in total, and the cache's state."""
    return json.loads(_ops.status())


def config() -> dict[str, Any]:
    """The configuration in effect (every setting, after file, environment and configure())."""
    return json.loads(_ops.config())


def configure(**settings: Any) -> None:
    """Change settings at run time, e.g. ``configure(evolve=False, catch_up_ms=100)``.

    Raises RuntimeError for an unknown setting or a bad value; nothing changes then.
    """
    _ops.configure(json.dumps(settings))


def enable(*ops: str) -> None:
    """Turn interception on: for every op (no arguments) or for the named ones."""
    _ops.enable(list(ops))


def disable(*ops: str) -> None:
    """Turn interception off: for every op (no arguments) or for the named ones."""
    _ops.disable(list(ops))


@contextlib.contextmanager
def disabled(*ops: str) -> Iterator[None]:
    """Run a block with interception off (all ops, or the named ones); the previous state returns."""
    before = config()
    disable(*ops)
    try:
        yield
    finally:
        _ops.configure(json.dumps({"enabled": before["enabled"], "ops": before["ops"]}))


def missed_keys() -> list[str]:
    """Keys that missed in this process (bounded), in the order they first missed."""
    return list(_ops.missed_keys())


def reset_counters() -> None:
    """Zero the hit/miss/fallback counters that status() reports."""
    _ops.reset_counters()


def wait_for_evolution(timeout_s: float = 600.0) -> bool:
    """Block until this process's background searches ended (True) or ``timeout_s`` passed."""
    return bool(_ops.wait_for_evolution(float(timeout_s)))


def evolution_status() -> dict[str, Any]:
    """Jobs submitted by this process, whether a worker is alive, and its last error."""
    return json.loads(_ops.evolution_status())
