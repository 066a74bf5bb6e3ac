#!/usr/bin/env python3
"""The report page in headless Chromium, from disk with no server: its script ran to the end
(body data-rendered="ok"), recorded no error (the page's window.onerror writes into
#kc-errors), and the rendered DOM shows the speedups stored in the cache. A copy of the page with
a broken script must show the error, so a silent harness cannot pass. Exits 77 (ctest: skipped)
where no chromium is installed; scripts/setup.sh installs Debian's `chromium`.

    test_report_chromium.py PATH/TO/kernelcraft CACHE_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from report_checks import finish, stored_speedup

KC, CACHE = sys.argv[1], sys.argv[2]


def browser():
    for name in (os.environ.get("KERNELCRAFT_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def dump_dom(exe, page, profile):
    # --no-sandbox: CI runs as root in a container; a private profile keeps $HOME untouched.
    p = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={profile}", "--dump-dom", "file://" + page],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0 or "<body" not in p.stdout:
        sys.exit(f"chromium failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


def rendered(dom):
    m = re.search(r'<body[^>]*\bdata-rendered="([^"]*)"', dom)
    errors = re.search(r'<pre id="kc-errors">(.*?)</pre>', dom, re.S)
    return (m.group(1) if m else None), (errors.group(1) if errors else None)


def stored_speedups():
    """Speedups as the cache's records state them (what the page must show)."""
    out = []
    for r in json.loads(subprocess.check_output([KC, "--cache-dir", CACHE, "--json", "cache", "ls"])):
        meta = json.loads(subprocess.check_output([KC, "--cache-dir", CACHE, "--json", "cache", "show", r["key"]]))["meta"]
        if stored_speedup(meta):
            out.append(stored_speedup(meta))
    return out


def main():
    exe = browser()
    if exe is None:
        print("skipped: no chromium on PATH (apt-get install chromium)")
        return 77
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "report.html")
        subprocess.run([KC, "--cache-dir", CACHE, "report", "--out", page], check=True, capture_output=True)
        dom = dump_dom(exe, page, os.path.join(tmp, "profile"))
        state, errors = rendered(dom)
        if state != "ok" or errors != "":
            fails.append(f"page not rendered cleanly: data-rendered={state!r}, errors={errors!r}")
        speedups = stored_speedups()
        if not speedups:
            fails.append("the cache holds no speedup to look for")
        for x in speedups:
            if "%.2fx" % x not in dom:
                fails.append(f"speedup {x:.2f}x from the cache is not in the rendered page")
        # The control: a script error must reach the page's error list.
        with open(page, encoding="utf-8") as f:
            broken = f.read().replace("document.getElementById('kc-data')", "document.getElementById('kc-data').nope()")
        with open(os.path.join(tmp, "broken.html"), "w", encoding="utf-8") as f:
            f.write(broken)
        state, errors = rendered(dump_dom(exe, os.path.join(tmp, "broken.html"), os.path.join(tmp, "profile2")))
        if state != "error" or not errors or "script error" not in errors:
            fails.append(f"a broken script went unnoticed: data-rendered={state!r}, errors={errors!r}")
    return finish("test_report_chromium.py", fails, f" ({exe})")


if __name__ == "__main__":
    sys.exit(main())
