"""The target read incrementally: an HF KV cache that grows by one verify block and rolls back. `extend(ids)` -> the
drafter's context features and final hidden states of those positions; `rollback(length)` drops rejected drafts."""

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
        captured: dict[int, torch.Tensor] = {}

        def grab(index):
            def hook(_module, _args, output):
                captured[index] = output[0] if isinstance(output, (tuple, list)) else output

            return hook

        layers = self.target.layers
        handles = [layers[i].register_forward_hook(grab(i)) for i in set(self.target.target_layer_ids)]
        try:
            out = self.target.model.get_decoder()(input_ids=ids, past_key_values=self.cache, use_cache=True)
        finally:
            for h in handles:
                h.remove()
        self.cache = out.past_key_values
        return torch.cat([captured[i] for i in self.target.target_layer_ids], dim=-1), out.last_hidden_state

    def rollback(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        extra = self.length - length
        if extra < 0:
            raise ValueError(f"rollback to {length} positions, but only {self.length} are cached.")
        if extra:
            self.cache.crop(-extra)
