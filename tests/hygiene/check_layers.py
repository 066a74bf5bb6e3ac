#!/usr/bin/env python3
"""The product's dependencies point one way: each folder (and each part of evolve/) includes only
the folders below it. Prints every include that runs against the grain; exit 1 if any."""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
# What each part may include besides itself (transitively closed by hand: keep it readable).
ALLOWED = {
    "runtime": set(),
    "kernel_cache": {"runtime"},
    "dispatcher": {"runtime", "kernel_cache"},
    "evolve/ops": {"runtime", "kernel_cache"},
    "evolve/propose": {"runtime", "kernel_cache", "evolve/ops"},
    "evolve/search": {"runtime", "kernel_cache", "evolve/ops", "evolve/propose"},
    "evolve/verify": {"runtime", "kernel_cache", "evolve/ops"},
    "evolve/worker": {"runtime", "kernel_cache", "evolve/ops", "evolve/propose", "evolve/search", "evolve/verify"},
    "torch_ops": {"runtime", "kernel_cache", "dispatcher", "evolve/ops", "evolve/propose", "evolve/search",
                  "evolve/verify", "evolve/worker"},
}


def part_of(rel: str):
    for p in sorted(ALLOWED, key=len, reverse=True):
        if rel == p or rel.startswith(p + "/"):
            return p
    return None


def main() -> int:
    bad = []
    for path in sorted(ROOT.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".inc") or "build" in path.relative_to(ROOT).parts[:1]:
            continue
        rel = path.relative_to(ROOT).as_posix()
        me = part_of(rel)
        if me is None:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            them = part_of(m.group(1))
            if them and them != me and them not in ALLOWED[me]:
                bad.append(f"{rel}:{n}: {me} includes {m.group(1)} ({them})")
    for b in bad:
        print(b)
    if (ROOT / "evolve").is_dir():
        loose = [p.name for p in (ROOT / "evolve").iterdir() if p.suffix in (".h", ".cpp")]
        for name in loose:
            print(f"evolve/{name}: every evolve source belongs to one of its parts")
        bad += loose
    print(f"{'ok' if not bad else 'FAILED'}: {len(bad)} includes against the grain")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
