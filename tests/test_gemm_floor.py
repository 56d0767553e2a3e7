"""benchmarks/micro/gemm_floor.py on CPU: the split-K probe GEMM equals F.linear (fp32, interpreter) and the
script's dry run writes its table."""

import json

import pytest
import torch
import torch.nn.functional as F

from triton_mode import needs_interpreter


@needs_interpreter
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_splitk_equals_linear(seed, gen, splits):
    from benchmarks.micro.gemm_floor import splitk_linear

    x, w = torch.randn(37, 200, generator=gen), torch.randn(70, 200, generator=gen)
    torch.testing.assert_close(
        splitk_linear(x, w, splits, block_n=32, block_k=32), F.linear(x, w), atol=1e-4, rtol=1e-4
    )
    with pytest.raises(ValueError, match="M <= 128"):
        splitk_linear(torch.randn(129, 200), w, splits)


@needs_interpreter
def test_smoke_run_writes_rows(seed, tmp_path):
    from benchmarks.micro import gemm_floor

    out = tmp_path / "g.json"
    assert gemm_floor.main(["--smoke", "--splits", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["gemm"] == "tiny" and row["splitk2_max_err"] < 1e-4


@needs_interpreter
def test_chain_smoke_run_writes_rows(seed, tmp_path):
    from benchmarks.micro import gemm_floor

    out = tmp_path / "c.json"
    assert gemm_floor.main(["--smoke", "--chain", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["gemm"] == "tiny" and row["chain"] == 2 and row["fp32_max_err"] < 1e-4
