"""Checks, on a CUDA machine, the facts dispatcher/cudnn_batch_norm.cpp and running_stats.h rest on:
which aten op nn.BatchNorm reaches per dtype; that cudnn_batch_norm's reserve comes back empty and
its backward gives the same gradients with an empty or a junk reserve; that the outputs with and
without running statistics are equal. Prints one line per case; rerun it on a new torch or cuDNN."""
import torch, sys
from torch.utils._python_dispatch import TorchDispatchMode
print(torch.__version__, torch.backends.cudnn.version())
class M(TorchDispatchMode):
    def __init__(s): super().__init__(); s.ops=[]
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func)); return func(*args, **(kwargs or {}))
for dt in (torch.float32, torch.float16, torch.bfloat16):
  for shape, cl in (((16,64,256,256), False), ((16,64,64,64), True), ((8,32,17,9), False), ((4,16,1000), False), ((2,8,4,4,4), False)):
    bn = torch.nn.BatchNorm2d(shape[1]) if len(shape)==4 else (torch.nn.BatchNorm1d(shape[1]) if len(shape)==3 else torch.nn.BatchNorm3d(shape[1]))
    bn = bn.cuda()
    x = torch.randn(*shape, device='cuda', dtype=dt)
    if cl: x = x.to(memory_format=torch.channels_last)
    if dt != torch.float32: bn = bn.to(dt)
    m = M()
    with m: y = bn(x)
    line = f"{dt} {shape} cl={cl}: {m.ops}"
    w, b, rm, rv = bn.weight, bn.bias, bn.running_mean.clone(), bn.running_var.clone()
    if dt != torch.bfloat16:
      try:
        o = torch.ops.aten.cudnn_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
        o2 = torch.ops.aten.cudnn_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
        line += f" | cudnn outs {[ (t.shape, t.dtype) for t in o]} free-of-stats outs {[ (tuple(t.shape), t.dtype) for t in o2]} same={[torch.equal(a,c) for a,c in zip(o[:3],o2[:3])]}"
        go = torch.randn_like(x)
        g1 = torch.ops.aten.cudnn_batch_norm_backward(x, go, w, rm, rv, o[1], o[2], 1e-5, o[3])
        junk = torch.randint(0, 255, o[3].shape, dtype=torch.uint8, device='cuda')
        g2 = torch.ops.aten.cudnn_batch_norm_backward(x, go, w, rm, rv, o[1], o[2], 1e-5, junk)
        g3 = torch.ops.aten.cudnn_batch_norm_backward(x, go, w, rm, rv, o[1], o[2], 1e-5, torch.empty(0, dtype=torch.uint8, device='cuda'))
        line += f" | bwd junk-reserve equal={[torch.equal(a,c) for a,c in zip(g1,g2)]} empty-reserve equal={[torch.equal(a,c) for a,c in zip(g1,g3)]}"
        # native_batch_norm with and without stats
        n1 = torch.ops.aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
        n2 = torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
        line += f" | native with/without stats equal={[torch.equal(a,c) for a,c in zip(n1,n2)]}"
      except Exception as e:
        line += f" | ERR {type(e).__name__}: {str(e)[:200]}"
    print(line)
# instance norm
x = torch.randn(4,8,32,32, device='cuda')
m = M()
with m: torch.nn.InstanceNorm2d(8, affine=True, track_running_stats=True).cuda()(x)
print("instance tracked:", m.ops)
