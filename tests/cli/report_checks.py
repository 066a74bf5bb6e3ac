"""What tests/cli/test_report.py and test_report_chromium.py share: the speedup a record states,
read as its writer stored it, and the one-line verdict with its exit code."""
import sys


def stored_speedup(meta):
    """A record's speedup over eager as its meta states it (torch_ops/cli/report_data.cpp
    read_timing): the worker's timing, `cache put --verify`'s verification, or an eager_best
    record's best candidate. None where the record has no timing."""
    timing, ver = meta.get("timing"), meta.get("verification", {})
    if isinstance(timing, dict):
        return timing.get("speedup")
    if meta.get("best_candidate_ms"):
        return meta["eager_median_ms"] / meta["best_candidate_ms"]
    if ver.get("median_ms"):
        return ver["eager_median_ms"] / ver["median_ms"]
    return None


def finish(name, fails, note=""):
    """Prints each failure on stderr and one summary line; the exit code."""
    for f in fails:
        print("FAIL:", f, file=sys.stderr)
    print(f"{name}: {'all passed' if not fails else str(len(fails)) + ' failure(s)'}{note}")
    return 1 if fails else 0
