"""Summarises benchmarks/train_perf.sh's output directory: loss curves, step times, per-key results.

    python3 benchmarks/compare_train.py OUT_DIR      (prints JSON and a table; writes summary.json)
"""
import json
import os
import statistics
import sys

d = sys.argv[1]


def load(name):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) else None


def med_ms(run, skip=10):
    t = run["step_s"][skip:]
    return 1e3 * statistics.median(t)


eager, steady = load("eager.json"), load("kc_steady.json")
eager_long, during, steady_long = load("eager_long.json"), load("kc_during.json"), load("kc_steady_long.json")
out = {}
if eager and steady:
    rel = [abs(a - b) / abs(a) for a, b in zip(eager["losses"], steady["losses"])]
    out["loss"] = {"steps": len(rel), "max_rel_diff": max(rel), "final_eager": eager["losses"][-1],
                   "final_kernelcraft": steady["losses"][-1]}
    out["waited"] = steady.get("waited")
if eager_long and during:
    out["during_evolution"] = {"eager_ms": med_ms(eager_long), "kernelcraft_ms": med_ms(during),
                               "slowdown": med_ms(during) / med_ms(eager_long) - 1}
if eager_long and steady_long:
    out["steady_state"] = {"eager_ms": med_ms(eager_long), "kernelcraft_ms": med_ms(steady_long),
                           "speedup": med_ms(eager_long) / med_ms(steady_long)}
    st = steady_long.get("status", {})
    out["steady_counters"] = {k: {"hits": v["hits"], "misses": v["misses"], "fallbacks": v["fallbacks"]}
                              for k, v in st.get("ops", {}).items()}
keys = []
p = os.path.join(d, "records_full.jsonl")
if os.path.exists(p):
    dec = json.JSONDecoder()
    text = open(p).read()
    i = 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        r, i = dec.raw_decode(text, i)
        m = r.get("meta", {})
        row = {"op": r["op"], "state": r["state"], "key": r["key"]}
        if r["state"] == "served":
            row.update(eager_us=1e3 * m["timing"]["eager_median_ms"], kernel_us=1e3 * m["timing"]["median_ms"],
                       speedup=m["timing"]["speedup"], family=m["candidate"]["family"], knobs=m["candidate"]["knobs"])
        else:
            row.update(eager_us=1e3 * m.get("eager_median_ms", 0), best_candidate_us=1e3 * m.get("best_candidate_ms", 0))
        keys.append(row)
out["keys"] = keys
json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in out.items() if k != "keys"}, indent=1))
for r in keys:
    print(f"{r['op']:<36} {r['state']:<10} eager {r.get('eager_us', 0):9.1f} us  "
          f"kernel {r.get('kernel_us', r.get('best_candidate_us', 0)):9.1f} us  x{r.get('speedup', 0):.2f}")
