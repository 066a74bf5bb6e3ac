#!/usr/bin/env python3
"""Time to a warm distributed job, on paper: a discrete-event simulation of N nodes warming K
missed keys through kernelcraft's job-wide coordination (dispatcher/coordinator.{h,cpp}), against
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
"""
import argparse
import bisect
import dataclasses
import heapq
import json
import math
import random
import sys

PICKUP_S = 0.2   # worker_daemon.cpp: an idle worker thread lists jobs/ every 200 ms


@dataclasses.dataclass(frozen=True)
class Settings:
    nodes: int = 2
    keys: int = 10
    workers: int = 1             # evolve_jobs: claims a node holds and searches its worker runs
    ranks_per_node: int = 1      # ranks sharing one node's cache: each claims `workers` keys
    poll_s: float = 1.0          # job_poll_ms
    lease_s: float = 60.0        # job_lease_s
    rtt_s: float = 2e-4          # one store round trip (assumption: same data centre)
    store_op_s: float = 2e-5     # the store's own time per call (assumption)
    import_s: float = 1.0        # rebuild of one imported record (assumption: one compile)
    worker_start_s: float = 0.5  # the worker process starting (torch-free; assumption)
    key_budget_s: float = 600.0  # evolve_key_budget_s
    duty_fraction: float = 1.0   # part of a search that stretches with gpu_share / workers
    skew_s: float = 0.0          # nodes reach their first miss spread over this many seconds
    node_jitter: float = 0.0     # lognormal sigma of one node's search time of a key vs another's
    kill: tuple | None = None    # (node, seconds): that node dies then
    renew_between_imports: bool = True   # read_records calls renew_due after every import
    coordinate: bool | None = None   # None: as the code decides (world size > 1)
    seed: int = 1


def parse_search(spec):
    """A key's search time as a function (rng, key index) -> seconds, from 'fixed:S',
    'lognormal:MEDIAN:SIGMA', 'empirical:S1,S2,...' (drawn with replacement) or 'list:S1,S2,...'
    (key i takes the i-th value, cycling: for replaying measured keys)."""
    kind, _, rest = spec.partition(":")
    if kind == "fixed":
        value = float(rest)
        return lambda rng, i: value
    if kind == "lognormal":
        median, sigma = (float(v) for v in rest.split(":"))
        return lambda rng, i: median * math.exp(sigma * rng.gauss(0.0, 1.0))
    if kind in ("empirical", "list"):
        values = [float(v) for v in rest.split(",") if v]
        if not values:
            raise ValueError(f"{kind}: no values")
        if kind == "list":
            return lambda rng, i: values[i % len(values)]
        return lambda rng, i: rng.choice(values)
    raise ValueError(f"unknown search-time distribution '{spec}' (fixed, lognormal, empirical, list)")


def key_times(s, search):
    """times[node][key]. A key's search takes about as long on every node (same code, same
    shapes), so it is drawn once per key; --node-jitter adds per-node noise. Searches share the
    worker's gpu_share (worker_daemon.cpp: gpu_share / threads), so with W workers the duty-bound
    part of each search takes W times as long."""
    rng = random.Random(f"{s.seed}/keys")
    base = [max(0.0, search(rng, i)) for i in range(s.keys)]
    jit = random.Random(f"{s.seed}/jitter")
    stretch = (1 - s.duty_fraction) + s.duty_fraction * s.workers

    def one(b):
        noise = math.exp(s.node_jitter * jit.gauss(0.0, 1.0)) if s.node_jitter else 1.0
        return min(s.key_budget_s, b * stretch * noise)
    return [[one(b) for b in base] for _ in range(s.nodes)]


def start_times(s):
    rng = random.Random(f"{s.seed}/skew")
    return [0.0 if n == 0 or s.skew_s == 0 else rng.uniform(0, s.skew_s) for n in range(s.nodes)]


