"""The drafter's rotary embedding as SGLang 0.5.23 applies it (neox form, absolute positions, fp32): `default` or `yarn`
(SGLang's beta_fast 32, beta_slow 1; cos and sin scaled by 0.1 ln(factor) + 1)."""

from __future__ import annotations

import math

import torch

from .config import RopeScaling

YARN_BETA_FAST = 32  # rotations over L0 above which a frequency is kept (extrapolated)
YARN_BETA_SLOW = 1  # rotations over L0 below which a frequency is divided by the factor (interpolated)


def _yarn_dim(rotations: int, head_dim: int, theta: float, original: int) -> float:
    """The (fractional) dimension whose frequency turns `rotations` times over `original` positions."""
    return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def yarn_attention_scale(factor: float) -> float:
    """YaRN's scale of cos and sin (its attention temperature, folded into the rotation)."""
    return 0.1 * math.log(factor) + 1.0


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling, device=None) -> torch.Tensor:
    """[D/2] fp32 rotation frequencies."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    if not scaling.is_yarn:
        return 1.0 / (theta**exponents)
    per_radian = theta**exponents  # positions per radian, per dimension pair
    original = scaling.original_max_position_embeddings
    low = max(math.floor(_yarn_dim(YARN_BETA_FAST, head_dim, theta, original)), 0)
    high = min(math.ceil(_yarn_dim(YARN_BETA_SLOW, head_dim, theta, original)), head_dim - 1)
    if low == high:
        high += 0.001  # a one-dimension ramp
    ramp = ((torch.arange(head_dim // 2, device=device, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency, 0: the interpolated one
    return (1.0 / (scaling.factor * per_radian)) * (1 - keep) + (1.0 / per_radian) * keep


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, theta: float, scaling: RopeScaling = RopeScaling()
) -> torch.Tensor:
    """x [b, L, heads, D], positions [b, L] int -> same shape and dtype."""
    # [b, L, D/2]
    angle = positions.to(torch.float32)[..., None] * inverse_frequencies(x.shape[-1], theta, scaling, x.device)
    cos, sin = angle.cos(), angle.sin()
    if scaling.is_yarn:
        scale = yarn_attention_scale(scaling.factor)
        cos, sin = cos * scale, sin * scale
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [b, L, 1, D/2]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
