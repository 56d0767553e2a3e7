"""Decoders over the score lattice (paper Eq. 8), PyTorch references; `WALKS` names them (LILICORR_WALK)."""

from __future__ import annotations

import torch


def greedy_walk(start: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
    """Commit each slot to the argmax continuation of the candidate just committed."""
    b, k = start.shape
    picks = [start.argmax(dim=-1)]  # [b]
    rows = torch.arange(b, device=start.device)
    for s in range(pair.shape[1]):
        picks.append(pair[rows, s, picks[-1]].argmax(dim=-1))
    return torch.stack(picks, dim=1)


def viterbi(start: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
    """Exact maximiser of the path score g(c) = z_1[c_1] + sum_s pair[s, c_s, c_{s+1}]."""
    best = start.float()  # [b, K]: best path score ending at each candidate of the slot
    back = []
    for s in range(pair.shape[1]):
        cand = best.unsqueeze(-1) + pair[:, s].float()  # [b, K_prev, K_next]
        best, arg = cand.max(dim=1)
        back.append(arg)
    picks = [best.argmax(dim=-1)]
    for arg in reversed(back):
        picks.append(arg.gather(1, picks[-1].unsqueeze(1)).squeeze(1))
    return torch.stack(picks[::-1], dim=1)


def path_score(start: torch.Tensor, pair: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """g(c) for candidate paths idx [b, S] -> [b] (float32)."""
    score = start.float().gather(1, idx[:, :1]).squeeze(1)
    if pair.shape[1]:
        b = idx.shape[0]
        rows = torch.arange(b, device=idx.device)[:, None]
        slots = torch.arange(pair.shape[1], device=idx.device)[None, :]
        score = score + pair.float()[rows, slots, idx[:, :-1], idx[:, 1:]].sum(dim=1)
    return score


WALKS = {"greedy": greedy_walk, "viterbi": viterbi}  # the decode rules by name; greedy is the paper's (and the default)
