"""What the two correctors share: a proposal (corrected step logits, the token each step picks, DSpark's
confidence) and the config keys that tell them apart in a checkpoint.

Shapes: R blocks, S drafted slots (B - 1), V vocabulary, Hm drafter hidden width.
A step s (1..S) reads the token before it: the anchor for s = 1, else slot s - 1's token, which is the
step's own pick at serving time and the given token (`forced`) when training teacher-forces the block.
"""

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
