"""What the two correctors share: a proposal (step logits, tokens, DSpark's confidence) and config keys. R blocks, S
slots, V vocabulary, Hm hidden; step s reads the token before it (anchor, slot s - 1's pick, or `forced`)."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Proposal:
    logits: torch.Tensor  # [R, S, V] corrected step logits (fp32)
    ids: torch.Tensor  # [R, S] argmax of each step's logits
    confidence: torch.Tensor | None = None  # [R, S] DSpark: raw logit of "this slot is accepted" (sigmoid -> prob)


def previous_tokens(anchor: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """anchor [R], forced [R, S] -> [R, S] the token each step reads: anchor, forced_1 .. forced_{S-1}."""
    return torch.cat([anchor[:, None], forced[:, :-1]], dim=1)
