"""The target read incrementally: an HF KV cache grown by one verify block (`extend`) and rolled back."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..frozen_target import FrozenTarget


class CachedTarget:
    def __init__(self, target: FrozenTarget) -> None:
        self.target = target
        self.cache: DynamicCache | None = None

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.target.model.config)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [1, n] at positions length..length+n-1 -> (features [1, n, k*Hm], final hidden [1, n, Hm])."""
        if self.cache is None:
            raise RuntimeError("CachedTarget.extend before reset(): start a request with reset().")
        features, out = self.target.decode(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return features, out.last_hidden_state

    def rollback(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        extra = self.length - length
        if extra < 0:
            raise ValueError(f"rollback to {length} positions, but only {self.length} are cached.")
        if extra:
            self.cache.crop(-extra)
