#!/usr/bin/env python3
"""`kernelcraft report` end to end on the cache tests/cli/make_report_cache.sh made: --json holds
every record's numbers as `cache show` / `search-state` give them, the page shows them and embeds
exactly the --json data, nothing in the page reaches the network, and mistakes exit 2 or 1.

    test_report.py PATH/TO/kernelcraft CACHE_DIR
"""
import json
import os
import re
import subprocess
import sys
import statistics
import tempfile

from report_checks import finish, stored_speedup

KC, CACHE = sys.argv[1], sys.argv[2]
FAILS = []
PEAKS = {}   # target -> the median copy bandwidth of its records (filled in main)


def run(*args, want=0):
    p = subprocess.run([KC, "--cache-dir", CACHE, *args], capture_output=True, text=True)
    if p.returncode != want:
        FAILS.append(f"kernelcraft {' '.join(args)} -> exit {p.returncode}, wanted {want}; stderr: {p.stderr}")
    return p


def check(ok, what):
    if not ok:
        FAILS.append(what)


def close(a, b):
    return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))


def check_key(k):
    show = json.loads(run("--json", "cache", "show", k["key"]).stdout)
    meta = show["meta"]
    check(k["op"] == show["op"], f"op of {k['key']}")
    want_state = show["state"] if show["state"] != "served" or meta["provenance"].get("verified") else "unverified"
    check(k["state"] == want_state, f"state of {k['key']}: {k['state']}, wanted {want_state}")
    want = stored_speedup(meta)
    check(want is None and k["timing"]["speedup"] is None or close(k["timing"]["speedup"], want),
          f"speedup of {k['key']}: {k['timing']['speedup']}, wanted {want}")
    stages = meta.get("verification", {}).get("stages", [])
    check([s["name"] for s in k["stages"]] == [s["name"] for s in stages], f"stages of {k['key']}")
    check(close(k["time"]["sanitizer_s"] * 1e3, sum(s["millis"] for s in stages if s["name"] == "sanitizer")),
          f"sanitizer time of {k['key']}")
    peak = PEAKS.get(k["key"].split("|")[1])
    gbs, frac = k["bandwidth"]["gb_per_s"], k["bandwidth"]["fraction_of_peak"]
    check(k["bandwidth"]["bytes"] and (frac is None if peak is None or gbs is None else close(frac, gbs / peak)),
          f"bandwidth of {k['key']}: {frac} of peak {peak}")
    st = subprocess.run([KC, "--cache-dir", CACHE, "--json", "search-state", k["key"]], capture_output=True, text=True)
    if st.returncode != 0:
        check(k["search"]["curve"] == [], f"a curve without a search state for {k['key']}")
        return
    tried = json.loads(st.stdout)["tried"]
    passed = [t["median_ms"] for t in tried if t["verdict"] == "passed"]
    curve = k["search"]["curve"]
    check(len(curve) == 1 + max(t["generation"] for t in tried), f"curve length of {k['key']}")
    check(close(curve[-1]["best_so_far_ms"], min(passed)), f"best time of {k['key']}: {curve[-1]}, wanted {min(passed)}")


def check_page(page, data):
    block = re.search(r'<script type="application/json" id="kc-data">(.*?)</script>', page, re.S)
    check(block is not None, "no data block in the page")
    if block:
        embedded = json.loads(block.group(1))
        for d in (embedded, data):
            d.pop("generated_at")
        check(embedded == data, "the page's data differs from --json")
    for k in data["keys"]:
        check(f'data-key="{k["key"]}"' in page, f"page lacks the row of {k['key']}")
        if k["timing"]["speedup"]:
            check("%.2fx" % k["timing"]["speedup"] in page, f"page lacks speedup {k['timing']['speedup']:.2f}x")
    check(page.count("<section class=\"key\"") == len(data["keys"]), "one section per key")
    check("<svg" in page and ("% of peak)" in page if PEAKS else "peak not measured" in page),
          "charts or the peak missing")
    # Self-contained: nothing fetched (the SVG namespace URI is a name, never loaded).
    for bad in ("src=", "<link", "@import", "url(", "href=\"http", "fetch("):
        check(bad not in page, f"the page references something outside itself: {bad}")


def main():
    data = json.loads(run("--json", "report").stdout)
    records = json.loads(run("--json", "cache", "ls").stdout)
    check(data["report_format"] == 1 and data["cache_dir"] == CACHE, "report header")
    check(sorted(k["key"] for k in data["keys"]) == sorted(r["key"] for r in records), "report keys != cache ls")
    check(data["cache"]["keys"] == len(records) and sum(o["keys"] for o in data["ops"]) == len(records), "totals")
    # A target's peak is the median of the copy bandwidths its records timed, none made up.
    copies = {}
    for k in data["keys"]:
        if k["bandwidth"]["copy_gb_s"]:
            copies.setdefault(k["key"].split("|")[1], []).append(k["bandwidth"]["copy_gb_s"])
    PEAKS.update({t: statistics.median(v) for t, v in copies.items()})
    check(data["peak"]["measured"] == bool(PEAKS) and
          {t: p["gb_per_s"] for t, p in data["peak"]["targets"].items()} == PEAKS, f"peaks {data['peak']} != {PEAKS}")
    check(bool(PEAKS), "no record of a real gauntlet run timed the copy bandwidth")
    check(any(k["search"]["curve"] for k in data["keys"]), "no key with a search curve")
    check(any(k["stages"] for k in data["keys"]), "no key with gauntlet stages")
    for k in data["keys"]:
        check_key(k)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.html")
        check("wrote " + out in run("report", "--out", out).stdout, "report --out does not say what it wrote")
        with open(out, encoding="utf-8") as f:
            page = f.read()
        check(page.startswith("<!DOCTYPE html>"), "not an HTML page")
        stdout_page = run("report").stdout   # the default: the page on stdout
        check(stdout_page.startswith("<!DOCTYPE html>") and stdout_page.count('<section class="key"') ==
              page.count('<section class="key"'), "report without --out does not print the same page")
        check_page(page, json.loads(run("--json", "report").stdout))
        run("report", "--out", os.path.join(tmp, "no", "such", "dir", "r.html"), want=1)
        empty = subprocess.run([KC, "--cache-dir", os.path.join(tmp, "none"), "--json", "report"],
                               capture_output=True, text=True)
        check(empty.returncode == 0 and json.loads(empty.stdout)["keys"] == [], "a missing cache is an empty report")
        check(not os.path.exists(os.path.join(tmp, "none")), "report created a cache")
    run("report", "extra", want=2)
    run("report", "--op", "relu", want=2)
    return finish("test_report.py", FAILS)


if __name__ == "__main__":
    sys.exit(main())
