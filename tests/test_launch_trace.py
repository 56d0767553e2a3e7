"""tools/launch_trace.py, the guard for refactors of the select path, still traces it: at testbed bs 1 on a faked
sm_90 card the served path launches what its plan says (PDL, the pass projection with the top-K split beside it,
the projections' side stream, the cosine kernel with the walk)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_launch_trace_of_the_served_path(tmp_path):
    out = tmp_path / "trace.json"
    subprocess.run([sys.executable, str(ROOT / "tools" / "launch_trace.py"), "--out", str(out), "--geometry", "testbed",
                    "--mode", "h100", "--bs", "1"], check=True, capture_output=True, timeout=300)
    events = json.loads(out.read_text())["testbed h100 bs 1 select"]
    kernels = [e[1] for e in events if e[0] == "triton"]
    assert kernels[0] == "_gemm_kernel" and kernels[1] == "_topk_lse_split_kernel" and "_topk_lse_merge_kernel" not in kernels
    split = next(e[3] for e in events if e[0] == "triton" and e[1] == "_topk_lse_split_kernel")
    assert split["BESIDE"] and split["PDL"] and split["G"] == 32  # tuning.TOPK_SPLIT_LAUNCH at bs 1
    assert kernels[-1] == "_lattice_cosine_kernel" and ["side", "fork"] in events and not any(e[0] == "error" for e in events)
