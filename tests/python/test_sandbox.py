"""The evaluation sandbox (evolve/verify/sandbox.h) end to end: hostile CPU candidates run in a real
evaluation child (`kernelcraft eval-child`, driven here over its line protocol) and in the
sanitizers' runner. Each one's payload (a file or directory outside any scratch directory, a
process, a connection, a signal to its parent) must not take effect, and the gauntlet must reject
it; an honest kernel still verifies. With evolve_sandbox=off the same payloads do take effect, so
these tests see the difference the sandbox makes.

The candidates compute relu correctly and get past the static check the way a proposer could: an
extern "C" prototype, names assembled by token pasting, a constructor with a priority, raw
syscalls in inline asm.
"""
import json
import os
import platform
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import CLI

X86 = platform.machine() == "x86_64"

CALL = {"op": "relu", "backend": "cpu", "scalars": [],
        "inputs": [{"name": "self", "dtype": "f32", "sizes": [1000, 33], "strides": [33, 1], "align": 16}],
        "outputs": [{"name": "out0", "dtype": "f32", "sizes": [1000, 33], "strides": [33, 1], "align": 16}]}
LAUNCH = {"version": 1, "launches": [{"entry": "kc_relu_h", "grid": ["ceil_div(numel(self), 4096)", 1, 1],
                                       "block": [4096, 1, 1], "smem": 0,
                                       "args": ["ptr:out0", "ptr:self", "i64:numel(self)"]}]}

KERNEL = """
#define KC_CAT(a, b) a##b
extern "C" int mkdir(const char*, unsigned);
%(decls)s
extern "C" void kc_relu_h(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  if (ctx->begin == 0) {
    %(payload)s
  }
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = fmaxf(x[i], 0.0f);
  }
}
"""

# name -> (declarations, payload); P is the path the payload creates (or, for unlink, removes).
HOSTILE = {
    "mkdir": ("", "mkdir(P, 0700);"),
    "open_write": ('extern "C" int KC_CAT(op, en)(const char*, int, ...);',
                   "KC_CAT(op, en)(P, 01 | 0100, 0600);  /* O_WRONLY | O_CREAT */"),
    "unlink": ('extern "C" int unlink(const char*);', "unlink(P);"),
    "constructor": ("__attribute__((constructor(101))) static void kc_boom() { mkdir(P, 0700); }", ""),
    "fork": ('extern "C" int KC_CAT(fo, rk)(void); extern "C" unsigned KC_CAT(sle, ep)(unsigned);\n'
             'extern "C" void KC_CAT(_ex, it)(int);',
             "if (KC_CAT(fo, rk)() == 0) { KC_CAT(sle, ep)(1); mkdir(P, 0700); KC_CAT(_ex, it)(0); }"),
    "execve": ('extern "C" int KC_CAT(exe, cve)(const char*, char* const*, char* const*);',
               'char* av[] = {(char*)"/bin/mkdir", (char*)P, 0}; KC_CAT(exe, cve)("/bin/mkdir", av, 0);'),
    "kill_parent": ('extern "C" int KC_CAT(ki, ll)(int, int); extern "C" int getppid(void);',
                    "KC_CAT(ki, ll)(getppid(), 10);  /* SIGUSR1 */"),
    "connect": ('extern "C" int socket(int, int, int); extern "C" int connect(int, const void*, unsigned);',
                "unsigned char a[16] = {2, 0, PORT_HI, PORT_LO, 127, 0, 0, 1};"
                " int s = socket(2, 1, 0); connect(s, a, 16);"),
    "lift_memory_cap": ('extern "C" int setrlimit(int, const void*);',
                        "unsigned long lim[2] = {~0ul, ~0ul}; setrlimit(9, lim);  /* RLIMIT_AS */"),
}
if X86:
    HOSTILE["asm_syscall"] = ("", 'long r; __asm__ volatile("syscall" : "=a"(r) : "a"(83L), "D"(P), "S"(0700L)'
                                  ' : "rcx", "r11", "memory");  /* mkdir */')
    HOSTILE["raw_clone"] = ('extern "C" long KC_CAT(sys, call)(long, ...); extern "C" void KC_CAT(_ex, it)(int);',
                            "if (KC_CAT(sys, call)(56, 17, 0, 0, 0, 0) == 0) { mkdir(P, 0700); KC_CAT(_ex, it)(0); }")


