"""Qwen3-style draft decoder layer with target-context injection (DFlash): keys and values from the projected context
and the block's own states (k_norm, RoPE at absolute positions), queries from the block, the caller's boolean mask.
Tensor names are SGLang 0.5.23's. b batch, Q block tokens, T context, H hidden, h heads, g kv heads, D head dim."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DrafterConfig
from .rope import apply_rope


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32, returned in the input dtype."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.rope_theta, self.rope_scaling = config.rope_theta, config.rope_scaling
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [b, L, H] -> k, v [b, L, g, D] (k normed and rotated)."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim)
        return apply_rope(k, positions, self.rope_theta, self.rope_scaling), v

    def forward(
        self,
        x: torch.Tensor,  # [b, Q, H] block states after input_layernorm
        positions: torch.Tensor,  # [b, Q]
        context: torch.Tensor,  # [b, T, H] projected target context
        context_positions: torch.Tensor,  # [b, T]
        attend: torch.Tensor,  # [b, Q, T + Q] bool: query may see key (context keys first)
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim))
        q = apply_rope(q, positions, self.rope_theta, self.rope_scaling)
        k_ctx, v_ctx = self.keys_values(context, context_positions)
        k_blk, v_blk = self.keys_values(x, positions)
        # GQA by repeating K/V heads: keeps the masked memory-efficient SDPA kernel eligible on GPU
        group = self.num_heads // self.num_kv_heads
        k = torch.cat([k_ctx, k_blk], dim=1).repeat_interleave(group, dim=2).transpose(1, 2)  # [b, h, T+Q, D]
        v = torch.cat([v_ctx, v_blk], dim=1).repeat_interleave(group, dim=2).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=attend[:, None])  # [b, h, Q, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim))


class DraftMLP(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Pre-norm residual block: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DraftMLP(config)

    def forward(self, x, positions, context, context_positions, attend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, context, context_positions, attend)
        return x + self.mlp(self.post_attention_layernorm(x))
