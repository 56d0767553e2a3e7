"""DFlash block training layout: N anchors a per sequence; block n is the anchor token then B - 1 mask tokens at
positions a..a+B-1, slot s predicting x_{a+s}, seeing the context before its anchor and itself bidirectionally. Keys:
[context 0..T-1 | all blocks' tokens]. b sequences, T tokens, B block, S = B - 1."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class BlockLayout:
    anchors: torch.Tensor  # [b, N] int64 anchor positions (0 where not valid)
    anchor_valid: torch.Tensor  # [b, N] bool
    block_ids: torch.Tensor  # [b, N, B] anchor token then mask tokens
    positions: torch.Tensor  # [b, N * B] absolute positions a + slot
    targets: torch.Tensor  # [b, N, S] x_{a+s} (0 where not valid)
    target_valid: torch.Tensor  # [b, N, S] bool
    attend: torch.Tensor  # [b, N * B, T + N * B] bool


def eligible_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """[b, T] bool supervised (response) tokens -> [b, T] bool: a >= 1, x_a and x_{a+1} supervised."""
    ok = torch.zeros_like(loss_mask)
    ok[:, 1:-1] = loss_mask[:, 1:-1] & loss_mask[:, 2:]
    return ok


def sample_anchors(
    loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to num_anchors distinct eligible positions per row, ascending -> (anchors, valid) [b, N]."""
    ok = eligible_anchors(loss_mask)
    n = min(num_anchors, ok.shape[1])
    noise = torch.rand(ok.shape, generator=generator, device="cpu").to(ok.device)
    top, idx = torch.where(ok, noise, -1.0).topk(n, dim=1)
    valid = top >= 0
    anchors = torch.where(valid, idx, ok.shape[1])  # invalid sort last
    anchors, order = anchors.sort(dim=1)
    valid = valid.gather(1, order)
    return torch.where(valid, anchors, 0), valid


def block_layout(
    input_ids: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T] bool
    anchors: torch.Tensor,  # [b, N]
    anchor_valid: torch.Tensor,  # [b, N] bool
    block_size: int,
    mask_token_id: int,
) -> BlockLayout:
    b, t = input_ids.shape
    n = anchors.shape[1]
    pos = anchors[:, :, None] + torch.arange(block_size, device=input_ids.device)  # [b, N, B]
    in_seq = pos < t
    tokens = input_ids.gather(1, pos.clamp(max=t - 1).view(b, -1)).view(b, n, block_size)
    supervised = loss_mask.gather(1, pos.clamp(max=t - 1).view(b, -1)).view(b, n, block_size) & in_seq
    block_ids = torch.full_like(tokens, mask_token_id)
    block_ids[:, :, 0] = tokens[:, :, 0]
    target_valid = supervised[:, :, 1:] & anchor_valid[:, :, None]
    targets = torch.where(target_valid, tokens[:, :, 1:], 0)
    positions, attend = pos.view(b, n * block_size), block_attention(anchors, anchor_valid, t, block_size)
    return BlockLayout(anchors, anchor_valid, block_ids, positions, targets, target_valid, attend)


def block_attention(
    anchors: torch.Tensor, anchor_valid: torch.Tensor, context_len: int, block_size: int
) -> torch.Tensor:
    """anchors, anchor_valid [b, N] -> [b, N*B, T + N*B] bool: which keys each block query sees."""
    b, n = anchors.shape
    q, dev = n * block_size, anchors.device
    block_of_query = torch.arange(q, device=dev) // block_size  # [Q]
    sees_context = torch.arange(context_len, device=dev)[None, None, :] < anchors[:, :, None]  # [b, N, T]
    sees_context = (sees_context & anchor_valid[:, :, None]).repeat_interleave(block_size, dim=1)  # [b, Q, T]
    same_block = (block_of_query[:, None] == block_of_query[None, :]).expand(b, q, q)
    return torch.cat([sees_context, same_block], dim=2)
