"""The target's verify at widths below the block (verify_width.py): per width an attention backend and CUDA graphs
captured at start-up and swapped in for that width's steps (built while speculative_num_draft_tokens reads it), and each
width's step cost from replaying them (StepCosts.replay)."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import torch

from . import ALGORITHM_NAME

logger = logging.getLogger(__name__)


@dataclass
class VerifyTier:
    width: int
    attn_backend: object
    graph_runner: object | None  # None where the target runs without decode graphs


@contextlib.contextmanager
def draft_tokens_read_as(width: int):
    """SGLang's speculative_num_draft_tokens reads `width` inside the block (for the builders of a tier)."""
    from sglang.srt.runtime_context import get_context, get_spec

    before = int(get_spec().speculative_num_draft_tokens)
    get_context().override("lilicorr.verify_tier", speculative_num_draft_tokens=int(width))
    try:
        yield
    finally:
        get_context().override("lilicorr.verify_tier", speculative_num_draft_tokens=before)


def build_tier(model_runner, width: int, configure_attention) -> VerifyTier:
    """The target's attention backend and decode-graph runner for `width` tokens a request, captured now;
    `configure_attention(backend, width)` picks the verify kernel first."""
    with draft_tokens_read_as(width):
        workspace = model_runner.init_new_workspace
        try:
            backend = model_runner._get_attention_backend(init_new_workspace=True)
        finally:
            model_runner.init_new_workspace = workspace
        configure_attention(backend, width)
        runner = None
        if model_runner.decode_cuda_graph_runner is not None:
            runner = type(model_runner.decode_cuda_graph_runner)(
                model_runner, attn_backend=backend, speculative_num_steps=1, speculative_num_draft_tokens=width
            )
    return VerifyTier(width, backend, runner)


@contextlib.contextmanager
def verifying(model_runner, tier: VerifyTier | None):
    """The target runs `tier`'s attention backend and graphs inside the block (None: its own)."""
    if tier is None:
        yield
        return
    saved = model_runner.attn_backend, model_runner.decode_cuda_graph_runner
    model_runner.attn_backend, model_runner.decode_cuda_graph_runner = tier.attn_backend, tier.graph_runner
    try:
        yield
    finally:
        model_runner.attn_backend, model_runner.decode_cuda_graph_runner = saved


def captured_graphs(runner) -> dict[int, torch.cuda.CUDAGraph]:
    """A decode-graph runner's CUDA graphs by batch size (default variants); {} where kept elsewhere."""
    graphs = getattr(getattr(runner, "backend", None), "_graphs", None) or {}
    return {
        int(key.size): graph
        for key, graph in graphs.items()
        if getattr(key, "stream_idx", None) is None
        and getattr(key, "variant_label", None) is None
        and getattr(key, "attention_variant", None) is None
    }


def replay_seconds(graphs: list[torch.cuda.CUDAGraph], repeats: int = 20) -> float:
    """Seconds one back-to-back replay of `graphs` takes (median of `repeats`, after one warm replay)."""
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for graph in graphs:
            graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_replay(
    verify_graphs: dict[int, dict[int, torch.cuda.CUDAGraph]], draft_graphs: dict[int, torch.cuda.CUDAGraph], chain: int
) -> dict[tuple[int, int], float]:
    """StepCosts.replay: seconds of replaying a step's graphs per width and batch size (the draft and the verify; width
    1: its verify `chain` times). Before serving only (a replay writes the padding slot and graph buffers)."""
    replay = {}
    for width, by_batch in sorted(verify_graphs.items()):
        for batch, verify in sorted(by_batch.items()):
            if width > 1 and batch not in draft_graphs:
                continue
            graphs = [draft_graphs[batch], verify] if width > 1 else [verify] * chain
            replay[(width, batch)] = replay_seconds(graphs)
    if replay:
        logger.info(
            "%s: one decode step's captured graphs replay in %s ms (width: ms at the smallest..largest batch).",
            ALGORITHM_NAME,
            ", ".join(
                f"{w}: {1e3 * replay[(w, min(b))]:.3f}..{1e3 * replay[(w, max(b))]:.3f}"
                for w, b in _batches_by_width(replay).items()
            ),
        )
    return replay


def _batches_by_width(replay: dict[tuple[int, int], float]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for w, b in replay:
        out.setdefault(w, []).append(b)
    return out