def kernel(name, path, port=0, table=HOSTILE):
    """The relu kernel with `name`'s payload, aimed at `path` (and `port`)."""
    decls, payload = table[name]
    src = KERNEL % {"decls": decls, "payload": payload}
    src = src.replace("PORT_HI", str(port >> 8)).replace("PORT_LO", str(port & 255))
    return re.sub(r"\bP\b", json.dumps(str(path)), src)


# The stages that stop host side effects, in order: the rules on the expanded source, the binary
# check at compile, the seccomp filter.
LAYERS = ("static", "compile", "sandbox")

class EvalChild:
    """One `kernelcraft eval-child` for the relu call; candidates go in, verdicts come out."""

    def __init__(self, tmp_path, sandbox="cpu", extra=(), stderr_path=None):
        call = tmp_path / "call.json"
        call.write_text(json.dumps(CALL))
        env = dict(os.environ, KERNELCRAFT_EVOLVE_SANDBOX=sandbox)
        self.err = open(stderr_path or (tmp_path / "child.err"), "ab")
        self.p = subprocess.Popen([CLI, "eval-child", "--call", str(call), *extra], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, env=env, text=True)
        line = self.p.stdout.readline()
        assert line, "the evaluation child gave no ready line"
        self.ready = json.loads(line)
        assert self.ready.get("ready"), self.ready

    def run(self, source, mode="search", launch=LAUNCH):
        self.p.stdin.write(json.dumps({"id": "c", "source": source, "launch": launch, "mode": mode}) + "\n")
        self.p.stdin.flush()
        while line := self.p.stdout.readline():   # progress lines ("at": stage, set, call) first
            answer = json.loads(line)
            if "verdict" in answer:
                return answer["verdict"]
        return None

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=30)
        finally:
            self.err.close()
        return self.p.returncode


def summary(v):
    return "; ".join("%s %s: %s" % (s["name"], s["outcome"], s.get("summary", "")) for s in v["stages"])


@pytest.fixture
def usr1():
    """Counts SIGUSR1 received by this (the child's parent) process."""
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
    yield got
    signal.signal(signal.SIGUSR1, old)


def needs_filter(child):
    if not child.ready.get("sandbox", {}).get("filter"):
        child.close()
        pytest.skip("no seccomp filter here: " + child.ready.get("sandbox", {}).get("why", "?"))


def test_hostile_candidates_are_rejected_and_their_payloads_do_not_happen(tmp_path, usr1):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    child = EvalChild(tmp_path)
    needs_filter(child)
    assert child.ready["sandbox"]["filter_writes"] and child.ready["sandbox"]["no_core"]
    results = {}
    for name in HOSTILE:
        target = tmp_path / ("victim-" + name)
        if name == "unlink":
            target.write_text("keep me")
        v = child.run(kernel(name, target, port))
        assert v is not None, "%s: the evaluation child died (%s)" % (name, child.p.poll())
        results[name] = (v, target)
    time.sleep(1.5)   # a process forked by a payload would make its directory after 1 s
    for name, (v, target) in results.items():
        assert not v["verified"], name + ": " + summary(v)
        # Layered: the expanded-source rules or the binary check (imports, constructors, syscall
        # instructions) usually stop a payload first; the filter is what holds when they do not.
        assert v["stage"] in LAYERS, name + ": " + summary(v)
        if name == "unlink":
            assert target.read_text() == "keep me"
        else:
            assert not target.exists(), name
    mk = results["mkdir"][0]
    if mk["stage"] == "sandbox":
        assert mk["stages"][-1]["evidence"]["syscall"] == "mkdir"
    else:
        assert "mkdir" in summary(mk), summary(mk)
    assert not usr1, "the candidate signalled its parent"
    with pytest.raises(BlockingIOError):
        listener.accept()
    # Honest work still verifies in the same sandboxed child.
    honest = child.run(KERNEL % {"decls": "", "payload": ""})
    assert honest["verified"], summary(honest)
    assert child.close() == 0


def test_without_the_sandbox_the_payloads_take_effect(tmp_path, usr1):
    """The control: the same probes, evolve_sandbox=off (so the test above tests the sandbox)."""
    child = EvalChild(tmp_path, sandbox="off")
    assert not child.ready["sandbox"]["filter"]
    for name in ("mkdir", "constructor", "fork", "kill_parent"):
        target = tmp_path / ("victim-" + name)
        v = child.run(kernel(name, target))
        if v and v["stage"] in ("static", "compile", "load") and name != "constructor":
            pytest.skip("%s rejected before it ran (%s): nothing to compare" % (name, summary(v)))
        time.sleep(1.5 if name == "fork" else 0)
        if name == "kill_parent":
            assert usr1, "the unsandboxed candidate could not signal its parent"
        else:
            assert target.exists(), "%s: the probe did nothing even unsandboxed: %s" % (name, summary(v))
    child.close()


