"""Build-time metadata provider (scikit-build-core dynamic metadata): the wheel depends on exactly
the torch release it is being built against, because libkernelcraft.so links torch's C++ API."""
from __future__ import annotations

from typing import Any, Mapping


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, Any]:
    import torch  # the build environment's torch: the one CMake finds

    release = torch.__version__.split("+")[0]
    return {"dependencies": [f"torch=={release}"]}
