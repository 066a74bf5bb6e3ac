"""The report of benchmarks/model_shapes.py: the table (docs/PERF.md's rows) and the issue's
yardsticks from the rows a run wrote (eager.jsonl, compile.jsonl, serve.jsonl in its --out)."""
import json
import math
import os
import sys

from eager_ops import COPY_BW
from model_cases import CASES, MODES, label


def load_rows(outs):
    """{(model, call, table shape, dtype, mode): {method: row}} from the run directories `outs`
    (a later one's row replaces an earlier one's), in the cases' table order."""
    rows = {}
    for out in outs:
        for name in ("eager", "compile", "serve"):
            path = os.path.join(out, f"{name}.jsonl")
            for line in open(path) if os.path.exists(path) else []:
                r = json.loads(line)
                key = (r["model"], r["call"], tuple(r["table_shape"]), r["dtype"], r["mode"])
                rows.setdefault(key, {})[r["method"]] = r
    order = {(c.model, label(c)): i for i, c in enumerate(CASES)}
    rank = lambda k: (order.get(k[:2], len(order)), k[2], MODES.index(k[4]) if k[4] in MODES else 9, k[3] != "float32")
    return dict(sorted(rows.items(), key=lambda kv: rank(kv[0])))


def header(rows):
    seen = lambda k: ", ".join(sorted({r[k] for by in rows.values() for r in by.values()}))
    # the copy bandwidths the rows were judged by (rows from before it was measured: the H200's)
    bws = ", ".join(sorted({f"{r.get('copy_bw', COPY_BW) / 1e12:.2f}" for by in rows.values() for r in by.values()}))
    smoke = any(r["smoke"] for by in rows.values() for r in by.values())
    return [f"Date {seen('date')}; {seen('device_name')}; torch {seen('torch')}; kernelcraft commit "
            f"`{seen('commit')}`. `benchmarks/model_shapes.py`" + (" --smoke: tiny shapes, not performance "
                                                                   "figures." if smoke else "."),
            "Timing: L2 flushed (256 MB write) before each call, CUDA events, median (CPU: perf_counter "
            "medians). kernelcraft: the library loaded, cache pre-warmed (record, evolve), read-only.",
            f"GB/s: bytes moved (lower bound; fwd+bwd adds an estimate of the backward) / kernelcraft time; "
            f"% copy: of {bws} TB/s (a 512 MiB copy measured on the GPU). kc vs X: X's time / "
            "kernelcraft's (>1: kernelcraft faster). "
            "served: hits / intercepted calls in the timed calls (and bench's 3 warm-ups)."]


def _ms(r):
    if r is None:
        return "-"
    return "failed" if "error" in r else f"{r['median_ms']:.4g}"


def _ratio(r, kc):
    ok = r and kc and "error" not in r and "error" not in kc
    return f"{r['median_ms'] / kc['median_ms']:.2f}x" if ok else "-"


def _shape(by):
    return "x".join(map(str, next(iter(by.values()))["shape"]))


def table_line(key, by):
    model, call, _, dtype, mode = key
    kc = by.get("kernelcraft")
    timed = kc and "error" not in kc
    bw = f"{kc['gbps']:.0f} | {kc['pct_copy']:.0f}%" if timed else "- | -"
    served = "-"
    if timed and kc["kc"]["calls"]:
        served = f"{100 * kc['kc']['hits'] / kc['kc']['calls']:.0f}%"
    elif timed:
        served = "not intercepted"
    return (f"| {model} | {call} | {_shape(by)} | {dtype} | {mode} | {_ms(by.get('eager'))} | "
            f"{_ms(by.get('compile'))} | {_ms(kc)} | {bw} | {_ratio(by.get('eager'), kc)} | "
            f"{_ratio(by.get('compile'), kc)} | {served} |")


def summary(rows):
    """The issue's yardsticks over the rows timed all three ways, per mode: among the rows where
    eager takes over 50 us, the share where kernelcraft is at least as fast as torch.compile; the
    geometric mean of kernelcraft vs compile where eager runs below 70% of the copy bandwidth; and
    every row below 0.98x eager."""
    ok = lambda r: r is not None and "error" not in r
    lines = ["", "Summary (rows timed eager, compile and kernelcraft; eager over 50 us):", ""]
    for mode in MODES:
        sel = [(k, by) for k, by in rows.items() if k[4] == mode
               and all(ok(by.get(m)) for m in ("eager", "compile", "kernelcraft"))
               and by["eager"]["median_ms"] > 0.05]
        if not sel:
            continue
        vs = lambda by, m: by[m]["median_ms"] / by["kernelcraft"]["median_ms"]
        wins = sum(vs(by, "compile") >= 1.0 for _, by in sel)
        weak = [vs(by, "compile") for _, by in sel if by["eager"]["pct_copy"] < 70]
        slow = [f"{k[1]} {_shape(by)} {k[3]} ({vs(by, 'eager'):.2f}x)" for k, by in sel if vs(by, "eager") < 0.98]
        geo = f"{math.exp(sum(map(math.log, weak)) / len(weak)):.2f}x over {len(weak)} rows" if weak else "no rows"
        lines.append(f"- {mode}: {len(sel)} rows; kernelcraft >= torch.compile on {wins} ({100 * wins / len(sel):.0f}%); "
                     f"geomean vs compile where eager < 70% of copy: {geo}; below 0.98x eager: "
                     + (", ".join(slow) if slow else "none"))
    return lines if len(lines) > 3 else []


def report(a):
    rows = load_rows(a.merge or [a.out])
    if not rows:
        print(f"report: no eager, compile or serve rows in {a.out}", file=sys.stderr)
        return
    lines = header(rows) + ["", "| model | call | shape | dtype | mode | eager ms | compile ms | kernelcraft ms | "
                                "kc GB/s | kc % copy | kc vs eager | kc vs compile | served |",
                            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [table_line(key, by) for key, by in rows.items()]
    lines += summary(rows)
    failures = [f"- {r['method']}: {key[0]} {key[1]} {_shape(by)} {key[3]} {key[4]}: "
                f"{r['error']}" for key, by in rows.items() for r in by.values() if "error" in r]
    if failures:
        lines += ["", "Failures:"] + failures
    text = "\n".join(lines) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    print(text, end="")
