"""benchmarks/warm_job_sim.py, the simulation of warming a distributed job (docs/SCALING.md): the
properties its tables rest on. Pure Python: no torch, no library (conftest.py loads them anyway)."""
import importlib.util
import json
import pathlib
import sys

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "warm_job_sim.py"
_spec = importlib.util.spec_from_file_location("warm_job_sim", _PATH)
sim = importlib.util.module_from_spec(_spec)
sys.modules["warm_job_sim"] = sim   # dataclasses look their module up by name
_spec.loader.exec_module(sim)


def run(search="fixed:30", **kw):
    return sim.simulate(sim.Settings(**kw), sim.parse_search(search))


def test_one_node_is_the_uncoordinated_job():
    # A one-process world does not coordinate at all (job_store.cpp), so the times are the same.
    r = run("lognormal:20:0.7", nodes=1, keys=25, seed=3)
    assert r["coordinated"]["warm_s"] == r["uncoordinated"]["warm_s"]
    # Forced through a store, one node pays at most a poll and a worker pick-up per key.
    s = sim.Settings(nodes=1, keys=25, seed=3, coordinate=True)
    f = sim.simulate(s, sim.parse_search("lognormal:20:0.7"))
    base = f["uncoordinated"]["warm_s"]
    assert base <= f["coordinated"]["warm_s"] <= base + 25 * (s.poll_s + sim.PICKUP_S + 0.1)
    assert f["coordinated"]["searches"] == 25 and f["coordinated"]["taken_over"] == 0


def test_n_nodes_warm_equal_keys_about_n_times_faster():
    keys, search_s = 64, 30.0
    for nodes in (2, 4, 8):
        r = run(f"fixed:{search_s}", nodes=nodes, keys=keys, import_s=0.0)
        c, u = r["coordinated"], r["uncoordinated"]
        rounds = keys // nodes                       # keys each node searches in turn
        assert c["searches"] == keys                 # each key once for the whole job
        assert u["warm_s"] / nodes <= c["warm_s"]
        # Per key searched in turn: a poll to notice the end, a worker pick-up; then one poll more.
        assert c["warm_s"] <= u["warm_s"] / nodes + rounds * (1.0 + sim.PICKUP_S + 0.05) + 1.5
        assert max(c["search_busy_s"]) == rounds * search_s


def test_a_killed_node_loses_its_key_after_a_lease():
    s = sim.Settings(nodes=2, keys=4, lease_s=60.0, import_s=0.0, kill=(0, 15.0))
    times = sim.key_times(s, sim.parse_search("fixed:30"))
    job = sim.Job(s, times, [0.0, 0.0])
    r = job.run()
    assert r["taken_over"] == 1 and r["searches"] == 5   # the dead node's key, searched again
    assert len(job.nodes[1].served) == 4                  # every key served on the survivor
    # Its last renewal was at most lease/4 before the kill; a lease after it, searched afresh.
    assert r["warm_s"] >= 15.0 - s.lease_s / 4 + s.lease_s + 30.0
    assert r["warm_s"] <= 15.0 + s.lease_s + 2 * s.poll_s + 3 * 30.0 + 1.0


def test_a_seed_gives_the_same_job_and_another_seed_another():
    kw = dict(nodes=8, keys=100, node_jitter=0.2, skew_s=2.0)
    a = run("lognormal:25:0.8", seed=7, **kw)
    b = run("lognormal:25:0.8", seed=7, **kw)
    c = run("lognormal:25:0.8", seed=8, **kw)
    assert a == b
    assert a["coordinated"]["warm_s"] != c["coordinated"]["warm_s"]


def test_the_cli_prints_one_row_per_node_and_key_count(capsys):
    assert sim.main(["--nodes", "1,2,4", "--keys", "10,20", "--search", "empirical:29.8,21.1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(o["nodes"], o["keys"]) for o in out] == [(1, 10), (2, 10), (4, 10), (1, 20), (2, 20), (4, 20)]
    assert all(o["coordinated_s"] <= o["uncoordinated_s"] + 1e-9 for o in out if o["nodes"] > 1)


def test_renewals_between_imports_keep_claims_through_an_import_backlog():
    # 48 nodes finishing together leave each 47 records of 1.5 s to import on its coordinator's
    # thread: a round outlasts the 60 s lease. read_records renews due claims after every import
    # (Coordinator::renew_due), so no claim lapses and no key is searched twice.
    r = run("fixed:20", nodes=48, keys=480, import_s=1.5)
    assert r["coordinated"]["taken_over"] == 0
    assert r["coordinated"]["searches"] == 480
    # Without those renewals (the code before), the round's claims lapse and keys are searched twice.
    old = run("fixed:20", nodes=48, keys=480, import_s=1.5, renew_between_imports=False)
    assert old["coordinated"]["taken_over"] > 0
    assert old["coordinated"]["searches"] == 480 + old["coordinated"]["taken_over"]
    assert r["coordinated"]["warm_s"] < old["coordinated"]["warm_s"]
    # Short imports never built a backlog: the same either way.
    fine = run("fixed:20", nodes=48, keys=480, import_s=0.1)
    assert fine["coordinated"]["taken_over"] == 0
    assert fine == run("fixed:20", nodes=48, keys=480, import_s=0.1, renew_between_imports=False)
    assert fine["coordinated"]["warm_s"] < r["coordinated"]["warm_s"]
