"""The ``kernelcraft`` console script: runs the C++ CLI installed beside the library."""
from __future__ import annotations

import os
import pathlib
import sys


def main() -> None:
    # Not via `import kernelcraft`: the CLI needs no torch in this process, only the executable.
    exe = os.environ.get("KERNELCRAFT_CLI") or str(pathlib.Path(__file__).resolve().parent / "kernelcraft")
    if not os.access(exe, os.X_OK):
        sys.exit(f"kernelcraft: the CLI executable is missing ({exe}); reinstall the package")
    os.execv(exe, [exe, *sys.argv[1:]])
