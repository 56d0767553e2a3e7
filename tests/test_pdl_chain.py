"""benchmarks/micro/pdl_chain.py on CPU: its chains compute what they say (interpreter, fp32, no PDL) and the
dry run writes its rows."""

import json

import torch
import torch.nn.functional as F

from triton_mode import needs_interpreter


@needs_interpreter
def test_chains_compose_their_kernels(seed, tmp_path):
    from benchmarks.micro import pdl_chain

    fns, x = pdl_chain.chains(8, 32, 3, "cpu", torch.float32, seed=seed)
    ref = x
    for _ in range(3):
        ref = F.rms_norm(ref, (32,), eps=1e-6)
    torch.testing.assert_close(fns["norm"](False), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fns["gemm"](False), fns["cublas"](False), atol=1e-4, rtol=1e-4)
    assert fns["mixed"](False).shape == (8, 32)
    out = tmp_path / "p.json"
    assert pdl_chain.main(["--smoke", "--out", str(out)]) == 0
    assert [r["chain"] for r in json.loads(out.read_text())["rows"]] == ["gemm", "norm", "mixed", "cublas"]
