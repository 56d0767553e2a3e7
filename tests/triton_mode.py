"""Where this test session runs the Triton kernels: compiled on a CUDA machine, under the
interpreter on a CPU one (tests/conftest.py selects it before any kernel module is imported)."""

import pytest
import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

CUDA = torch.cuda.is_available()
INTERPRETER = isinstance(tl.max, InterpretedFunction)
needs_interpreter = pytest.mark.skipif(not INTERPRETER, reason="triton is in compiled mode (no CUDA here?)")


def graph_replay(fn):
    """fn() captured in a CUDA graph (its kernels already compiled by an eager call) and replayed
    once -> the captured output."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return out