class Worker:
    """One node's worker: `slots` threads taking job files oldest first. Jobs arrive in time order,
    so each job's start is known when it is submitted (list scheduling)."""

    def __init__(self, slots, up_at):
        self.free_at = [up_at] * slots
        self.busy = 0.0

    def submit(self, t, duration):
        # A thread idle since f looks at f, f + 0.2, ...; one still busy takes it when it ends.
        def start(f):
            return f if f >= t else f + PICKUP_S * math.ceil((t - f) / PICKUP_S - 1e-9)
        i = min(range(len(self.free_at)), key=lambda j: (start(self.free_at[j]), j))
        begin = start(self.free_at[i])
        self.free_at[i] = begin + duration
        self.busy += duration
        return begin + duration


def uncoordinated(s, times, starts):
    """Every node searches every key itself (job_store=off, or a single process)."""
    served, busy = [], []
    for n in range(s.nodes):
        w = Worker(s.workers, starts[n] + s.worker_start_s)
        served.append([w.submit(starts[n], times[n][k]) for k in range(s.keys)])
        busy.append(w.busy)
    alive = [n for n in range(s.nodes) if not (s.kill and s.kill[0] == n)]
    return {"warm_s": max(max(served[n]) for n in alive) if s.keys else 0.0,
            "search_busy_s": [busy[n] for n in alive], "import_busy_s": [0.0] * len(alive),
            "searches": s.keys * len(alive), "taken_over": 0, "store_calls": 0}


@dataclasses.dataclass
class Claim:
    owner: int
    state: str            # "search" | "ended"
    version: int          # the stored value changes on every write: renewals bump "beat"
    changed_at: float


@dataclasses.dataclass
class Owned:
    version: int
    renewed: float
    ends_at: float        # when the local job file goes (the search ended, record written)
    lost: bool = False


class Node:
    def __init__(self, n, s, start):
        self.n, self.start = n, start
        self.dead = False
        self.waiting = list(range(s.keys))   # sorted: the coordinator's std::map order
        self.owned = {}
        self.served = {}
        self.next_record = 0
        self.rounds = []                     # start of every round (a watcher's reads of claims)
        self.worker = None
        self.import_busy = 0.0
        self.in_round = False


