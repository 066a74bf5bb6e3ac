"""Eager times of the intercepted operators at the anchor shapes (docs/PERF.md), with their
memory floors, on the current GPU. Method: L2 flushed (a 256 MB write) before each timed call, CUDA
events around the call, a device-wide synchronize before reading the end event, median of >= 30.

    python3 benchmarks/eager_ops.py [--lib build/torch_ops/libkernelcraft.so] > eager.json
With --lib the library is loaded (every call a miss), to show the miss costs nothing measurable.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

COPY_BW = 4.17e12  # bytes/s: the H200 copy bandwidth measured on the device, see docs/PERF.md
_copy_bw = {}


def copy_bw():
    """Bytes/s a device-to-device copy of 512 MiB reaches on the current GPU, timed as bench times
    (read plus write), measured once a process: the yardstick of "% copy", so a table taken on
    another GPU (an H100 copies about 3 TB/s, the H200 4.17) is not judged against the H200's.
    COPY_BW without CUDA."""
    if not torch.cuda.is_available():
        return COPY_BW
    dev = torch.cuda.current_device()
    if dev not in _copy_bw:
        src = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        r = bench(lambda: dst.copy_(src))
        _copy_bw[dev] = 2 * src.numel() / (r["median_ms"] / 1e3)
        del src, dst
        torch.cuda.empty_cache()
    return _copy_bw[dev]


def bench(fn, reps=30, budget_s=2.0):
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    start_all = torch.cuda.Event(enable_timing=True)
    end_all = torch.cuda.Event(enable_timing=True)
    start_all.record()
    while len(times) < reps or (len(times) < 200 and sum(times) < budget_s * 1e3 * 0.1):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        # The end event follows the call on the stream, as in the runtime's timer
        # (runtime/timing.cpp). A synchronize before it added the host's wake-up and the event's
        # submission to every call: 13-22 us on the H200, the gap between these medians and the
        # searches' for the same kernels (docs/PERF.md, 2026-12-04).
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    end_all.record()
    torch.cuda.synchronize()
    times.sort()
    return {"median_ms": statistics.median(times), "p10_ms": times[len(times) // 10],
            "p90_ms": times[9 * len(times) // 10], "reps": len(times)}


def cases():
    d = "cuda"
    ln_x = torch.randn(1, 64, 256, 256, device=d)
    ln_w = torch.randn(64, 256, 256, device=d)
    ln_b = torch.randn(64, 256, 256, device=d)
    rms_x = torch.randn(16, 1024, 4096, device=d)
    rms_w = torch.randn(4096, device=d)
    sm_x = torch.randn(4096, 4096, device=d)
    ew = torch.randn(16, 1024, 4096, device=d)
    ln2_x = torch.randn(16, 1024, 4096, device=d)
    ln2_w = torch.randn(4096, device=d)
    ln2_b = torch.randn(4096, device=d)
    nb = lambda *ts: sum(t.numel() * t.element_size() for t in ts)
    yield "layer_norm (1,64,256,256) over (64,256,256)", lambda: F.layer_norm(ln_x, ln_x.shape[1:], ln_w, ln_b), \
        nb(ln_x, ln_w, ln_b, ln_x)
    yield "layer_norm (16,1024,4096) over 4096", lambda: F.layer_norm(ln2_x, (4096,), ln2_w, ln2_b), nb(ln2_x, ln2_x)
    yield "rms_norm (16,1024,4096) [not intercepted]", lambda: F.rms_norm(rms_x, (4096,), rms_w), nb(rms_x, rms_x)
    yield "softmax (4096,4096)", lambda: torch.softmax(sm_x, -1), nb(sm_x, sm_x)
    yield "log_softmax (4096,4096)", lambda: torch.log_softmax(sm_x, -1), nb(sm_x, sm_x)
    for name, fn in [("relu", torch.relu), ("gelu", F.gelu), ("silu", F.silu), ("sigmoid", torch.sigmoid),
                     ("tanh", torch.tanh)]:
        yield f"{name} (16,1024,4096)", (lambda fn=fn: fn(ew)), nb(ew, ew)
    g = torch.randn_like(ew)
    yield "gelu_backward (16,1024,4096)", lambda: torch.ops.aten.gelu_backward(g, ew), nb(g, ew, ew)
    yield "softmax_backward (4096,4096)", lambda: torch.ops.aten._softmax_backward_data(
        sm_x, sm_x, -1, torch.float32), nb(sm_x, sm_x, sm_x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    a = ap.parse_args()
    if a.lib:
        torch.ops.load_library(a.lib)
    rows = []
    for name, fn, nbytes in cases():
        r = bench(fn)
        r.update({"case": name, "bytes": nbytes, "floor_ms": nbytes / copy_bw() * 1e3,
                  "library_loaded": bool(a.lib)})
        rows.append(r)
        print(json.dumps(r), flush=True)
    if a.lib:
        print(json.dumps({"status": json.loads(torch.ops.kernelcraft.status())["total"]}))


if __name__ == "__main__":
    main()
