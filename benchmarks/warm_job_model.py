"""The model behind benchmarks/warm_job_sim.py (the command line, the check against measured
runs and the tables): a discrete-event simulation of N nodes warming K missed keys through
kernelcraft's job-wide coordination (dispatcher/coordinator.h), and of the same job without it.
docs/SCALING.md has the model, its assumptions and the check; what is modelled is listed in
warm_job_sim.py's docstring. simulate(settings, search) is the entry point.
"""
import bisect
import dataclasses
import heapq
import math
import random

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
