"""The proposal pipeline of every caller (serving, reference decoder, replay, training): logits [b*S, V] --top-K/lse-->
candidates [b, S, K] --head (`scores`)--> start [b, K], pair [b, S-1, K, K] --walk--> draft [b, S], by plan."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..kernels.topk_reference import topk_lse_reference
from ..walk import WALKS
from .plan import SelectPlan


class Proposal(NamedTuple):
    """A block's proposal: what `propose` returns (the scores with their autograd graph where they have one)."""

    draft: torch.Tensor  # [b, S] int64: the committed candidates' ids
    ids: torch.Tensor  # [b, S, K] int64: the candidates, by descending drafter probability
    log_probs: torch.Tensor  # [b, S, K] fp32: their drafter log-probabilities
    start: torch.Tensor  # [b, K] fp32: the head's start scores
    pair: torch.Tensor  # [b, S-1, K, K] fp32: its pair scores


# (vals [b, S, K], ids, lse [b, S], pass_hidden, anchor_hidden, plan) -> (start, pair, log_probs, draft or None)
Scores = Callable[..., tuple]


def head_forward(head, token_states: Callable[[torch.Tensor], torch.Tensor]) -> Scores:
    """The torch route's scores: LiLiCorrHead.forward on token_states(ids) [b, S, K, H] (no walk)."""

    def scores(vals, ids, lse, pass_hidden, anchor_hidden, plan: SelectPlan):
        log_probs = vals.float() - lse.float().unsqueeze(-1)
        start, pair = head(token_states(ids), log_probs, pass_hidden, anchor_hidden)
        return start, pair, log_probs, None

    return scores


def candidates(logits: torch.Tensor, k: int, plan: SelectPlan):
    """logits [N, V] (merge: this rank's columns) -> (vals fp32 [N, k] descending, ids int64 [N, k], lse fp32 [N]); ties
    to the lowest id; vals and lse carry the logits' gradient."""
    if plan.merge is not None:
        return plan.merge(logits)
    if not plan.kernels:
        return topk_lse_reference(logits, k)  # differentiable
    from ..kernels.topk_lse_fused import topk_lse_triton  # triton imported where it runs

    vals, ids, lse = topk_lse_triton(logits, k, pdl=plan.pdl)
    if torch.is_grad_enabled() and logits.requires_grad:  # the kernel's outputs carry none: the values it chose do
        x = logits.float()
        vals, lse = x.gather(1, ids), x.logsumexp(dim=-1)
    return vals, ids, lse


def walk(start: torch.Tensor, pair: torch.Tensor, ids: torch.Tensor, plan: SelectPlan) -> torch.Tensor:
    """The plan's rule over the scores -> the walked candidates' ids [b, S]."""
    if plan.kernels:  # walk.WALKS's rules in Triton, the gather of the committed ids in the same kernel
        from ..kernels.walk import greedy_walk_triton, viterbi_triton

        kernel = {"greedy": greedy_walk_triton, "viterbi": viterbi_triton}[plan.walk]
        return kernel(start, pair, ids, pdl=plan.pdl)
    path = WALKS[plan.walk](start, pair)
    return ids.gather(2, path.unsqueeze(-1)).squeeze(-1)


def propose(
    logits: torch.Tensor,
    pass_hidden: torch.Tensor,
    anchor_hidden: torch.Tensor,
    *,
    topk: int,
    scores: Scores,
    plan: SelectPlan,
) -> Proposal:
    """logits [b*S, V], pass_hidden [b, S, Hm], anchor_hidden [b, Hm] -> Proposal; the walk reads scores detached."""
    b, s = pass_hidden.shape[:2]
    vals, ids, lse = candidates(logits, topk, plan)
    vals, ids, lse = vals.view(b, s, topk), ids.view(b, s, topk), lse.view(b, s)
    start, pair, log_probs, draft = scores(vals, ids, lse, pass_hidden, anchor_hidden, plan)
    if draft is None:
        draft = walk(start.detach(), pair.detach(), ids, plan)
    return Proposal(draft, ids, log_probs, start, pair)
