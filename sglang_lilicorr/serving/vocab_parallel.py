"""The draft block's candidates under tensor parallelism (each rank a contiguous shard of the LM head): partial
top-K/LSE, all-gathered into static buffers, merged into the TP = 1 candidates (kernels/topk_shards.py). Imports no
sglang."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels.topk_shards import merge_partials, shard_partials

Gather = Callable[[torch.Tensor, torch.Tensor], None]  # all_gather_into_tensor(out [ranks * n, ...], inp [n, ...])


@dataclass(frozen=True)
class VocabShard:
    """This rank's part of the LM head's vocabulary: global ids start .. start + size - 1 of vocab_size."""

    start: int
    size: int
    vocab_size: int
    ranks: int
    gather: Gather

    def __post_init__(self) -> None:
        if not (0 <= self.start and 0 <= self.size and self.start + self.size <= self.vocab_size and self.ranks >= 1):
            raise ValueError(
                f"VocabShard: ids {self.start}..{self.start + self.size - 1} of a {self.vocab_size}-token vocabulary "
                f"over {self.ranks} ranks is not a shard of it."
            )


class ShardedCandidates:
    """The select plan's merge: logits [N, shard.size] -> the whole vocabulary's (vals, global ids, lse)."""

    def __init__(self, weight: torch.Tensor, shard: VocabShard, topk: int) -> None:
        if weight.dim() != 2 or weight.shape[0] != shard.size:
            raise ValueError(
                f"ShardedCandidates: the LM head shard is {tuple(weight.shape)}, expected [{shard.size}, Hm]."
            )
        if topk > shard.vocab_size:
            raise ValueError(f"ShardedCandidates: K={topk} candidates from a {shard.vocab_size}-token vocabulary.")
        self.weight, self.shard, self.topk = weight, shard, topk
        self.partials: torch.Tensor | None = None  # [max slots, K+1] int64
        self.gathered: torch.Tensor | None = None  # [ranks * max slots, K+1] int64

    def allocate(self, max_slots: int) -> None:
        """Static buffers for calls of at most max_slots = rows * S slots."""
        shape, device = (int(max_slots), self.topk + 1), self.weight.device
        with torch.inference_mode(False):
            self.partials = torch.empty(shape, dtype=torch.int64, device=device)
            self.gathered = torch.empty((self.shard.ranks * shape[0], shape[1]), dtype=torch.int64, device=device)

    def __call__(self, logits: torch.Tensor):
        n = logits.shape[0]
        if self.partials is None or n > self.partials.shape[0]:
            raise RuntimeError(
                f"ShardedCandidates: {n} slots, but allocate() sized it for "
                f"{0 if self.partials is None else self.partials.shape[0]}."
            )
        partials = shard_partials(logits, self.topk, self.shard.start, out=self.partials[:n])
        gathered = self.gathered[: self.shard.ranks * n]
        self.shard.gather(gathered, partials)
        return merge_partials(gathered.view(self.shard.ranks, n, self.topk + 1), self.topk)