class Job:
    """One coordinated job: the store's claims and records, the nodes, one event queue."""

    def __init__(self, s, times, starts):
        self.s, self.times = s, times
        self.nodes = [Node(n, s, starts[n]) for n in range(s.nodes)]
        self.claims = {}
        self.next_unclaimed = 0      # claims are never deleted and free keys go lowest first
        self.records = []            # (published at, key, owner), in add() order
        self.ages = []               # heap (changed_at, version, key) of "search" claims
        self.lapsed = set()          # "search" claims unchanged for a lease (store time)
        self.in_round = []           # heap of round ends: nodes whose calls share the store now
        self.open_rounds = 0         # rounds begun whose end is not known yet (importing)
        self.events = []
        self.seq = 0
        self.left = s.nodes * s.keys     # (node, key) pairs not served yet, alive nodes only
        self.searches = self.taken_over = self.store_calls = 0

    def at(self, t, what, n, data=None):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, what, n, data))

    def run(self):
        for node in self.nodes:
            # The first miss hands the key over; the coordinator thread connects and runs its
            # first round at once (it wakes on a non-empty inbox).
            self.at(node.start + self.s.rtt_s, "round", node.n)
        if self.s.kill:
            self.at(self.s.kill[1], "kill", self.s.kill[0])
        while self.events and self.left > 0:
            t, _, what, n, data = heapq.heappop(self.events)
            if what == "kill":
                self.kill(n)
            elif self.nodes[n].dead:
                continue
            elif what == "round":
                self.round(self.nodes[n], t)
            else:
                self.imported(self.nodes[n], t, *data)
        if self.s.kill and not self.nodes[self.s.kill[0]].dead:
            # Warm before the kill was reached; searches it would finish later still die with it.
            victim = self.nodes[self.s.kill[0]]
            if victim.served and max(victim.served.values()) > self.s.kill[1]:
                victim.dead = True
        if self.left > 0:
            raise RuntimeError("the job never warmed (no node could take the remaining keys)")
        alive = [nd for nd in self.nodes if not nd.dead]
        return {"warm_s": max(max(nd.served.values()) for nd in alive) if self.s.keys else 0.0,
                "search_busy_s": [nd.worker.busy if nd.worker else 0.0 for nd in alive],
                "import_busy_s": [nd.import_busy for nd in alive], "searches": self.searches,
                "taken_over": self.taken_over, "store_calls": self.store_calls}

    def kill(self, n):
        node = self.nodes[n]
        if node.dead:
            return
        # Its pairs no longer count: what it had served dies with it, what it had not never comes.
        node.dead = True
        if node.in_round:            # killed while importing: it makes no more calls
            node.in_round = False
            self.open_rounds -= 1
        self.left -= self.s.keys - len(node.served)
        node.served = {}

    def serve(self, node, key, t):
        if key not in node.served:
            node.served[key] = t
            self.left -= 1
        elif t < node.served[key]:
            node.served[key] = t

    def latency(self, t):
        while self.in_round and self.in_round[0] <= t:
            heapq.heappop(self.in_round)
        return self.s.rtt_s + self.s.store_op_s * (1 + len(self.in_round) + self.open_rounds)

    def write_claim(self, key, owner, state, t):
        old = self.claims.get(key)
        c = Claim(owner, state, (old.version + 1) if old else 0, t)
        self.claims[key] = c
        self.lapsed.discard(key)
        if state == "search":
            heapq.heappush(self.ages, (t, c.version, key))
        return c

    def update_lapsed(self, t):
        while self.ages and self.ages[0][0] <= t - self.s.lease_s:
            changed_at, version, key = heapq.heappop(self.ages)
            c = self.claims[key]
            if c.state == "search" and c.version == version:
                self.lapsed.add(key)

    def round(self, node, t):
        """A round's store calls are applied at once (they take milliseconds); it stops at each
        import, which ends in an "import" event, so that what other nodes write meanwhile (a
        take-over) is seen by the renewals after it, and they see those renewals only then."""
        node.rounds.append(t)
        self.update_lapsed(t)
        lat = self.latency(t)      # one call's cost, for the whole round (renewals included)
        node.in_round = True
        self.open_rounds += 1
        clock = self.tend_owned(node, t, lat)
        clock = self.tend_waiting(node, clock, lat)
        self.read_records(node, clock, lat)

    def end_round(self, node, clock):
        node.in_round = False
        self.open_rounds -= 1
        heapq.heappush(self.in_round, clock)
        self.at(clock + self.s.poll_s, "round", node.n)

    def tend_owned(self, node, clock, lat):
        """Publish the searches that ended here (add, set, compareSet "ended"), in key order; then
        renew_due."""
        for key in sorted(node.owned):
            o = node.owned[key]
            if o.ends_at <= clock:
                clock += 2 * lat
                self.records.append((clock, key, node.n))
                self.store_calls += 2
                if not o.lost:
                    clock += lat
                    self.store_calls += 1
                    c = self.claims[key]
                    if c.owner == node.n and c.version == o.version:
                        self.write_claim(key, node.n, "ended", clock)
                del node.owned[key]
        return self.renew_due(node, clock, lat)

    def renew_due(self, node, clock, lat):
        """Coordinator::renew_due: the owned claims not renewed for lease/4 (as of the call's
        start), in key order, one compareSet each. A renewal that finds another owner stops
        renewing (it was taken over)."""
        due = [k for k in sorted(node.owned)
               if not node.owned[k].lost and clock - node.owned[k].renewed >= self.s.lease_s / 4]
        for key in due:
            o = node.owned[key]
            c = self.claims[key]
            clock += lat
            self.store_calls += 1
            if c.owner == node.n and c.version == o.version:
                o.version = self.write_claim(key, node.n, "search", clock).version
                o.renewed = clock
            else:
                o.lost = True
        return clock

    def seen_at(self, node, changed_at):
        """When this node first read the claim's current value: its first round since the change."""
        i = bisect.bisect_left(node.rounds, changed_at)
        return node.rounds[min(i, len(node.rounds) - 1)]

    def tend_waiting(self, node, clock, lat):
        """One get per waiting key, in key order; a free key (never claimed) or a stale one (its
        claim unchanged for a lease by this node's clock) is claimed while the node has room."""
        s = self.s
        room = s.workers * s.ranks_per_node - len(node.owned)
        picks = []
        if room > 0:
            stale = [k for k in self.lapsed if self.claims[k].owner != node.n and self.is_waiting(node, k)
                     and clock - self.seen_at(node, self.claims[k].changed_at) > s.lease_s]
            fresh = range(self.next_unclaimed, min(s.keys, self.next_unclaimed + room))
            picks = sorted(set(stale) | set(fresh))[:room]
        start = clock
        for i, key in enumerate(picks):
            at = start + lat * (bisect.bisect_left(node.waiting, key) + 1 + i)
            self.claim(node, key, at)
        clock = start + lat * (len(node.waiting) + len(picks))
        self.store_calls += len(node.waiting) + len(picks)
        for key in picks:
            node.waiting.remove(key)
        return clock

    def is_waiting(self, node, key):
        i = bisect.bisect_left(node.waiting, key)
        return i < len(node.waiting) and node.waiting[i] == key

    def claim(self, node, key, at):
        if key in self.claims:
            self.taken_over += 1
        else:
            self.next_unclaimed = max(self.next_unclaimed, key + 1)
        c = self.write_claim(key, node.n, "search", at)
        if node.worker is None:   # the first job of this node starts its worker
            node.worker = Worker(self.s.workers, at + self.s.worker_start_s)
        ends = node.worker.submit(at, self.times[node.n][key])
        node.owned[key] = Owned(c.version, at, ends)
        self.searches += 1
        self.serve(node, key, ends)   # its own record, in its own cache, once the search ends

    def read_records(self, node, clock, lat):
        """add(0), then one get per new record; each record of another node is imported here
        (rebuilt: --import-s on this thread, ending in an "import" event)."""
        clock += lat
        self.store_calls += 1
        n = node.next_record
        while n < len(self.records) and self.records[n][0] <= clock:
            n += 1
        self.read_on(node, clock, lat, n)

    def read_on(self, node, clock, lat, n):
        """The records up to n (the count add(0) returned), from the next one to import."""
        while node.next_record < n:
            _, key, owner = self.records[node.next_record]
            node.next_record += 1
            clock += lat
            self.store_calls += 1
            if owner != node.n:
                self.at(clock + self.s.import_s, "import", node.n, (key, lat, n))
                return
        self.end_round(node, clock)

    def imported(self, node, clock, key, lat, n):
        """An import ended: its key is served here and leaves the waiting list; renew_due runs
        (unless --no-renew-between-imports); then the next record."""
        node.import_busy += self.s.import_s
        self.serve(node, key, clock)
        if self.is_waiting(node, key):
            node.waiting.remove(key)
        if self.s.renew_between_imports:
            clock = self.renew_due(node, clock, lat)
        self.read_on(node, clock, lat, n)


def simulate(s, search, starts=None):
    """Both ways of warming the same job: {"coordinated": ..., "uncoordinated": ..., "ideal_s"}.
    `starts`: each node's first miss (default: 0, or spread over --skew-s)."""
    times, starts = key_times(s, search), starts or start_times(s)
    base = uncoordinated(s, times, starts)
    # The code coordinates only when the world is larger than one process (job_store.cpp).
    on = s.coordinate if s.coordinate is not None else s.nodes * s.ranks_per_node > 1
    coord = Job(s, times, starts).run() if on and s.keys else dict(base)
    return {"coordinated": coord, "uncoordinated": base, "ideal_s": ideal(s, times)}


def ideal(s, times):
    """No protocol at all: the keys spread perfectly over nodes x workers, or the slowest key."""
    if not s.keys:
        return 0.0
    alive = s.nodes - (1 if s.kill else 0)
    return max(max(times[0]), sum(times[0]) / (max(1, alive) * s.workers))


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
