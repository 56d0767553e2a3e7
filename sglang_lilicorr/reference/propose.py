"""Drafting blocks: for anchors a_1..a_N of one sequence, the drafter runs [x_{a_n}, mask x S] over the projected
context before a_n -> logits [N, S, V] -> the argmax block, the LiLiCorr block (pipeline torch route) or a baseline
head's correction. Each block sees what it would see drafted alone, so replay (many anchors) and the decoder agree."""

from __future__ import annotations

import dataclasses

import torch

from ..drafter import DFlashDrafter, block_attention
from ..fast_path import pipeline
from ..fast_path.plan import Device, torch_plan
from ..frozen_target import FrozenTarget
from ..head import LiLiCorrHead
from ..walk import WALKS

ANCHORS_PER_PASS = 64  # blocks drafted per drafter pass (bounds the [N, S, V] logits)


def walk_draft_name(walk: str) -> str:
    """Name of the LiLiCorr draft a walk commits: 'lilicorr' (greedy, the paper's) or 'lilicorr_<walk>'."""
    return "lilicorr" if walk == "greedy" else f"lilicorr_{walk}"


class BlockProposer:
    """The drafts of one sequence's blocks: the drafter's argmax, and with a head its proposal under each walk rule
    (a LiLiCorr head) or its correction (a Domino or DSpark head), named by draft_names."""

    def __init__(
        self,
        target: FrozenTarget,
        drafter: DFlashDrafter,
        head: torch.nn.Module | None = None,
        walks: tuple[str, ...] = ("greedy",),
    ):
        bad = [w for w in walks if w not in WALKS]
        if bad or not walks:
            raise ValueError(f"walk={bad[0] if bad else walks!r}: choose from {sorted(WALKS)}.")
        cfg = drafter.config
        target.check_fits(cfg.hidden_size, cfg.vocab_size)
        if isinstance(head, LiLiCorrHead) and head.config.block_size != cfg.block_size:
            raise ValueError(
                f"LiLiCorr head block_size={head.config.block_size} differs from the drafter's {cfg.block_size}: "
                "the head must be trained for the drafter's block."
            )
        self.target, self.drafter, self.head, self.walks = target, drafter.eval(), head, tuple(walks)
        self.block_size, self.mask_token_id = cfg.block_size, cfg.mask_token_id

    @property
    def draft_names(self) -> tuple[str, ...]:
        if self.head is None:
            return ("argmax",)
        if isinstance(self.head, LiLiCorrHead):
            return ("argmax", *map(walk_draft_name, self.walks))
        return ("argmax", self.head.config.kind)

    @torch.no_grad()
    def __call__(self, features: torch.Tensor, anchor_token: int) -> dict[str, torch.Tensor]:
        """One block: features [1, a, F] of positions 0..a-1, the anchor at a -> {name: [S] token ids}."""
        a, dev = features.shape[1], features.device
        if a < 1:
            raise ValueError("BlockProposer: the context is empty; prefill at least one prompt token first.")
        drafts = self.blocks(features, torch.tensor([a], device=dev), torch.tensor([anchor_token], device=dev))
        return {name: d[0] for name, d in drafts.items()}

    @torch.no_grad()
    def blocks(
        self, features: torch.Tensor, anchors: torch.Tensor, anchor_tokens: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Blocks at anchors [N] (1 <= a <= T) of features [1, T, F], anchor_tokens [N] -> {name: [N, S] ids}."""
        context = self.drafter.project_target_hidden(features)  # [1, T, Hm]
        parts = [
            self._blocks(context, a, x)
            for a, x in zip(anchors.split(ANCHORS_PER_PASS), anchor_tokens.split(ANCHORS_PER_PASS))
        ]
        return {name: torch.cat([p[name] for p in parts]) for name in self.draft_names}

    def _blocks(
        self, context: torch.Tensor, anchors: torch.Tensor, anchor_tokens: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        n, b, dev = anchors.shape[0], self.block_size, context.device
        block = torch.full((n, b), self.mask_token_id, dtype=torch.long, device=dev)
        block[:, 0] = anchor_tokens
        positions = (anchors[:, None] + torch.arange(b, device=dev)).view(1, n * b)
        ctx_pos = torch.arange(context.shape[1], device=dev)[None]
        attend = block_attention(anchors[None], torch.ones(1, n, dtype=torch.bool, device=dev), context.shape[1], b)
        hidden = self.drafter(self.target.embed(block.view(1, -1)), positions, context, ctx_pos, attend)
        pass_hidden = hidden.view(n, b, -1)[:, 1:]  # [N, S, Hm]
        logits = self.target.logits(pass_hidden).float()  # [N, S, V]
        drafts = {"argmax": logits.argmax(dim=-1)}
        if self.head is not None and not isinstance(self.head, LiLiCorrHead):  # a Domino or DSpark head
            drafts[self.head.config.kind] = self.head(pass_hidden, logits, anchor_tokens, self.target.embed).ids
        elif self.head is not None:
            plan = torch_plan(Device.of(logits), self.walks[0])
            proposal = pipeline.propose(
                logits.flatten(0, 1),
                pass_hidden,
                context[0, anchors - 1],
                topk=self.head.config.candidate_topk,
                scores=pipeline.head_forward(self.head, self._token_states),
                plan=plan,
            )
            drafts[walk_draft_name(self.walks[0])] = proposal.draft
            for rule in self.walks[1:]:  # the other rules on the same scores
                drafts[walk_draft_name(rule)] = pipeline.walk(
                    proposal.start, proposal.pair, proposal.ids, dataclasses.replace(plan, walk=rule)
                )
        return drafts

    def _token_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The head's token term of candidate ids [N, S, K] -> [N, S, K, H], from the target's embeddings."""
        return self.head.project_tokens(self.target.embed(ids).to(next(self.head.parameters()).dtype))
