#!/usr/bin/env python3
"""Verification margins per corpus kernel: how far inside its error budget an honest kernel is,
and how far outside a rejected one is, from `kernelcraft verify --json` verdicts.

Input: run_corpus.py's --json-out file (its "results" carry each entry's verdict), or one or more
files each holding one `kernelcraft verify --json` verdict (the entry name is the file's stem).
The ratio is error / allowed error at the worst element under the numerics stage's tolerance
(evolve/verify/numerics.h attach_tolerance): <= 1 passes. For a passed kernel: the largest ratio over
every set and output (and which); for a kernel rejected at numerics on the error budget: the ratio
at its first failing output. "eager" is eager's own ratio there (how close eager is to the cap).
Prints a Markdown table (docs/DEFECTS.md "Verification margins"). Standard library only.

  python3 tests/corpus/run_corpus.py --backend cpu --cli build/torch_ops/kernelcraft --json-out /tmp/c.json
  python3 tests/corpus/margins.py /tmp/c.json
"""
import json
import math
import os
import sys


def stages_of(verdict):
    """Every stage list in a verdict (one per call/shape when the verdict has several)."""
    if not isinstance(verdict, dict):
        return []
    if isinstance(verdict.get("calls"), list):
        return [(c.get("shape", ""), c.get("stages", [])) for c in verdict["calls"] if isinstance(c, dict)]
    return [(verdict.get("shape", ""), verdict.get("stages", []))]


def margin(verdict):
    """(kind, ratio, eager_ratio, where) for a verdict; kind: inside / outside / other."""
    best = None
    for shape, stages in stages_of(verdict):
        for s in stages or []:
            if not isinstance(s, dict) or s.get("name") not in ("numerics", "recheck"):
                continue
            ev = s.get("evidence") or {}
            if s.get("outcome") == "passed" and s.get("name") == "numerics":
                for st in ev.get("sets", []):
                    for j, o in enumerate(st.get("outputs", [])):
                        r = o.get("ratio")
                        if isinstance(r, (int, float)) and (best is None or (best[0] == "inside" and r > best[1])):
                            best = ("inside", r, o.get("eager_ratio"), "%s %s out%d" % (shape, st.get("set"), j))
            elif s.get("outcome") not in ("passed", None) and ev.get("check") == "error budget":
                r = ev.get("ratio")
                where = "%s %s %s %s" % (shape, s.get("name"), ev.get("set", ""), ev.get("output", ""))
                return ("outside", r if isinstance(r, (int, float)) else float("nan"), None, where)
            elif s.get("outcome") not in ("passed", None):
                return ("other", None, None, "%s %s: %s" % (shape, s.get("name"), ev.get("check", s.get("summary", ""))))
    return best or ("other", None, None, "no numerics stage")


def fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return str(x)
    return "%.3g" % x


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        if isinstance(data, dict) and isinstance(data.get("results"), list):
            for r in data["results"]:
                rows.append((r.get("name"), r.get("class", ""), r.get("op", ""), r.get("verdict")))
        else:
            rows.append((os.path.splitext(os.path.basename(p))[0], "", "", data))
    return rows


def final_stage(verdict):
    """The stage that rejected the verdict ("" if it verified)."""
    if not isinstance(verdict, dict) or verdict.get("verified"):
        return ""
    return verdict.get("stage", "") or "?"


    return rows


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print("| class | kernel | op | margin | error / budget | eager / budget | where |")
    print("|---|---|---|---|---|---|---|")
    for name, cls, op, verdict in load(argv[1:]):
        kind, r, e, where = margin(verdict)
        label = {"inside": "passed (inside)", "outside": "rejected (outside)"}.get(kind, "n/a")
        rejected_at = final_stage(verdict)
        if kind == "inside" and rejected_at:
            label = "numerics passed (inside), rejected at " + rejected_at
        elif kind == "other":
            label = "rejected elsewhere"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (cls, name, op, label, fmt(r), fmt(e), where))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
