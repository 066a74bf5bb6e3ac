"""fork() without exec, the way DataLoader workers start, from a parent whose threads (job submitter,
store thread, callers) are busy: every child must finish. Before the fix 5-11 of 30 children hung
in pthread_cond_signal (the submitter's condition variable, inherited with a waiter that did not
exist in the child)."""
import json

from conftest import KERNELS, run_python

CHILDREN = 300
AT_ONCE = 6
DEADLINE_S = 10   # per child; a healthy one takes well under a second, even on a loaded machine

# Runs in a fresh interpreter: evolution on (jobs are submitted; the worker executable is a stub
# so that no search competes for the machine), catch-ups every 5 ms, one kernel served. A thread of
# the parent keeps missing (new shapes: job submissions) and hitting while the main thread forks.
STRESS = f"""
import os, signal, sys, threading, time
torch.ops.load_library(LIB)
kc = torch.ops.kernelcraft
x = torch.randn(300, 7)
torch.relu(x)
key = [k for k in kc.missed_keys() if 'aten::relu' in k][0]
kc.put_kernel(key, open({str(KERNELS / 'relu_cpu.cpp')!r}).read(), open({str(KERNELS / 'relu_cpu.json')!r}).read())
torch.relu(x)                                   # loads it; later calls hit

stop = False
def busy():
    i = 0
    while not stop:
        i += 1
        torch.relu(x)                               # hit
        # A miss, and a job for every new shape. Not torch.randn: a child forked while this thread
        # holds torch's own CPU generator mutex blocks on it in its first randn (seen: 3 of 300
        # children, all in at::native::normal_kernel's std::mutex: torch's lock, not ours).
        torch.sigmoid(torch.ones(3 + i % 4000, 2))
busy_thread = threading.Thread(target=busy, daemon=True)
busy_thread.start()

def child_body(i, w):
    ok = True
    for j in range(4):                              # new keys: a submitter and a table of its own
        y = torch.randn(5000 + i, 1 + j)
        ok = ok and torch.equal(torch.relu(y), y.clamp_min(0))
        torch.sigmoid(y)                            # a miss: a job from this process
    torch.relu(x); y = torch.relu(x)               # load in this process, then serve
    s = json.loads(kc.status())
    os.write(w, json.dumps({{"ok": ok and torch.equal(y, x.clamp_min(0)), "hits": s["ops"]["relu"]["hits"],
                             "state": s["cache"]["state"]}}).encode())

running, results, hung = {{}}, [], 0

def reap():
    # collects finished children; kills (and counts as hung) those past the deadline
    global hung
    for pid, (r, t0) in list(running.items()):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            results.append(os.read(r, 4096)); os.close(r); del running[pid]
        elif time.time() - t0 > {DEADLINE_S}:
            os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0); os.close(r); del running[pid]; hung += 1; print('hung', hung, file=sys.stderr, flush=True)
    time.sleep(0.002)

for i in range({CHILDREN}):
    while len(running) >= {AT_ONCE}:
        reap()
    torch.relu(torch.randn(7, 3 + i))              # a miss in the main thread just before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r); child_body(i, w)
        finally:
            os._exit(0)
    os.close(w)
    running[pid] = (r, time.time())
while running:
    reap()
stop = True
busy_thread.join()   # a thread still inside torch while the interpreter exits aborts the process
out = [json.loads(b) for b in results if b]
print(json.dumps({{"hung": hung, "reported": len(out), "ok": sum(o["ok"] for o in out),
                  "served": sum(o["hits"] >= 1 for o in out), "open": sum(o["state"] == "open" for o in out),
                  "jobs": json.loads(kc.evolution_status())["submitted"]}}))
"""


def test_hundreds_of_forked_children_never_hang(tmp_path):
    r = run_python(STRESS, env={"KERNELCRAFT_CACHE_DIR": str(tmp_path / "cache"), "KERNELCRAFT_EVOLVE": "1",
                                "KERNELCRAFT_WORKER": "/bin/true", "KERNELCRAFT_CATCH_UP_MS": "5",
                                "KERNELCRAFT_LOG_LEVEL": "error"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hung"] == 0, out
    assert out["reported"] == CHILDREN and out["ok"] == CHILDREN, out
    # Every child opened the cache on its own and served the parent's kernel from it.
    assert out["open"] == CHILDREN and out["served"] == CHILDREN, out
    assert out["jobs"] > 0, out   # the parent's submitter was busy while it forked