def test_system_via_token_pasting_runs_nothing(tmp_path):
    target = tmp_path / "victim-system"
    table = {"system": ('extern "C" int KC_CAT(sys, tem)(const char*);', 'KC_CAT(sys, tem)("mkdir " P);')}
    child = EvalChild(tmp_path)
    needs_filter(child)
    v = child.run(kernel("system", target, table=table))
    # system() blocks every signal around its clone, so the kernel ends the child with SIGSYS
    # instead of answering EPERM through the handler: a crash, which the worker records as one.
    if v is None:
        assert child.close() == -signal.SIGSYS
    else:
        assert not v["verified"] and v["stage"] in LAYERS, summary(v)
        child.close()
    assert not target.exists()


def test_a_spinning_candidate_is_ended_by_the_cpu_limit(tmp_path):
    table = {"spin": ("", "volatile int stop = 0; while (!stop) {}")}
    child = EvalChild(tmp_path, extra=("--cpu-limit-s", "2"))
    t0 = time.time()
    assert child.run(kernel("spin", tmp_path / "unused", table=table)) is None
    assert child.close() in (-signal.SIGXCPU, -signal.SIGKILL)
    assert time.time() - t0 < 60


def test_a_huge_write_is_ended_by_the_file_size_limit(tmp_path):
    err = tmp_path / "stderr.log"
    err.write_bytes(b"x" * 1000)
    table = {"huge": ('extern "C" long KC_CAT(wri, te)(int, const void*, unsigned long);',
                      "char buf[65536] = {0}; for (int i = 0; i < 2048; ++i) KC_CAT(wri, te)(2, buf, sizeof buf);")}
    child = EvalChild(tmp_path, stderr_path=err)
    v = child.run(kernel("huge", tmp_path / "unused", table=table))
    if v is not None:   # the binary check refused the import of write() before anything ran
        assert not v["verified"] and v["stage"] in LAYERS, summary(v)
        child.close()
        return
    assert child.close() == -signal.SIGXFSZ
    size = err.stat().st_size
    limit = child.ready["sandbox"]["file_bytes"]
    assert limit <= size <= limit + (1 << 20), size   # written up to the limit, and no further


def test_the_sanitizer_runner_is_sandboxed_too(tmp_path):
    """Honest in the evaluation child, hostile under AddressSanitizer: the runner's own filter stops it."""
    target = tmp_path / "victim-asan"
    table = {"asan": ("", "\n#ifdef __SANITIZE_ADDRESS__\n    mkdir(P, 0700);\n#endif\n")}
    child = EvalChild(tmp_path)
    needs_filter(child)
    v = child.run(kernel("asan", target, table=table), mode="full")
    child.close()
    assert not v["verified"] and v["stage"] == "sanitizer", summary(v)
    last = v["stages"][-1]["summary"]
    assert "mkdir" in last and ("sandbox" in last or "binary refused" in last), summary(v)
    assert not target.exists()


def test_verify_rejects_a_hostile_kernel(tmp_path):
    """The `kernelcraft verify` path (its own child session) with the default settings."""
    target = tmp_path / "victim-verify"
    src, launch = tmp_path / "k.cpp", tmp_path / "k.json"
    src.write_text(kernel("mkdir", target))
    launch.write_text(json.dumps(LAUNCH))
    env = dict(os.environ)
    env.pop("KERNELCRAFT_EVOLVE_SANDBOX", None)
    r = subprocess.run([CLI, "verify", "--op", "relu", "--shape", "1000x33", "--source", str(src), "--launch",
                        str(launch), "--backend", "cpu", "--json"], capture_output=True, text=True, timeout=300, env=env)
    if "evaluation sandbox:" in r.stderr and "resource limits only" in r.stderr:
        pytest.skip("no seccomp filter here: " + r.stderr.strip().splitlines()[0])
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads(r.stdout)["calls"][0]["stage"] in LAYERS, r.stdout[-2000:]
    assert not target.exists()
