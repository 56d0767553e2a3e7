"""The lab: what measures and checks the product, run from a checkout against the installed package, never installed
and never imported by it. One entry point, `python -m benchmarks STEP ARGS...` (benchmarks/README.md lists the steps).

Each step is a module with `main(argv) -> int`; only the chosen one is imported, since several set the environment
before torch loads. A step that ends on one of the project's errors prints it as one line, as `lilicorr` does.
Steps write their JSON documents whole with `save_json`.

The lab's SGLang plugin (instrumentation/) is not installed either: SGLang finds plugins by entry point, and
INSTRUMENTATION is a folder holding that entry point. A process whose PYTHONPATH holds the checkout and that folder
(`lab_env`; the GPU machine's shell: device/check_lib.sh) imports the lab, and an SGLang server started so loads the
plugin.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Mapping

CHECKOUT = Path(__file__).resolve().parent.parent
INSTRUMENTATION = CHECKOUT / "benchmarks" / "instrumentation" / "entry_point"

STEPS = {  # step: (module, what it does)
    # micro/: one part of the select path, alone on a GPU
    "head-bench": ("benchmarks.micro.head_bench", "the served select path against SGLang's built-in head"),
    "corrector-bench": ("benchmarks.micro.corrector_bench", "every system's head cost at Qwen3-8B shapes"),
    "kernel-sweeps": ("benchmarks.micro.kernel_sweeps", "one kernel at its default launch and its sweep"),
    "gemm-floor": ("benchmarks.micro.gemm_floor", "how fast the head's GEMMs can go at bs 1"),
    "pdl-chain": ("benchmarks.micro.pdl_chain", "what programmatic dependent launch saves per kernel boundary"),
    "timeline": ("benchmarks.micro.timeline", "the kernel timeline of one served select"),
    "select-digest": ("benchmarks.micro.select_digest", "a digest of the served select's bits on fixed inputs"),
    "compile-census": ("benchmarks.micro.compile_census", "the Triton kernels a draft-graph capture compiles (CPU)"),
    "launch-trace": ("benchmarks.micro.launch_trace", "the select path's kernel launches, traced on a CPU"),
    "graph-check": ("benchmarks.micro.graph_check", "the proposal alone in a CUDA graph: replay == eager"),
    "verify-attention-bench": ("benchmarks.micro.verify_attention_bench", "the target-verify attention alone"),
    # served/: a running server, over HTTP
    "serve-speed": ("benchmarks.served.serve_speed", "summary of paired, rotated throughput rounds"),
    "stages": ("benchmarks.served.stages", "the per-block stage decomposition: table and plot"),
    "faults": ("benchmarks.served.load_faults", "a server under load and faults, then its health and KV pool"),
    "sampling-exactness": ("benchmarks.served.sampling_exactness", "T > 0 exactness against a server"),
    "scale": ("benchmarks.served.scale", "the cost table at Qwen3-8B shapes on one GPU"),
    "scale-report": ("benchmarks.served.scale_report", "the scale phases' bundles -> summary, tables, plot"),
    "backends-summary": ("benchmarks.served.backends_summary", "LILICORR per target attention backend"),
    "baselines-summary": ("benchmarks.served.baselines_summary", "the five systems' cost and tau, one summary"),
    "adaptive-summary": ("benchmarks.served.adaptive_summary", "the adaptive verify width's served speed, both sets"),
    "gpu-client": ("benchmarks.served.gpu_client", "greedy, sampled and concurrent requests to a server"),
    "random-head": ("benchmarks.served.random_head", "a DFlash draft with a random LiLiCorr head"),
    "greedy-check": ("benchmarks.served.greedy_check", "served greedy responses against the float32 target"),
    "bf16-noise": ("benchmarks.served.bf16_noise", "served greedy deviations beside plain bf16 passes of the target"),
    "width-replay": ("benchmarks.served.width_replay", "the adaptive verify width simulated on replayed acceptance"),
    "openai-check": ("benchmarks.served.openai_check", "the OpenAI API through a server, with the openai package"),
    # multi_gpu/: tensor parallelism and multi-GPU training
    "tp-models": ("benchmarks.multi_gpu.tp_models", "the seeded random target and drafts of the multi-GPU checks"),
    "tp-compare": ("benchmarks.multi_gpu.tp_compare", "reports of the multi-GPU checks"),
    "nccl-bench": ("benchmarks.multi_gpu.nccl_bench", "NCCL all-reduce time at the draft's gradient size"),
    "train-profile": ("benchmarks.multi_gpu.train_profile", "`lilicorr train` under torchrun with a profiler window"),
    # training/: lilicorr train at Qwen3-8B shapes
    "roofline": ("benchmarks.training.roofline", "FLOPs per training token, MFU and the recipe's hours at 8B"),
    "train-8b": ("benchmarks.training.train_8b", "memory, tokens/s and phases of head-only and joint training at 8B"),
    # device/: flashinfer for the lent GPU machine
    "flashinfer-headers": ("benchmarks.device.flashinfer_headers", "the headers SGLang's sampling verify needs"),
    "flashinfer-slim": ("benchmarks.device.flashinfer_slim", "a slimmed flashinfer wheel for the GPU machine"),
    "flashinfer-warmup": ("benchmarks.device.flashinfer_warmup", "JIT-build every flashinfer module SGLang uses"),
    # testbed/: the SmolLM2 pipeline
    "testbed": ("benchmarks.testbed.run", "the SmolLM2 testbed: data, training, evaluation, speed, tables"),
}


def save_json(path: str | Path, value) -> Path:
    """`value` as indented JSON, written beside and renamed into place: the file is whole or absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def lab_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the checkout and INSTRUMENTATION after the PYTHONPATH it holds (an installed package before them
    stays the one imported)."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths += [str(p) for p in (CHECKOUT, INSTRUMENTATION) if str(p) not in paths]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def usage() -> str:
    width = max(map(len, STEPS))
    rows = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in STEPS.items())
    return f"usage: python -m benchmarks STEP [ARGS...] (STEP --help: its arguments)\n\nsteps:\n{rows}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in STEPS:
        print(f"error: no step {argv[0]!r} (python -m benchmarks): pick one of {', '.join(STEPS)}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m benchmarks {argv[0]}", *argv[1:]]  # as if the step were a script: its parser's name
    module = importlib.import_module(STEPS[argv[0]][0])  # nothing else before it: a step may set the environment
    try:
        return int(module.main(argv[1:]) or 0)
    except Exception as e:
        from sglang_lilicorr.cli_args import error_line
        from sglang_lilicorr.errors import LiLiCorrError

        if not isinstance(e, LiLiCorrError):
            raise
        print(error_line(e), file=sys.stderr)
        return e.exit_code
