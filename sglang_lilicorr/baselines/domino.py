"""Domino (paper Sec. 2, App. B), served by SGLang 0.5.23 as DFLASH with `projector_type` "domino". Per block:
  y_1 = argmax l_1;  h_1 = GRU(E[x_0]);  h_s = GRU(E[y_{s-1}], h_{s-1})   (E: the target's frozen embedding)
  y_s = argmax (l_s + W2 SiLU(W0 [z_s ; h_s])),  s >= 2
A GRU without biases (gate order r, z, n); slot hidden states from slots 1..S (`shift_label` false). SGLang scores a
candidate pool (`--speculative-domino-candidate-pool-size`); this reference scores the full vocabulary."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from ..config import ConfigError, json_number
from .corrector import Proposal, previous_tokens


@dataclasses.dataclass(frozen=True)
class DominoConfig:
    kind: ClassVar[str] = "domino"
    gru_hidden_dim: int  # G: the recurrent state's width
    emb_dim: int  # E: the correction MLP's width

    def __post_init__(self) -> None:
        for name in ("gru_hidden_dim", "emb_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Domino {name}={value!r} is not an integer >= 1.")

    def to_keys(self) -> dict[str, Any]:
        return {"kind": self.kind, "gru_hidden_dim": self.gru_hidden_dim, "emb_dim": self.emb_dim}

    @classmethod
    def from_keys(cls, keys: Mapping[str, Any]) -> "DominoConfig":
        return cls(**{f: json_number(keys.get(f), int, f) for f in ("gru_hidden_dim", "emb_dim")})

    def serving_config(self, draft: Mapping[str, Any]) -> dict[str, Any]:
        """A DFlash draft config (DrafterConfig.to_hf_config form) -> the one SGLang serves this head from."""
        out = {**draft, "dflash_config": dict(draft["dflash_config"])}
        out["dflash_config"].update(
            projector_type="domino",
            shift_label=False,
            pure_draft_prefix_len=1,
            gru_hidden_dim=self.gru_hidden_dim,
            emb_dim=self.emb_dim,
        )
        return out

    @classmethod
    def of_serving_config(cls, config: Mapping[str, Any]) -> "DominoConfig | None":
        keys = config.get("dflash_config") or {}
        return cls.from_keys(keys) if keys.get("projector_type") == "domino" else None


class DominoHead(nn.Module):
    def __init__(self, config: DominoConfig, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.config = config
        g, e = config.gru_hidden_dim, config.emb_dim
        self.prefix_gru = nn.GRU(hidden_size, g, num_layers=1, bias=False, batch_first=True)
        self.embed_proj = nn.Sequential(
            nn.Linear(hidden_size + g, e, bias=False), nn.SiLU(), nn.Linear(e, vocab_size, bias=False)
        )

    def step_state(self, token_embedding: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """E[token] [R, Hm], h [R, G] or None (zeros) -> the next h [R, G]."""
        _, h = self.prefix_gru(token_embedding[:, None], None if state is None else state[None])
        return h[0]

    def correction(self, slot_hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """z [R, Hm], h [R, G] -> the logit correction [R, V]."""
        return self.embed_proj(torch.cat([slot_hidden, state.to(slot_hidden.dtype)], dim=-1))

    def forward(
        self,
        slot_hidden: torch.Tensor,
        base_logits: torch.Tensor,
        anchor: torch.Tensor,
        embed,
        forced: torch.Tensor | None = None,
    ) -> Proposal:
        """slot_hidden [R, S, Hm], base_logits [R, S, V], anchor [R] ids, embed: ids -> frozen embeddings;
        forced [R, S]: teacher-force the block on these tokens (training) -> Proposal. Slot 1 is the base argmax."""
        head_dtype = self.embed_proj[0].weight.dtype
        logits = [base_logits[:, 0].float()]
        picks = [logits[0].argmax(-1)]
        given = None if forced is None else previous_tokens(anchor, forced)  # [R, S]
        state = self.step_state(embed(anchor).to(head_dtype), None)
        for s in range(1, base_logits.shape[1]):
            prev = picks[-1] if given is None else given[:, s]
            state = self.step_state(embed(prev).to(head_dtype), state)
            logits.append(base_logits[:, s].float() + self.correction(slot_hidden[:, s].to(head_dtype), state).float())
            picks.append(logits[-1].argmax(-1))
        return Proposal(torch.stack(logits, 1), torch.stack(picks, 1))
