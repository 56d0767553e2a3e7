"""Drafting one block: the DFlash drafter's argmax block and the LiLiCorr block (paper Sec. 3).

For a context of a committed tokens whose last one (the anchor, position a) the target has not
run yet, and target features of positions 0..a-1:
  context      = drafter.project_target_hidden(features)                     [1, a, Hm]
  hidden       = drafter([anchor, mask x S] at positions a..a+S | context)   [1, B, Hm]
  logits       = target LM head(hidden of slots 1..S)                         [S, V]
  argmax block = logits.argmax(-1)                                            [S]
  LiLiCorr     = top-K (topk_lse) -> head(start, pair) -> greedy walk / Viterbi
                 -> the chosen candidate of each slot                         [S]
The head's anchor input is the projected context of the token before the anchor (position a-1),
as in training (`train/joint.py`).
"""
from __future__ import annotations

import torch

from ..drafter import DFlashDrafter
from ..head import LiLiCorrHead
from ..kernels import topk_lse
from ..frozen_target import FrozenTarget
from ..walk import greedy_walk, viterbi

WALKS = {"greedy": greedy_walk, "viterbi": viterbi}


class BlockProposer:
    def __init__(self, target: FrozenTarget, drafter: DFlashDrafter, head: LiLiCorrHead | None = None, walk: str = "greedy"):
        if walk not in WALKS:
            raise ValueError(f"walk={walk!r}: choose one of {sorted(WALKS)}.")
        cfg = drafter.config
        target.check_fits(cfg.hidden_size, cfg.vocab_size)
        if head is not None and head.config.block_size != cfg.block_size:
            raise ValueError(
                f"LiLiCorr head block_size={head.config.block_size} differs from the drafter's {cfg.block_size}: "
                "the head must be trained for the drafter's block."
            )
        self.target, self.drafter, self.head, self.walk = target, drafter.eval(), head, WALKS[walk]
        self.block_size, self.mask_token_id = cfg.block_size, cfg.mask_token_id

    @property
    def draft_names(self) -> tuple[str, ...]:
        return ("argmax",) if self.head is None else ("argmax", "lilicorr")

    @torch.no_grad()
    def __call__(self, features: torch.Tensor, anchor_token: int) -> dict[str, torch.Tensor]:
        """features [1, a, n*Hm] of positions 0..a-1 -> {"argmax": [S], "lilicorr": [S]} token ids."""
        a, dev = features.shape[1], features.device
        if a < 1:
            raise ValueError("BlockProposer: the context is empty; prefill at least one prompt token first.")
        context = self.drafter.project_target_hidden(features)  # [1, a, Hm]
        block = torch.full((1, self.block_size), self.mask_token_id, dtype=torch.long, device=dev)
        block[0, 0] = anchor_token
        positions = a + torch.arange(self.block_size, device=dev)[None]  # [1, B]
        ctx_pos = torch.arange(a, device=dev)[None]  # [1, a]
        attend = torch.ones(1, self.block_size, a + self.block_size, dtype=torch.bool, device=dev)
        hidden = self.drafter(self.target.embed(block), positions, context, ctx_pos, attend)  # [1, B, Hm]
        pass_hidden = hidden[:, 1:]  # [1, S, Hm]
        logits = self.target.logits(pass_hidden[0]).float()  # [S, V]
        drafts = {"argmax": logits.argmax(dim=-1)}
        if self.head is not None:
            vals, ids, lse = topk_lse(logits, self.head.config.candidate_topk)  # [S, K], [S, K], [S]
            cand_lp = vals - lse[:, None]  # log-softmax of the K candidates, descending
            head_dtype = next(self.head.parameters()).dtype
            token_states = self.head.project_tokens(self.target.embed(ids).to(head_dtype))  # [S, K, H]
            start, pair = self.head(token_states[None], cand_lp[None], pass_hidden, context[:, -1])
            pick = self.walk(start, pair)[0]  # [S] candidate index per slot
            drafts["lilicorr"] = ids.gather(1, pick[:, None]).squeeze(1)
        return drafts
