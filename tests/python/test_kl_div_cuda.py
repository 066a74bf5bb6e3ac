"""KL divergence's fused pair on a real GPU (skipped without one): both keys searched offline on
the CUDA templates, then the user's F.kl_div in a fresh process (test_kl_div.serve_pair checks
hits, the graph and fp64 error). KernelBench's KLDivLoss(reduction='batchmean') over (32768, 4096)
in fp32 and bf16 must be served; a smaller mean with log_target may end eager_best (the call is
then PyTorch's own, bit for bit)."""
import pytest
import torch
from test_kl_div import serve_pair

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

SEARCH = ("--generations", "2", "--mu", "4", "--lambda", "6")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernelbench_batchmean_is_served(tmp_path, dtype):
    serve_pair(tmp_path, ("batchmean", "32768x4096", "batchmean", False), "cuda", dtype, search=SEARCH)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_mean_log_target_serves_or_keeps_eager(tmp_path, dtype):
    serve_pair(tmp_path, ("mean_log_target", "4096x1000", "mean", True), "cuda", dtype, search=SEARCH,
               forward_may_lose=True)
