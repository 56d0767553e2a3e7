"""The draft-KV append of a decode step (the drafter's K/V of each committed prefix, and each request's anchor) as a
CUDA graph per (batch size, verify width): `capture` records the worker's eager `append(**inputs)` over static inputs;
`replay` copies a step's inputs in and replays, or returns False for a size not captured (the caller appends eagerly).
"""

from __future__ import annotations

import logging

import torch

from . import ALGORITHM_NAME

logger = logging.getLogger(__name__)


class AppendGraphs:
    def __init__(self, *, max_batch: int, block_size: int, hidden_width: int, dtype, device) -> None:
        rows = max_batch * block_size
        with torch.inference_mode(False):
            self.hidden = torch.zeros((rows, hidden_width), dtype=dtype, device=device)
            self.positions = torch.zeros((rows,), dtype=torch.int64, device=device)
            self.commit_lens = torch.ones((max_batch,), dtype=torch.int32, device=device)
            self.slots = torch.zeros((max_batch,), dtype=torch.int64, device=device)
            # per width, so that a batch's [b, w] window is one contiguous block
            self.locs = {
                w: torch.zeros((max_batch, w), dtype=torch.int64, device=device) for w in range(1, block_size + 1)
            }
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def inputs(self, batch: int, width: int) -> dict:
        loc_2d = self.locs[width][:batch]
        return {
            "target_hidden": self.hidden[: batch * width],
            "cache_loc": loc_2d.view(-1),
            "cache_loc_2d": loc_2d,
            "positions": self.positions[: batch * width],
            "commit_lens": self.commit_lens[:batch],
            "slots": self.slots[:batch],
        }

    def capture(self, append, batches: list[int], widths: list[int]) -> None:
        """Record `append(**inputs)` at every (batch, width), largest first, the inputs pointing at KV padding slot 0
        and request slot 0; a size whose capture fails is left out (logged once)."""
        sizes = sorted(((b, w) for b in batches for w in widths), reverse=True)
        if not sizes:
            return
        append(**self.inputs(*sizes[0]))  # eager once at the largest: workspaces grow to it before any capture
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        failed = []
        for b, w in sizes:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool):
                    append(**self.inputs(b, w))
            except Exception as e:  # noqa: BLE001 - a size that cannot be captured is appended eagerly
                failed.append(f"{b}x{w} ({type(e).__name__}: {e})")
                continue
            self.graphs[(b, w)] = graph
        logger.info(
            "%s: the draft-KV append captured at %d (batch, width) sizes%s.",
            ALGORITHM_NAME,
            len(self.graphs),
            f"; appended eagerly at {', '.join(failed[:4])}" if failed else "",
        )

    def replay(self, *, target_hidden, cache_loc_2d, positions, commit_lens, slots) -> bool:
        batch, width = cache_loc_2d.shape
        graph = self.graphs.get((int(batch), int(width)))
        if graph is None:
            return False
        rows = int(batch) * int(width)
        self.hidden[:rows].copy_(target_hidden[:rows])
        self.locs[int(width)][: int(batch)].copy_(cache_loc_2d)
        self.positions[:rows].copy_(positions)
        self.commit_lens[: int(batch)].copy_(commit_lens)
        self.slots[: int(batch)].copy_(slots)
        graph.replay()
        return True
