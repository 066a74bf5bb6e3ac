"""What one live check costs, call by call: a served relu (examples/kernels) called in a loop with every
call checked, against the same loop with the check off, in one process. The first checked calls pay
for first use of the comparison's ATen kernels (CUDA loads a kernel's module on its first launch);
later ones show the steady cost of a check (the extra eager call, the comparison, one host sync).

    python3 benchmarks/shadow_calls.py --lib build/torch_ops/libkernelcraft.so [--calls 20] [--numel N]
"""
import argparse
import json
import pathlib
import tempfile
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--numel", type=int, default=1 << 22)
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    kc = torch.ops.kernelcraft
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kc.configure(json.dumps({"cache_dir": tempfile.mkdtemp(prefix="kc-shadow-calls-"), "enabled": True,
                             "ops": "relu", "evolve": False, "serve_probe_calls": 0, "serve_unverified": True,
                             "shadow_calls": 0, "shadow_every": 0}))
    x = torch.randn(a.numel + 3, device=dev)
    before = set(kc.missed_keys())
    torch.relu(x)
    key = [k for k in kc.missed_keys() if k not in before][0]
    kind = "cuda" if dev == "cuda" else "cpu"
    ext = ".cu" if dev == "cuda" else ".cpp"
    kc.put_kernel(key, (HERE / "examples" / "kernels" / f"relu_{kind}{ext}").read_text(),
                  (HERE / "examples" / "kernels" / f"relu_{kind}.json").read_text())
    torch.relu(x)                                            # loads the record (unverified: a benchmark)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def loop(every):
        kc.configure(json.dumps({"shadow_calls": 0, "shadow_every": every}))
        out = []
        for _ in range(a.calls):
            sync()
            t = time.perf_counter()
            torch.relu(x)
            sync()
            out.append(1e3 * (time.perf_counter() - t))
        return out

    off1 = loop(0)
    checked = loop(1)
    off2 = loop(0)
    s = json.loads(kc.status())
    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "numel": a.numel + 3, "off_ms": off1 + off2, "checked_ms": checked,
           "hits": s["ops"]["relu"]["hits"], "shadow_checks": s["ops"]["relu"].get("shadow_checks"),
           "check_ms_total": s["shadow"]["check_ms"]}
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"off: median {med(off1 + off2):.3f} ms; checked: first {checked[0]:.3f} ms, second {checked[1]:.3f} ms, "
          f"median {med(checked):.3f} ms; checks {res['shadow_checks']}, check time {res['check_ms_total']:.1f} ms")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
