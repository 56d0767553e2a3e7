"""DSpark (paper Sec. 2, App. B), served by SGLang 0.5.23 as DSPARK. A Markov head biases each slot's base logits from
the token before it, a confidence head scores each slot (sigmoid: acceptance given the slots before). Per block:
  e_s = w1[y_{s-1}],  y_s = argmax (l_s + bias_s),  confidence_s = Wc [z_s ; e_s] + bc,  bias_s by markov_head_type:
  vanilla  W2 e_s;  gated  W2 (sigmoid(Wg [z_s ; e_s] + bg) * e_s)
  rnn      g, c, o = split3(Wj [u_{s-1} ; e_s ; z_s] + bj),  u_s = sigmoid(g) u_{s-1} + (1 - sigmoid(g)) tanh(c),
           bias_s = W2 tanh(o)
Exported with `sample_from_anchor` false and gamma = S (`block_size`; the verify window is gamma + 1 = B)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from ..config import ConfigError, json_number
from .corrector import Proposal, previous_tokens

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")  # SGLang 0.5.23's SUPPORTED_DSPARK_MARKOV_HEAD_TYPES
ARCHITECTURE = "DSparkDraftModel"


@dataclasses.dataclass(frozen=True)
class DSparkConfig:
    kind: ClassVar[str] = "dspark"
    markov_rank: int  # r
    markov_head_type: str = "vanilla"

    def __post_init__(self) -> None:
        if isinstance(self.markov_rank, bool) or not isinstance(self.markov_rank, int) or self.markov_rank < 1:
            raise ConfigError(f"DSpark markov_rank={self.markov_rank!r} is not an integer >= 1.")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ConfigError(
                f"DSpark markov_head_type={self.markov_head_type!r} is not one of {', '.join(MARKOV_HEAD_TYPES)}."
            )

    def to_keys(self) -> dict[str, Any]:
        return {"kind": self.kind, "markov_rank": self.markov_rank, "markov_head_type": self.markov_head_type}

    @classmethod
    def from_keys(cls, keys: Mapping[str, Any]) -> "DSparkConfig":
        return cls(json_number(keys.get("markov_rank"), int, "markov_rank"), keys.get("markov_head_type", "vanilla"))

    def serving_config(self, draft: Mapping[str, Any]) -> dict[str, Any]:
        """A DFlash draft config (DrafterConfig.to_hf_config form) -> the one SGLang serves this head from."""
        gamma = int(draft["dflash_config"]["block_size"]) - 1
        return {
            **draft,
            "architectures": [ARCHITECTURE],
            "block_size": gamma,
            "dflash_config": {**draft["dflash_config"], "block_size": gamma},
            "markov_rank": self.markov_rank,
            "markov_head_type": self.markov_head_type,
            "sample_from_anchor": False,
            "enable_confidence_head": True,
            "confidence_head_with_markov": True,
        }

    @classmethod
    def of_serving_config(cls, config: Mapping[str, Any]) -> "DSparkConfig | None":
        return cls.from_keys(config) if config.get("architectures") == [ARCHITECTURE] else None

    @staticmethod
    def drafter_config(config: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of serving_config's drafter part: the DFlash draft config (block size B = gamma + 1)."""
        block = int(config["dflash_config"]["block_size"]) + 1
        return {
            **config,
            "architectures": ["DFlashDraftModel"],
            "block_size": block,
            "dflash_config": {**config["dflash_config"], "block_size": block},
        }


class MarkovHead(nn.Module):
    def __init__(self, config: DSparkConfig, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        r, self.kind = config.markov_rank, config.markov_head_type
        self.markov_w1 = nn.Embedding(vocab_size, r)
        self.markov_w2 = nn.Linear(r, vocab_size, bias=False)
        if self.kind == "gated":
            self.gate_proj = nn.Linear(hidden_size + r, r)
        if self.kind == "rnn":
            self.joint_proj = nn.Linear(2 * r + hidden_size, 3 * r)

    def step(self, prev_embedding: torch.Tensor, slot_hidden: torch.Tensor, state: torch.Tensor | None):
        """e_s [R, r], z_s [R, Hm], u_{s-1} [R, r] (rnn) -> (bias_s [R, V], u_s or None)."""
        if self.kind == "vanilla":
            return self.markov_w2(prev_embedding), state
        if self.kind == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([slot_hidden, prev_embedding], dim=-1)))
            return self.markov_w2(gate * prev_embedding), state
        if state is None:
            state = prev_embedding.new_zeros(prev_embedding.shape)
        g, c, o = self.joint_proj(torch.cat([state, prev_embedding, slot_hidden], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        return self.markov_w2(torch.tanh(o)), g * state + (1 - g) * torch.tanh(c)


class ConfidenceHead(nn.Module):
    def __init__(self, config: DSparkConfig, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size + config.markov_rank, 1)

    def forward(self, slot_hidden: torch.Tensor, prev_embeddings: torch.Tensor) -> torch.Tensor:
        """z [R, S, Hm], e [R, S, r] -> raw confidence [R, S]."""
        return self.proj(torch.cat([slot_hidden, prev_embeddings], dim=-1)).squeeze(-1)


class DSparkHead(nn.Module):
    def __init__(self, config: DSparkConfig, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.config = config
        self.markov_head = MarkovHead(config, hidden_size, vocab_size)
        self.confidence_head = ConfidenceHead(config, hidden_size)

    def forward(
        self,
        slot_hidden: torch.Tensor,
        base_logits: torch.Tensor,
        anchor: torch.Tensor,
        embed=None,
        forced: torch.Tensor | None = None,
    ) -> Proposal:
        """slot_hidden [R, S, Hm], base_logits [R, S, V], anchor [R]; forced [R, S]: teacher-forced tokens (training)
        -> Proposal with each pick's confidence. `embed` is unused (kept for the correctors' common call)."""
        head_dtype = self.markov_head.markov_w2.weight.dtype
        z = slot_hidden.to(head_dtype)
        given = None if forced is None else previous_tokens(anchor, forced)
        prev, state, logits, picks, embeddings = anchor, None, [], [], []
        for s in range(base_logits.shape[1]):
            if given is not None:
                prev = given[:, s]
            e = self.markov_head.markov_w1(prev)
            bias, state = self.markov_head.step(e, z[:, s], state)
            logits.append(base_logits[:, s].float() + bias.float())
            prev = logits[-1].argmax(-1)
            picks.append(prev)
            embeddings.append(e)
        confidence = self.confidence_head(z, torch.stack(embeddings, 1))
        return Proposal(torch.stack(logits, 1), torch.stack(picks, 1), confidence)
