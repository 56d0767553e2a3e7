"""The PyTorch reference speculative decoder, one request: each block drafts {"argmax", "lilicorr"} (`commit` is
verified), verifies (verify.py) and rolls the target's HF KV cache back to the accepted tokens; at T = 0 the other
drafts are scored on the same contexts. `tau` = completion tokens / verify blocks (SGLang's `spec_accept_length`)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import torch
from torch import nn
from transformers import DynamicCache

from ..drafter import DFlashDrafter
from ..head import LiLiCorrHead
from ..frozen_target import FrozenTarget
from .propose import BlockProposer
from .verify import greedy_verify, sample_token, sample_verify

Proposer = Callable[[torch.Tensor, int], dict[str, torch.Tensor]]  # (features [1, a, F], anchor) -> drafts


class CachedTarget:
    """The target read incrementally: an HF KV cache grown by one verify block (`extend`) and rolled back."""

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


@dataclasses.dataclass
class BlockRecord:
    anchor_pos: int  # position of the anchor (last committed token) in prompt + output
    drafts: dict[str, list[int]]  # every draft proposed on this context
    accepted: dict[str, int]  # drafted tokens the target accepts, per draft (T > 0: committed only)
    committed: str  # whose draft was verified and kept
    emitted: list[int]  # tokens this block committed (accepted drafts + the target's token)

    @property
    def num_slots(self) -> int:
        return len(self.drafts[self.committed])


@dataclasses.dataclass
class DecodeResult:
    prompt_ids: list[int]
    output_ids: list[int]
    blocks: list[BlockRecord]
    temperature: float

    @property
    def verify_count(self) -> int:
        return len(self.blocks)

    @property
    def tau(self) -> float:
        """SGLang's spec_accept_length: completion tokens / verify blocks (nan without a block)."""
        return len(self.output_ids) / self.verify_count if self.blocks else float("nan")

    def block_tau(self, name: str) -> float:
        """Mean tokens per block draft `name` earns on the shared contexts (accepted + 1)."""
        counts = [b.accepted[name] + 1 for b in self.blocks if name in b.accepted]
        return sum(counts) / len(counts) if counts else float("nan")


class SpeculativeDecoder:
    def __init__(self, target: FrozenTarget, propose: Proposer, commit: str):
        self.target, self.propose, self.commit = target, propose, commit
        self.cached = CachedTarget(target)
        self.device = target.embedding.weight.device

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        stop_ids: Iterable[int] = (),
        on_block: Callable[[BlockRecord], None] | None = None,
    ) -> DecodeResult:
        if not prompt_ids:
            raise ValueError("generate: the prompt is empty; pass at least one token id.")
        if max_new_tokens < 1 or temperature < 0:
            raise ValueError(
                f"generate: need max_new_tokens >= 1 and temperature >= 0, got {max_new_tokens}, {temperature}."
            )
        stop, prompt = set(stop_ids), list(prompt_ids)
        self.cached.reset()
        features, hidden = self.cached.extend(torch.tensor([prompt], device=self.device))  # [1, n, F]
        out = [sample_token(self.target.logits(hidden[0, -1]).float(), temperature, generator)]
        blocks: list[BlockRecord] = []
        while len(out) < max_new_tokens and out[-1] not in stop:
            block, new_features = self.step(prompt + out, features, temperature, generator)
            room = block.emitted[: max_new_tokens - len(out)]
            ends = [i for i, t in enumerate(room) if t in stop]
            block.emitted = room[: ends[0] + 1] if ends else room
            out += block.emitted
            features = torch.cat([features, new_features], dim=1)
            blocks.append(block)
            if on_block is not None:
                on_block(block)
        if temperature == 0:
            self.score_other_drafts(prompt + out, blocks)
        return DecodeResult(prompt, out, blocks, temperature)

    def step(
        self, tokens: list[int], features: torch.Tensor, temperature: float, generator
    ) -> tuple[BlockRecord, torch.Tensor]:
        """Draft and verify one block (the cache then holds the committed tokens but the next anchor) -> (record, target
        features of the anchor and accepted drafts)."""
        a = len(tokens) - 1
        drafts = self.propose(features, tokens[-1])
        if self.commit not in drafts:
            raise ValueError(f"commit={self.commit!r} is not among the proposer's drafts {sorted(drafts)}.")
        draft = drafts[self.commit].to(self.device)  # [S]
        feats, hidden = self.cached.extend(torch.cat([torch.tensor([tokens[-1]], device=self.device), draft])[None])
        logits = self.target.logits(hidden[0]).float()  # [S+1, V] at positions a..a+S
        if temperature > 0:
            m, emitted = sample_verify(logits, draft, temperature, generator)
        else:
            m, emitted = greedy_verify(logits, draft)
        self.cached.rollback(a + 1 + m)
        record = BlockRecord(a, {n: d.tolist() for n, d in drafts.items()}, {self.commit: m}, self.commit, emitted)
        return record, feats[:, : m + 1]

    def score_other_drafts(self, tokens: list[int], blocks: list[BlockRecord]) -> None:
        """Greedy acceptance of the uncommitted drafts: how far each agrees with the tokens emitted."""
        for b in blocks:
            truth = tokens[b.anchor_pos + 1 : b.anchor_pos + b.num_slots + 1]
            for name, draft in b.drafts.items():
                if name in b.accepted:
                    continue
                m = 0
                while m < len(truth) and draft[m] == truth[m]:
                    m += 1
                if m == len(truth) < len(draft):  # ran past the end of the output
                    ids = torch.tensor([tokens[: b.anchor_pos + 1] + draft], device=self.device)
                    _, final = self.target.run(ids, torch.ones_like(ids))
                    m, _ = greedy_verify(
                        self.target.logits(final[0, b.anchor_pos :]).float(), torch.tensor(draft, device=self.device)
                    )
                b.accepted[name] = m


def speculative_decoder(
    model: nn.Module,
    drafter: DFlashDrafter,
    head: LiLiCorrHead | None = None,
    walk: str = "greedy",
    commit: str | None = None,
) -> SpeculativeDecoder:
    """A decoder over an HF target committing the LiLiCorr block (by `walk`) with a head, else the argmax block."""
    target = FrozenTarget(model, drafter.config.target_layer_ids)
    proposer = BlockProposer(target, drafter, head, (walk,))
    commit = commit or proposer.draft_names[-1]
    if commit not in proposer.draft_names:
        raise ValueError(f"commit={commit!r}: this drafter proposes {proposer.draft_names} (a head adds 'lilicorr').")
    return SpeculativeDecoder(target, proposer, commit)
