"""Verification of one drafted block: target_logits [S+1, V], draft [S] -> (m accepted, d_1..d_m + one target token), by
exact rejection sampling: d_s kept with probability p_s(d_s), else a draw from p_s without d_s (CPU, float64)."""

from __future__ import annotations

import torch


def check_block(target_logits: torch.Tensor, draft: torch.Tensor) -> None:
    if target_logits.dim() != 2 or draft.dim() != 1 or target_logits.shape[0] != draft.shape[0] + 1:
        raise ValueError(
            f"verify: target_logits must be [S+1, V] and draft [S], got {list(target_logits.shape)} and "
            f"{list(draft.shape)}; pass the target's logits at the anchor and at every drafted token."
        )


def greedy_verify(target_logits: torch.Tensor, draft: torch.Tensor) -> tuple[int, list[int]]:
    """Accept the longest prefix of the draft equal to the target's argmax, plus its next argmax."""
    check_block(target_logits, draft)
    choice = target_logits.argmax(dim=-1)  # [S+1]
    m = int((draft == choice[:-1]).long().cumprod(dim=0).sum())
    return m, draft[:m].tolist() + [int(choice[m])]


def sample_verify(
    target_logits: torch.Tensor, draft: torch.Tensor, temperature: float, generator: torch.Generator | None = None
) -> tuple[int, list[int]]:
    """Exact rejection sampling at temperature T > 0 against the target's softmax(logits / T)."""
    check_block(target_logits, draft)
    if not temperature > 0:
        raise ValueError(f"sample_verify: temperature must be > 0, got {temperature!r}; use greedy_verify for T = 0.")
    probs = torch.softmax(target_logits.detach().double().cpu() / temperature, dim=-1)  # [S+1, V], CPU generator
    tokens = draft.tolist()
    for s, x in enumerate(tokens):
        u = torch.rand((), generator=generator, dtype=torch.float64)
        if u < probs[s, x]:
            continue
        residual = probs[s].clone()
        residual[x] = 0.0  # p - q clipped at 0, q = one-hot(x); multinomial renormalises
        return s, tokens[:s] + [int(torch.multinomial(residual, 1, generator=generator))]
    return len(tokens), tokens + [int(torch.multinomial(probs[-1], 1, generator=generator))]


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> int:
    """The target's own token from logits [V]: argmax at T = 0, else a draw from softmax(logits / T)."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.detach().double().cpu() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
