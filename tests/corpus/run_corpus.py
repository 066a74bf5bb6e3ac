#!/usr/bin/env python3
"""Runs the defect corpus (manifest.json) through `kernelcraft verify` and prints a detection table.

Each entry is verified at its manifest shape(s); the verdict (exit 0 verified, 1 rejected, other =
no verdict) is compared with the entry's "expect". Exit status: 0 when every honest kernel passes
and every bad kernel is rejected; 1 when any honest kernel is rejected or any bad kernel passes;
2 when the CLI could not be run or gave no verdict for some entry (usage/infrastructure error,
crash, timeout). With --backend cuda and no working nvidia-smi it prints "skipped: no GPU" and
exits 0. Standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def have_gpu():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def last_json_object(text):
    """The verdict object: the whole stdout if it parses, else the last line or block that does."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = text.splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].lstrip().startswith("{"):
            try:
                return json.loads("\n".join(lines[start:]))
            except ValueError:
                continue
    return None


def summary_of(verdict):
    """One line on why: the rejecting stage's summary when the verdict lists stages."""
    if not isinstance(verdict, dict):
        return ""
    for k in ("summary", "error"):
        if isinstance(verdict.get(k), str) and verdict[k]:
            return verdict[k]
    stage = verdict.get("stage", "")
    for s in verdict.get("stages", []) or []:
        if isinstance(s, dict) and s.get("name") == stage and s.get("summary"):
            return s["summary"]
    ev = verdict.get("evidence")
    if isinstance(ev, dict) and ev:
        for k in ("summary", "error", "why", "message"):
            if isinstance(ev.get(k), str):
                return ev[k]
        return json.dumps(ev, sort_keys=True)[:160]
    return ""


def verify_cmd(cli, entry):
    backend = entry["backend"]
    ext = ".cu" if backend == "cuda" else ".cpp"
    base = os.path.join(HERE, backend, entry["name"])
    cmd = [cli, "verify", "--op", entry["op"]]
    for shape in entry["shapes"]:
        cmd += ["--shape", "x".join(str(d) for d in shape)]
    cmd += ["--dtype", entry.get("dtype", "f32")]
    if entry.get("args"):
        cmd += ["--args", json.dumps(entry["args"], separators=(",", ":"))]
    cmd += ["--source", base + ext, "--launch", base + ".json", "--backend", backend, "--json"]
    return cmd


def run_entry(cli, entry, timeout):
    cmd = verify_cmd(cli, entry)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           universal_newlines=True, errors="replace")
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, e.stdout or "", "timeout after %ds" % timeout
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
    except OSError as e:
        rc, out, err = None, "", str(e)
    secs = time.time() - t0
    verdict = last_json_object(out)
    if rc == 0:
        got = "pass"
    elif rc == 1:
        got = "reject"
    else:
        got = "error"
    stage = verdict.get("stage", "") if isinstance(verdict, dict) else ""
    why = summary_of(verdict)
    if got == "error":
        tail = (err or out).strip().splitlines()
        why = ("rc=%s: " % rc) + (tail[-1] if tail else "no output")
    if entry["expect"] == got:
        result = "ok"
    elif got == "error":
        result = "ERROR"
    elif entry["expect"] == "pass":
        result = "FALSE-REJECT"
    else:
        result = "MISSED"
    return {"name": entry["name"], "backend": entry["backend"], "op": entry["op"], "class": entry["class"],
            "expect": entry["expect"], "expected_stage": entry.get("stage", ""), "got": got, "stage": stage,
            "result": result, "rc": rc, "seconds": round(secs, 2), "why": why, "command": cmd,
            "verdict": verdict, "stderr_tail": "\n".join((err or "").strip().splitlines()[-20:])}


def print_table(rows):
    cols = [("class", 7), ("name", 34), ("expected", 8), ("got", 6), ("stage", 10), ("(exp.)", 10), ("result", 12)]
    print("  ".join(h.ljust(w) for h, w in cols) + "  why")
    for r in rows:
        vals = [r["class"], r["name"], r["expect"], r["got"], r["stage"] or "-", r["expected_stage"] or "-", r["result"]]
        print("  ".join(str(v)[:w].ljust(w) for v, (_, w) in zip(vals, cols)) + "  " + r["why"][:120])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--cli", default=os.environ.get("KERNELCRAFT_CLI"), help="the kernelcraft executable")
    ap.add_argument("--manifest", default=os.path.join(HERE, "manifest.json"))
    ap.add_argument("--json-out", help="write every entry's result and verdict here")
    ap.add_argument("--only", action="append", default=[], help="run only these entry names (repeatable)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per entry")
    ap.add_argument("--jobs", type=int, default=1, help="entries verified concurrently")
    a = ap.parse_args()

    if a.backend == "cuda" and not have_gpu():
        print("skipped: no GPU (nvidia-smi absent or failing)")
        return 0
    if not a.cli:
        print("run_corpus: no CLI (--cli or KERNELCRAFT_CLI)", file=sys.stderr)
        return 2
    with open(a.manifest) as f:
        manifest = json.load(f)
    entries = [e for e in manifest if e["backend"] == a.backend and (not a.only or e["name"] in a.only)]
    if not entries:
        print("run_corpus: no manifest entries for backend %s" % a.backend, file=sys.stderr)
        return 2

    rows = []
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for r in pool.map(lambda e: run_entry(a.cli, e, a.timeout), entries):
            rows.append(r)
            print("%-34s %-7s -> %-6s %-10s %s" % (r["name"], r["expect"], r["got"], r["stage"] or "-", r["result"]),
                  flush=True)
    print()
    print_table(rows)

    count = lambda res: sum(1 for r in rows if r["result"] == res)
    honest = [r for r in rows if r["expect"] == "pass"]
    bad = [r for r in rows if r["expect"] == "reject"]
    summary = {"backend": a.backend, "entries": len(rows),
               "bad_rejected": sum(1 for r in bad if r["got"] == "reject"), "bad_total": len(bad),
               "honest_passed": sum(1 for r in honest if r["got"] == "pass"), "honest_total": len(honest),
               "missed": count("MISSED"), "false_rejects": count("FALSE-REJECT"), "errors": count("ERROR")}
    print("\n%(backend)s: bad kernels rejected %(bad_rejected)d/%(bad_total)d, honest kernels passed "
          "%(honest_passed)d/%(honest_total)d, missed %(missed)d, false rejects %(false_rejects)d, "
          "no verdict %(errors)d" % summary)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"summary": summary, "results": rows}, f, indent=1)
    if summary["missed"] or summary["false_rejects"]:
        return 1
    if summary["errors"]:
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
