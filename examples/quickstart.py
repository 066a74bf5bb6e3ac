"""kernelcraft in one minute: load the library, watch a miss fall back to eager, put a kernel into
the cache for that exact call, and watch it being served.

    python3 examples/quickstart.py [path/to/libkernelcraft.so]
"""
import json
import os
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
LIB = sys.argv[1] if len(sys.argv) > 1 else str(HERE.parent / "build" / "torch_ops" / "libkernelcraft.so")
# A private cache for the demo (the default is ~/.cache/kernelcraft); set before loading.
os.environ.setdefault("KERNELCRAFT_CACHE_DIR", tempfile.mkdtemp(prefix="kc-quickstart-"))
# This demo stores a kernel by hand; background evolution of misses is shown by
# examples/train_block.py and examples/prewarm.py.
os.environ.setdefault("KERNELCRAFT_EVOLVE", "0")

import torch  # noqa: E402

torch.ops.load_library(LIB)
kc = torch.ops.kernelcraft
device = "cuda" if torch.cuda.is_available() else "cpu"


def show(title):
    s = json.loads(kc.status())
    relu = s["ops"].get("relu", {})
    print(f"{title:<44} relu: hits={relu.get('hits')} misses={relu.get('misses')} "
          f"fallbacks={relu.get('fallbacks')}  cache: {s['cache']['state']}")


x = torch.randn(4096, 1024, device=device)

# 1. Interception: the call goes through kernelcraft, misses (nothing cached) and runs eager.
y_eager = torch.relu(x)
show("1. first call: a miss, eager ran")
key = [k for k in kc.missed_keys() if "aten::relu" in k][0]
print("   its key:", key)

# 2. Put a hand-written kernel for that key into the cache (the evolution worker finds its own).
#    verify=True runs the whole verification gauntlet on it first, in a child process (numerics
#    against eager and fp64 on six input sets, timing, sanitizers); only a kernel that passes is
#    compiled for this machine and stored in RocksDB. Unverified kernels are never served.
suffix = "cuda.cu" if device == "cuda" else "cpu.cpp"
src = (HERE / "kernels" / f"relu_{suffix}").read_text()
spec = (HERE / "kernels" / f"relu_{suffix.split('.')[0]}.json").read_text()
stored = json.loads(kc.put_kernel(key, src, spec, verify=True))
stages = ", ".join(f"{s['name']} {s['outcome']}" for s in stored["meta"]["verification"]["stages"])
print("   verified and stored:", stored["blob"])
print("   gauntlet:", stages)

# 3. The next call with the same key loads the kernel (eager still answers this one) ...
torch.relu(x)
show("2. next call: kernel found, loaded")
# ... and from then on it is served.
for _ in range(10):
    y = torch.relu(x)
show("3. ten more calls: served from the cache")
assert torch.equal(y, y_eager), "served kernel disagrees with eager"
print("   served result equals eager:", torch.equal(y, y_eager))

# 4. Any other key (shape, stride, dtype) misses and falls back.
torch.relu(x.t())
show("4. transposed input: another key, a miss")
