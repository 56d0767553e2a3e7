"""Exact acceptance replay: the tau a deterministic draft earns on outputs the target already produced. Verification
accepts d_k iff it equals the emitted token (at T > 0 too, as rejection sampling of q = 1), so a block anchored at i
accepts the longest prefix of its draft equal to o_{i+1..}; drafts for every anchor come teacher-forced in one pass."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import torch

from ..frozen_target import FrozenTarget
from .propose import BlockProposer


@dataclasses.dataclass
class TurnReplay:
    completion_tokens: int
    accepted: dict[str, list[int]]  # draft name -> drafted tokens accepted by each verify block, in order

    def blocks(self, name: str) -> int:
        return len(self.accepted[name])


def matched_prefix(drafts: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """drafts [N, S] at anchors 0..N-1 of output [L] -> [N]: leading drafted tokens equal to the output's next."""
    n, s = drafts.shape
    idx = torch.arange(n, device=output.device)[:, None] + 1 + torch.arange(s, device=output.device)  # [N, S]
    truth = torch.where(idx < output.shape[0], output[idx.clamp(max=output.shape[0] - 1)], -1)
    return (drafts == truth).long().cumprod(dim=1).sum(dim=1)


def walk_blocks(matched: Sequence[int], length: int) -> list[int]:
    """Per-anchor matches over an output of `length` tokens -> accepted drafts per block (a block at i emits min(m_i +
    1, length - 1 - i) tokens)."""
    accepted, i = [], 0
    while i < length - 1:
        emitted = min(int(matched[i]) + 1, length - 1 - i)
        accepted.append(emitted - 1)
        i += emitted
    return accepted


class Replayer:
    """Replays turns for several proposers over one frozen target (one target pass per turn)."""

    def __init__(self, target: FrozenTarget, proposers: Mapping[str, BlockProposer]) -> None:
        self.target, self.proposers = target, dict(proposers)
        layers = {p.drafter.config.target_layer_ids for p in self.proposers.values()}
        if len(layers) > 1:
            raise ValueError(f"the drafts capture different target layers {sorted(layers)}; replay them separately.")

    @torch.no_grad()
    def matches(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> dict[str, dict[str, list[int]]]:
        """-> {proposer label: {draft name: its block's drafted tokens matching the output, at anchors 0..L-2}}."""
        if not prompt_ids:
            raise ValueError("replay: the prompt is empty; a turn needs at least one prompt token.")
        if len(output_ids) < 2:
            return {label: {name: [] for name in p.draft_names} for label, p in self.proposers.items()}
        dev = self.target.embedding.weight.device
        # the last output token is no one's context
        ids = torch.tensor([list(prompt_ids) + list(output_ids[:-1])], device=dev)
        features, _ = self.target.run(ids, torch.ones_like(ids))  # [1, n + L - 1, F]
        output = torch.tensor(list(output_ids), device=dev)
        anchors = len(prompt_ids) + torch.arange(len(output_ids) - 1, device=dev)
        drafts = {label: p.blocks(features, anchors, output[:-1]) for label, p in self.proposers.items()}
        return {label: {d: matched_prefix(x, output).tolist() for d, x in by.items()} for label, by in drafts.items()}

    def turn(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> dict[str, TurnReplay]:
        """-> {proposer label: TurnReplay over its drafts}."""
        n = len(output_ids)
        found = self.matches(prompt_ids, output_ids)
        return {label: TurnReplay(n, {d: walk_blocks(m, n) for d, m in by.items()}) for label, by in found.items()}


def pooled_tau(replays: Sequence[TurnReplay], name: str) -> float:
    """Completion tokens / verify blocks over many turns (NaN when no turn ran a block)."""
    blocks = sum(r.blocks(name) for r in replays)
    return sum(r.completion_tokens for r in replays) / blocks if blocks else float("nan")
