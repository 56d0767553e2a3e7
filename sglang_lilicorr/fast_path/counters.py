"""The int32 zero counters of the cosine kernel's walk; the kernel leaves them at zero, so calls share them."""

from __future__ import annotations

import torch


class KernelCounters:
    def __init__(self, device, size: int = 4096) -> None:
        """Sized up front (4096 requests), so a CUDA-graph capture never reallocates them."""
        self.buffer = torch.zeros(size, dtype=torch.int32, device=device)

    def at_least(self, need: int) -> torch.Tensor:
        """The buffer, with at least `need` zeros: grown in eager mode, refused by name while a graph is captured."""
        if self.buffer.numel() < need:
            if self.buffer.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"select: this batch needs {need} kernel counters, more than the {self.buffer.numel()} "
                    f"allocated; run one eager select at this batch size before capturing a CUDA graph of it"
                )
            self.buffer = torch.zeros(need, dtype=torch.int32, device=self.buffer.device)
        return self.buffer
