"""The trainable DFlash drafter, SGLang 0.5.23's `DFlashDraftModel` (the target's embedding and LM head, none of its
own): context = hidden_norm(fc(target states)); hidden = norm(layers(embed([anchor, mask, ...]) | context))."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import LiLiCorrError
from .config import DrafterConfig
from .layers import DraftLayer, RMSNorm


class DrafterShapeError(LiLiCorrError, ValueError):
    """An input handed to the drafter does not match its geometry."""


class DFlashDrafter(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.fc = nn.Linear(config.num_context_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def project_target_hidden(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., n_features * H] concatenated target features -> [..., H] context states."""
        expected = self.fc.in_features
        if target_hidden.shape[-1] != expected:
            raise DrafterShapeError(
                f"target features have width {target_hidden.shape[-1]}, the drafter expects {expected} = "
                f"{self.config.num_context_features} layers x hidden {self.config.hidden_size}; the target's hidden "
                "size or the number of captured layers does not match the drafter config."
            )
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def forward(
        self,
        block_embeds: torch.Tensor,  # [b, Q, H] target embeddings of the block tokens
        positions: torch.Tensor,  # [b, Q] absolute positions (anchor + slot)
        context: torch.Tensor,  # [b, T, H] from project_target_hidden
        context_positions: torch.Tensor,  # [b, T]
        attend: torch.Tensor,  # [b, Q, T + Q] bool
    ) -> torch.Tensor:
        """-> hidden states [b, Q, H] after the final norm."""
        (b, q_len, h), t_len = block_embeds.shape, context.shape[1]
        if h != self.config.hidden_size or context.shape[-1] != h:
            raise DrafterShapeError(
                f"block embeddings width {h} / context width {context.shape[-1]} differ from the drafter's hidden "
                f"size {self.config.hidden_size}: the target's embedding width must equal the drafter's."
            )
        if tuple(attend.shape) != (b, q_len, t_len + q_len) or attend.dtype != torch.bool:
            raise DrafterShapeError(
                f"attend must be bool [{b}, {q_len}, {t_len + q_len}], got {attend.dtype} {list(attend.shape)}."
            )
        x = block_embeds.to(self.fc.weight.dtype)
        for layer in self.layers:
            x = layer(x, positions, context, context_positions, attend)
        return self.norm(x)


def drafter_tensors(drafter: DFlashDrafter) -> dict[str, torch.Tensor]:
    """Checkpoint tensors of the drafter (SGLang names)."""
    return dict(drafter.state_dict())
