"""Timing of GPU work as the server runs it: one call captured in a CUDA graph, then the median
of triton.testing.do_bench over its replays (do_bench flushes L2 between replays)."""

from __future__ import annotations

import torch


def capture(fn, warm: int = 3):
    """-> (CUDA graph of one fn() call, its outputs); warm eager calls on a side stream first
    (Triton compiles and cuBLAS picks its kernels outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def graph_ms(fn, rep_ms: int = 100) -> tuple[float, object]:
    """-> (median ms per replay of the graph of one fn() call, the captured outputs)."""
    from triton.testing import do_bench

    graph, out = capture(fn)
    ms = float(do_bench(graph.replay, warmup=25, rep=rep_ms, return_mode="median"))
    del graph
    return ms, out
