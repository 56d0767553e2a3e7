"""The lattice transformer over a block's (B-1) x K candidate nodes, with slot-distance and same-slot biases."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def lattice_attention_bias(
    relative_slot_bias: torch.Tensor,  # [heads, 2B-1], index = slot_i - slot_j + (B-1)
    same_slot_bias: torch.Tensor,  # [heads]
    num_slots: int,
    topk: int,
) -> torch.Tensor:
    """Additive attention bias over the S*K lattice nodes (slot-major) -> [heads, S*K, S*K]."""
    span = (relative_slot_bias.shape[1] + 1) // 2  # B
    slot = torch.arange(num_slots, device=relative_slot_bias.device).repeat_interleave(topk)
    rel = slot[:, None] - slot[None, :]
    bias = relative_slot_bias[:, rel + span - 1]
    return bias + (rel == 0).to(bias.dtype) * same_slot_bias[:, None, None]


class LatticeAttention(nn.Module):
    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * width))
        self.out_proj = nn.Linear(width, width)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # x [n, L, H]; bias [heads, L, L]
        n, length, width = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).view(n, length, 3, self.num_heads, -1).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias.to(x.dtype)
        )
        return self.out_proj(out.transpose(1, 2).reshape(n, length, width))


class SiluMLP(nn.Module):
    """up -> SiLU -> down (used for the node feature MLP and the transformer FFN)."""

    def __init__(self, d_in: int, d_mid: int, d_out: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_in, d_mid)
        self.down_proj = nn.Linear(d_mid, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.up_proj(x)))


class LatticeLayer(nn.Module):
    def __init__(self, width: int, num_heads: int, ffn_width: int, eps: float) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(width, eps=eps)
        self.attn = LatticeAttention(width, num_heads)
        self.mlp_norm = nn.RMSNorm(width, eps=eps)
        self.mlp = SiluMLP(width, ffn_width, width)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), bias)
        return x + self.mlp(self.mlp_norm(x))
