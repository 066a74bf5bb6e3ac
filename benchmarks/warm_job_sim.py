#!/usr/bin/env python3
"""Time to a warm distributed job, on paper: a discrete-event simulation of N nodes warming K
missed keys through kernelcraft's job-wide coordination (dispatcher/coordinator.h), against
the same job without coordination (every node searches every key itself). docs/SCALING.md has the
model, its assumptions, the check against measured runs and the tables.

What is modelled, as the code does it:
  - a node's coordinator runs one round every --poll-ms after the previous round ended
    (job_poll_ms); a round is tend_owned (publish ended searches, then renew_due: renew every
    owned claim not renewed for lease/4), tend_waiting (one get per waiting key; compareSet a free
    or stale claim while the node holds fewer than --workers claims) and read_records (add(0), one
    get per new record, then an import of --import-s each, on the same thread, with renew_due after
    every import, so an import backlog delays the next round and its claims but not the renewals;
    --no-renew-between-imports leaves renew_due out of read_records, as the code did before);
  - store calls are sequential per node: each costs --rtt-ms plus --store-op-us of server time for
    every node in a round at the same moment (a single-threaded TCPStore, roughly);
  - the node's worker runs --workers searches at once (evolve_jobs), takes job files oldest first,
    and an idle worker thread looks for a job every 0.2 s (worker_daemon.cpp); each search gets
    gpu_share / workers, so --duty-fraction of a search's time stretches with --workers;
  - a claim unchanged for a lease by a watcher's own clock is taken over and searched again from
    the start; a killed node (--kill) stops renewing, publishing and searching.
Not modelled: store failures and timeouts (job_store_timeout_ms), refused imports, eager_best vs
served (both publish a record), claims racing inside one instant (a round's store calls between
imports are applied at once; the loser of a real race pays one more call), worker idle exit.

    python3 benchmarks/warm_job_sim.py --nodes 1,2,4,8 --keys 10,100 --search lognormal:25:0.5

The model itself is warm_job_model.py; this file is its command line, the check against the
measured runs (--check) and the tables.
"""
import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from warm_job_model import PICKUP_S, Job, Settings, ideal, key_times, parse_search, simulate, start_times  # noqa: E402,F401


def parse_kill(text, s, search):
    """'NODE@SECONDS', or 'NODE': halfway through that node's first search."""
    node, _, at = text.partition("@")
    if at:
        return int(node), float(at)
    first = key_times(dataclasses.replace(s, kill=None), search)[int(node)][0]
    return int(node), start_times(s)[int(node)] + s.worker_start_s + first / 2


def rows(args, search):
    out = []
    for k in args.keys:
        for n in args.nodes:
            s = settings_of(args, n, k)
            if args.kill is not None:
                s = dataclasses.replace(s, kill=parse_kill(args.kill, s, search))
            if s.kill and s.kill[0] >= n:
                continue
            r = simulate(s, search)
            c, u = r["coordinated"], r["uncoordinated"]
            out.append({"nodes": n, "keys": k, "uncoordinated_s": u["warm_s"], "coordinated_s": c["warm_s"],
                        "speedup": u["warm_s"] / c["warm_s"] if c["warm_s"] else 1.0, "ideal_s": r["ideal_s"],
                        "search_busy_mean_s": sum(c["search_busy_s"]) / len(c["search_busy_s"]),
                        "search_busy_max_s": max(c["search_busy_s"]), "import_busy_s": max(c["import_busy_s"]),
                        "uncoordinated_busy_s": max(u["search_busy_s"]), "searches": c["searches"],
                        "taken_over": c["taken_over"], "store_calls": c["store_calls"]})
    return out


def settings_of(args, n, k):
    return Settings(nodes=n, keys=k, workers=args.workers, ranks_per_node=args.ranks_per_node,
                    poll_s=args.poll_ms / 1000, lease_s=args.lease_s, rtt_s=args.rtt_ms / 1000,
                    store_op_s=args.store_op_us / 1e6, import_s=args.import_s, worker_start_s=args.worker_start_s,
                    key_budget_s=args.key_budget_s, duty_fraction=args.duty_fraction, skew_s=args.skew_s,
                    node_jitter=args.node_jitter, seed=args.seed,
                    coordinate=True if args.force_store else None,
                    renew_between_imports=not args.no_renew_between_imports)


# Measured on the 2-core development machine, one run of tests/python/test_distributed.py
# (file birth and change times in the tests' cache directories; seconds from the first job file).
# Job times are a job file's life: worker start, evaluation child, eager timing, search, promotion.
MEASURED = {
    # job_poll_ms 200, job_lease_s 4; "last_end_s": the last job file removed (the slower search)
    "2 ranks": {"jobs": [7.904, 9.760], "last_end_s": 9.768, "warm_s": 10.137},
    "3 ranks": {"jobs": [7.520, 7.944], "last_end_s": 7.964, "warm_s": 8.344},
    # job_lease_s 3. Node A claims its key at 0 and is killed at about 3.34 s (inferred: node B
    # starts waiting then); B takes the key over at 6.300 s (its job file appears) and its search
    # takes 10.72 s.
    "kill": {"kill_s": 3.34, "b_start_s": 2.27, "job_b": 10.720, "takeover_s": 6.300, "warm_s": 17.020},
}
CHECK_IMPORT_S = 0.1   # fitted: records were eager_best (no binary to rebuild); see docs/SCALING.md


