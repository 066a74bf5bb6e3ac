"""benchmarks/model_shapes.py's report (model_report.py): slices merged in table order (a later slice's row wins),
the summary against the [5/7] yardsticks, and the bytes of ops that read less than their inputs."""
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import model_cases as mc  # noqa: E402
import model_report as mr  # noqa: E402
import model_shapes as ms  # noqa: E402

ENV = dict(date="2026-12-04", torch="x", device="cuda", device_name="GPU", commit="abc", smoke=False)


def row(model, call, method, ms_, pct, dtype="float32", mode="fwd", hits=None):
    r = dict(ENV, model=model, call=call, op=call, shape=[4, 4], table_shape=[4, 4], dtype=dtype,
             mode=mode, method=method, median_ms=ms_, pct_copy=pct, gbps=1.0, bytes=1)
    if method == "kernelcraft":
        r["kc"] = dict(calls=4, hits=4 if hits is None else hits, misses=0, fallbacks=0)
    return r


def write(d, rows):
    d.mkdir()
    for method, name in (("eager", "eager"), ("compile", "compile"), ("kernelcraft", "serve")):
        with open(d / f"{name}.jsonl", "w") as f:
            for r in rows:
                if r["method"] == method:
                    f.write(json.dumps(r) + "\n")


def case_rows(model, call, eager, compile_, kc, eager_pct):
    return [row(model, call, "eager", eager, eager_pct), row(model, call, "compile", compile_, 50),
            row(model, call, "kernelcraft", kc, 50)]


def test_merge_keeps_table_order_and_the_later_slice(tmp_path):
    first, later = mc.CASES[0], mc.CASES[5]
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, case_rows(later.model, mc.label(later), 1.0, 1.0, 1.0, 50))
    write(b, case_rows(first.model, mc.label(first), 1.0, 1.0, 0.5, 50)
          + case_rows(later.model, mc.label(later), 1.0, 1.0, 0.25, 50))
    rows = mr.load_rows([str(a), str(b)])
    keys = list(rows)
    assert [k[1] for k in keys] == [mc.label(first), mc.label(later)]   # CASES order, not file order
    assert rows[keys[1]]["kernelcraft"]["median_ms"] == 0.25             # b's row replaced a's


def test_summary_counts_the_yardsticks():
    rows = {}
    def add(name, eager, compile_, kc, pct):
        for r in case_rows("m", name, eager, compile_, kc, pct):
            rows.setdefault(("m", name, (4, 4), "float32", "fwd"), {})[r["method"]] = r
    add("fast", 0.2, 0.1, 0.05, 30)       # 2x compile, eager weak
    add("tie", 0.2, 0.1, 0.1, 90)         # = compile, eager strong: not in the geomean
    add("slow", 0.2, 0.1, 0.25, 40)       # 0.4x compile and below eager
    add("tiny", 0.01, 0.1, 0.5, 10)       # eager under 50 us: not counted at all
    (line,) = [l for l in mr.summary(rows) if l.startswith("- fwd")]
    assert "3 rows" in line and "on 2 (67%)" in line
    assert "geomean vs compile where eager < 70% of copy: 0.89x over 2 rows" in line   # sqrt(2 * 0.4)
    assert "below 0.98x eager: slow 4x4 float32 (0.80x)" in line


def test_moved_bytes_uses_the_ops_own_read_count():
    x, t = torch.empty(8, 1000, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.long)
    out = torch.empty((), dtype=torch.bfloat16)
    reads = mc.OPS["nll_loss"].reads
    assert reads([x, t]) == 8 * 32 + 8 * 8                    # a sector a row, not the whole row
    assert ms.moved_bytes([x, t], [out], (0,), "fwd", reads) == reads([x, t]) + 2
    # fwd+bwd: the output's gradient read, the rows read again, the input's gradient written
    full = ms.moved_bytes([x, t], [out], (0,), "fwd+bwd", reads)
    assert full == 2 * reads([x, t]) + 2 * 2 + x.numel() * 2
    # ops without a count read every input
    assert ms.moved_bytes([x, t], [out], (0,), "fwd") == x.numel() * 2 + 8 * 8 + 2
