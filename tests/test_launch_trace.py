"""benchmarks/micro/launch_trace.py, the guard for refactors of the select path, still traces it: at testbed bs 1 on a
faked sm_90 card the served path launches what its plan says (PDL, the top-K split and merge first, the projections'
side stream, the folded route's Triton GEMMs, the cosine kernel with the walk)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_launch_trace_of_the_served_path(tmp_path):
    out = tmp_path / "trace.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "launch-trace",
            "--out",
            str(out),
            "--geometry",
            "testbed",
            "--mode",
            "h100",
            "--bs",
            "1",
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))},
    )
    events = json.loads(out.read_text())["testbed h100 bs 1 select"]
    kernels = [e[1] for e in events if e[0] == "triton"]
    assert kernels[:2] == ["_topk_lse_split_kernel", "_topk_lse_merge_kernel"] and "_gemm_kernel" in kernels
    split = next(e[3] for e in events if e[0] == "triton" and e[1] == "_topk_lse_split_kernel")
    assert split["PDL"]
    assert (
        kernels[-1] == "_lattice_cosine_kernel"
        and ["side", "fork"] in events
        and not any(e[0] == "error" for e in events)
    )
