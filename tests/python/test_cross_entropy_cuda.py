"""Cross-entropy's fused pair on a real GPU (skipped without one): both keys searched offline on
the CUDA templates, then the user's F.cross_entropy in a fresh process, under bf16 autocast and
in plain bf16 and fp32 (test_cross_entropy.serve_pair checks hits, the graph and fp64 error)."""
import pytest
import torch
from test_cross_entropy import CASES, serve_pair

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

SEARCH = ("--generations", "2", "--mu", "4", "--lambda", "6")
LM = ("lm_autocast", "2048x32000", {"ignore_index": -100}, "ignore_index=-100", "classes")


def test_language_model_loss_under_autocast(tmp_path):
    serve_pair(tmp_path, LM, "cuda", "bfloat16", autocast=True, search=SEARCH)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pair_serves_on_cuda(tmp_path, case, dtype):
    serve_pair(tmp_path, case, "cuda", dtype, search=SEARCH)
