"""What the serving select must compute, in PyTorch, and how close two score sets may be before their walks part."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..head import LiLiCorrHead
from ..kernels.topk_reference import topk_lse_reference
from ..walk import WALKS


def reference_select(head: LiLiCorrHead, token_table, hidden, anchor_hidden, lm_head_weight, walk: str = "greedy"):
    """The PyTorch definition `FastLiLiCorrSelect.select` must equal: LiLiCorrHead.forward + the select's rule
    (walk.WALKS[walk]: greedy_walk, or viterbi) on the stable-sorted top-K of the logits.
    -> (draft ids, candidate ids, log-probs, start, pair)."""
    b, s, hm = hidden.shape
    k = head.config.candidate_topk
    with torch.no_grad():
        logits = F.linear(hidden.reshape(b * s, hm).to(lm_head_weight.dtype), lm_head_weight)
        vals, ids, lse = topk_lse_reference(logits, k)
        lp = (vals - lse.unsqueeze(-1)).view(b, s, k)
        ids = ids.view(b, s, k)
        start, pair = head(token_table[ids], lp, hidden, anchor_hidden)
        path = WALKS[walk](start, pair)
    return ids.gather(2, path.unsqueeze(-1)).squeeze(-1), ids, lp, start, pair


def greedy_margin(start: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
    """[b] fp32: the smallest best-minus-second-best score gap along the greedy path of (start, pair).
    Two score sets that differ by less than half of it everywhere walk the same path."""
    rows = torch.arange(start.shape[0], device=start.device)
    if start.shape[-1] < 2:
        return torch.full((start.shape[0],), float("inf"), device=start.device)
    top2 = start.float().topk(2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]
    cur = start.argmax(-1)
    for s in range(pair.shape[1]):
        row = pair[rows, s, cur].float()
        top2 = row.topk(2, dim=-1).values
        gap = torch.minimum(gap, top2[:, 0] - top2[:, 1])
        cur = row.argmax(-1)
    return gap
