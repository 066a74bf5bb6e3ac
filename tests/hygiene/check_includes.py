"""Include what you use, for the standard names whose headers libstdc++ versions stop providing
transitively. g++ 13 dropped <cstdint> from several headers that g++ 12 pulled it in through, and
the project stopped building on Ubuntu 24.04 (runtime/fsutil.cpp used uint64_t without it). g++ 12
cannot show that, so this check does: a product file that uses one of the names below must include
its header itself, or through one of the project's own headers (their includes are ours to keep).

    python3 tests/hygiene/check_includes.py [ROOT]     exit 1 and one line per finding
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
FOLDERS = ["runtime", "kernel_cache", "dispatcher", "evolve", "torch_ops", "tests", "examples", "benchmarks"]
# name pattern -> headers any one of which provides it
NEEDS = {
    r"\b(?:std::)?u?int(?:8|16|32|64)_t\b|\bu?intptr_t\b|\bINT64_MAX\b|\bUINT64_MAX\b": ("cstdint", "stdint.h"),
    r"\bstd::(?:string|to_string)\b": ("string",),
    r"\bstd::string_view\b": ("string_view", "string"),
    r"\bstd::vector\b": ("vector",),
    r"\bstd::(?:unique_ptr|shared_ptr|make_unique|make_shared)\b": ("memory",),
    r"\bstd::optional\b": ("optional",),
    r"\bstd::function\b": ("functional",),
    r"\bstd::(?:mutex|lock_guard|unique_lock|once_flag|call_once)\b": ("mutex",),
    r"\bstd::condition_variable\b": ("condition_variable",),
    r"\bstd::thread\b": ("thread",),
    r"\bstd::atomic\b": ("atomic",),
    r"\bstd::(?:map|multimap)\b": ("map",),
    r"\bstd::(?:unordered_map)\b": ("unordered_map",),
    r"\bstd::set\b": ("set",),
    r"\bstd::(?:memcpy|memset|strcmp|strlen|strerror|memcmp)\b": ("cstring",),
    r"\bstd::chrono\b": ("chrono",),
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
RAW = re.compile(r'R"(\w*)\(.*?\)\1"', re.S)   # kernel sources inside raw strings are not ours to judge


def includes(path, seen):
    """Every header a file includes itself or through project headers (transitively)."""
    if path in seen or not path.exists():
        return set()
    seen.add(path)
    found = set()
    for kind, name in INCLUDE.findall(path.read_text(errors="replace")):
        found.add(name)
        if kind == '"':
            found |= includes(ROOT / name, seen)
    return found


def main():
    findings = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            # Kernel sources (the corpus, example and CLI-test kernels) get kc_cpu.h prepended; .inc
            # fragments are judged with the file that includes them.
            if path.suffix not in (".cpp", ".h") or {"corpus", "kernels", "cli"} & set(path.parts):
                continue
            text = RAW.sub('""', COMMENT.sub("", path.read_text(errors="replace")))
            have = includes(path, set())
            for pattern, headers in NEEDS.items():
                m = re.search(pattern, text)
                if m and not any(h in have for h in headers):
                    findings.append(f"{path.relative_to(ROOT)}: uses {m.group(0)} but does not include <{headers[0]}>")
    for f in findings:
        print(f)
    print(f"check_includes: {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
