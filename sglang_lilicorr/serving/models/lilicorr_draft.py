"""LiLiCorrDraftModel: SGLang's DFlashDraftModel plus the LiLiCorr head (`lilicorr.` tensors) as `lilicorr_head`.
Loading is strict: every parameter from the checkpoint with its exact shape (SGLang's loader skips unknown names)."""

from __future__ import annotations

from typing import Iterable, Iterator, Tuple

import torch
from sglang.srt.models.dflash import DFlashDraftModel

from ...checkpoint import HEAD_PREFIX, CheckpointError, check_tensors, lilicorr_config
from ...head import LiLiCorrHead
from ..server_args import ServingConfigError

HEAD_MODULE = "lilicorr_head"  # not `lilicorr`: SGLang runs its built-in head on a draft with that attribute
# SGLang's loader packs these checkpoint tensors into one parameter each.
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# Checkpoint spellings SGLang's DFlash loader accepts for a parameter.
ALIASES = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # HF rotary caches: recomputed, never loaded


class LiLiCorrDraftModel(DFlashDraftModel):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        if quant_config is not None:
            raise ServingConfigError(
                "LILICORR serves unquantized drafts, but the draft loads with a quantization config; pass "
                "--speculative-draft-model-quantization unquant (the draft inherits a quantized target's "
                "--quantization otherwise) and drop any quantization_config in the draft's config.json."
            )
        super().__init__(config, quant_config=None, prefix=prefix)
        try:
            head_config = lilicorr_config(config.to_dict())
        except CheckpointError as e:
            raise ServingConfigError(f"LiLiCorr draft config: {e}") from e
        self.lilicorr_head = LiLiCorrHead(head_config, model_hidden_size=int(config.hidden_size))
        self._context_hidden: torch.Tensor | None = None  # [N, Hm] the last projected target states

    def project_target_hidden(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """The drafter's context projection (fc + hidden_norm), kept until `take_context_hidden` (the anchors)."""
        self._context_hidden = super().project_target_hidden(target_hidden)
        return self._context_hidden

    def take_context_hidden(self) -> torch.Tensor | None:
        """[N, Hm] projected by the last `project_target_hidden` call (None if none since the last take)."""
        context, self._context_hidden = self._context_hidden, None
        return context

    @property
    def head_block_size(self) -> int:
        return self.lilicorr_head.config.block_size

    def set_block_size(self, block_size: int) -> None:
        if int(block_size) != self.head_block_size:
            raise ServingConfigError(
                f"LILICORR resolved a verify block of {block_size} tokens, but the LiLiCorr head is trained for "
                f"{self.head_block_size}; set --speculative-num-draft-tokens {self.head_block_size}."
            )
        super().set_block_size(block_size)

    def expected_drafter_tensors(self) -> set[str]:
        """Checkpoint names that must fill the drafter's parameters (packed ones unpacked)."""
        names = set()
        for name, _ in self.named_parameters():
            if name.startswith(HEAD_MODULE + "."):
                continue
            fused = next((f for f in STACKED if f".{f}." in name), None)
            names.update([name.replace(fused, part) for part in STACKED[fused]] if fused else [name])
        return names

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        head_tensors: dict[str, torch.Tensor] = {}
        drafter_names: set[str] = set()

        def drafter_stream() -> Iterator[Tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                bare = name.removeprefix("model.")
                if bare.startswith(HEAD_PREFIX):
                    head_tensors[bare[len(HEAD_PREFIX) :]] = tensor
                elif not bare.endswith(IGNORED_SUFFIXES):
                    drafter_names.add(ALIASES.get(bare, bare))
                    yield name, tensor

        super().load_weights(drafter_stream())
        check_names(self.expected_drafter_tensors(), drafter_names, "drafter")
        self.load_head(head_tensors)

    def load_head(self, head_tensors: dict[str, torch.Tensor]) -> None:
        state = self.lilicorr_head.state_dict()
        found = {
            name: t.to(state[name].dtype) if name in state and t.is_floating_point() else t
            for name, t in head_tensors.items()
        }
        try:
            check_tensors(state, found, f"LiLiCorr draft checkpoint (`{HEAD_PREFIX}` head tensors)")
        except CheckpointError as e:
            raise ServingConfigError(str(e)) from e
        self.lilicorr_head.load_state_dict(found, strict=True)


def check_names(expected: set[str], found: set[str], what: str) -> None:
    missing, extra = sorted(expected - found), sorted(found - expected)
    if missing:
        raise ServingConfigError(
            f"LiLiCorr draft checkpoint lacks {len(missing)} {what} tensor(s), e.g. {missing[:3]}: the drafter would "
            "serve random weights. "
            "Re-export the draft (its config.json and model.safetensors must come from one export)."
        )
    if extra:
        raise ServingConfigError(
            f"LiLiCorr draft checkpoint holds {len(extra)} {what} tensor(s) this drafter has no parameter for, "
            f"e.g. {extra[:3]}: config.json (num_hidden_layers, hidden sizes, dflash_config) does not describe "
            "these weights. Re-export the draft."
        )


EntryClass = [LiLiCorrDraftModel]