def check_measured():
    """The simulation of the measured runs, with their settings: [(what, measured, simulated)].
    The job times are inputs (from the same run), so what is checked is the protocol's own cost:
    publish, polls and import after the last search, and the take-over after a lease."""
    out = []
    cpu = dict(poll_s=0.2, lease_s=4.0, worker_start_s=0.0, import_s=CHECK_IMPORT_S, rtt_s=1e-4)
    for name, nodes in (("2 ranks", 2), ("3 ranks", 3)):
        m = MEASURED[name]
        s = Settings(nodes=nodes, keys=2, **cpu)
        r = simulate(s, parse_search("list:" + ",".join(str(v) for v in m["jobs"])))
        warm = r["coordinated"]["warm_s"]
        out.append((f"torchrun {name}, 2 keys: time to a warm job", m["warm_s"], warm))
        out.append((f"  of which after the last search ended", m["warm_s"] - m["last_end_s"],
                    warm - max(m["jobs"])))
        out.append(("  the same job without coordination (not measured)", None, r["uncoordinated"]["warm_s"]))
    m = MEASURED["kill"]
    s = Settings(nodes=2, keys=1, **dict(cpu, lease_s=3.0), kill=(0, m["kill_s"]))
    job = Job(s, key_times(s, parse_search(f"fixed:{m['job_b']}")), [0.0, m["b_start_s"]])
    warm = job.run()["warm_s"]
    out.append(("kill test: key taken over, after the kill", m["takeover_s"] - m["kill_s"],
                warm - m["job_b"] - m["kill_s"]))
    out.append(("kill test: key served on the survivor", m["warm_s"], warm))
    return out


def check_table(out):
    lines = ["| what | measured s | simulated s | difference |", "|---|---|---|---|"]
    for what, meas, sim in out:
        diff = "" if meas is None else f"{sim - meas:+.2f} s ({(sim - meas) / meas * 100:+.1f}%)"
        lines.append(f"| {what} | {'' if meas is None else f'{meas:.2f}'} | {sim:.2f} | {diff} |")
    return "\n".join(lines)


COLUMNS = [("nodes", "nodes", "d"), ("keys", "keys", "d"), ("uncoordinated_s", "no coordination s", ".1f"),
           ("coordinated_s", "coordinated s", ".1f"), ("speedup", "speed-up", ".2f"), ("ideal_s", "ideal s", ".1f"),
           ("search_busy_mean_s", "search busy/node s (mean)", ".1f"), ("search_busy_max_s", "(max)", ".1f"),
           ("import_busy_s", "import busy/node s", ".1f"), ("searches", "searches", "d"),
           ("taken_over", "taken over", "d")]


def table(out, fmt):
    if fmt == "json":
        return json.dumps(out, indent=1)
    head = [c[1] for c in COLUMNS]
    body = [[format(r[c[0]], c[2]) for c in COLUMNS] for r in out]
    if fmt == "md":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(line, widths)) for line in [head] + body)


def int_list(text):
    return [int(v) for v in text.split(",") if v]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int_list, default=[1, 2, 4, 8, 16], help="node counts (1,2,4,...)")
    p.add_argument("--keys", type=int_list, default=[10, 100], help="missed keys of the job")
    p.add_argument("--search", default="lognormal:25:0.5",
                   help="search time of a key: fixed:S | lognormal:MEDIAN:SIGMA | empirical:S1,S2,...")
    p.add_argument("--workers", type=int, default=1, help="evolve_jobs (1)")
    p.add_argument("--ranks-per-node", type=int, default=1, help="ranks sharing a node's cache (1)")
    p.add_argument("--poll-ms", type=float, default=1000, help="job_poll_ms (1000)")
    p.add_argument("--lease-s", type=float, default=60, help="job_lease_s (60)")
    p.add_argument("--rtt-ms", type=float, default=0.2, help="store round trip (0.2, assumption)")
    p.add_argument("--store-op-us", type=float, default=20, help="store server time per call (20, assumption)")
    p.add_argument("--import-s", type=float, default=1.0, help="one import's rebuild (1.0, assumption)")
    p.add_argument("--worker-start-s", type=float, default=0.5, help="worker process start (0.5, assumption)")
    p.add_argument("--key-budget-s", type=float, default=600, help="evolve_key_budget_s (600)")
    p.add_argument("--duty-fraction", type=float, default=1.0,
                   help="part of a search stretched by gpu_share/workers when workers > 1 (1.0)")
    p.add_argument("--skew-s", type=float, default=0.0, help="nodes' first misses spread over this long")
    p.add_argument("--node-jitter", type=float, default=0.0, help="lognormal sigma between nodes' search times")
    p.add_argument("--kill", help="NODE@SECONDS or NODE (halfway through its first search): that node dies")
    p.add_argument("--no-renew-between-imports", action="store_true",
                   help="renew claims only in tend_owned, not after every import (the code before the fix)")
    p.add_argument("--force-store", action="store_true", help="coordinate even a 1-process job (job_store=host:port)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--format", choices=["text", "md", "json"], default="text")
    p.add_argument("--check", action="store_true", help="simulate the measured CPU runs and compare")
    args = p.parse_args(argv)
    if args.check:
        print(check_table(check_measured()))
        return 0
    search = parse_search(args.search)
    print(table(rows(args, search), args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
