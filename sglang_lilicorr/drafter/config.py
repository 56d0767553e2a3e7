"""DrafterConfig: the DFlash drafter's geometry, round-tripped through SGLang 0.5.23's DFlashDraftModel config.json.
Target layer id i names layer i's OUTPUT (HF `hidden_states[i + 1]`); rope: transformers v5's `rope_parameters`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ..checkpoint import VANILLA_ARCH, CheckpointError, architecture_of
from ..config import json_number


class DrafterConfigError(CheckpointError):
    """A drafter configuration field missing, inconsistent or out of range (a CheckpointError)."""


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """Evenly spread capture layers, SGLang's DFlash convention (see module docstring)."""
    if num_target_layers < 1 or num_features < 1:
        raise DrafterConfigError(
            "target layer ids need num_target_layers >= 1 and num_features >= 1, "
            f"got {num_target_layers}, {num_features}."
        )
    if num_features == 1:
        return [num_target_layers // 2]
    first, last = 1, num_target_layers - 3
    if last < first:
        raise DrafterConfigError(
            f"{num_features} context features need a target of at least 4 layers, got {num_target_layers}; "
            "pass --num-context-features 1 or explicit target_layer_ids."
        )
    return [int(round(first + i * (last - first) / (num_features - 1))) for i in range(num_features)]


# dflash_config keys of other DFlash variants SGLang serves (DFlash2's grouped convolution and candidate selector,
# attention sinks, scaled values and logits), with the value that turns each off
OTHER_VARIANTS = {
    "conv_kernel_size": 0,
    "conv_group_size": 0,
    "selector_rank": 0,
    "selector_top_k": 0,
    "attention_sink_bias": False,
    "attention_value_scale": None,
    "output_multiplier": 1.0,
    "final_logit_softcapping": None,
}


def unsupported_variant(config: Mapping[str, Any], dflash: Mapping[str, Any]) -> str | None:
    """What a DFlash draft config declares that this drafter does not compute (e.g. sliding windows), or None."""
    layer_types = config.get("layer_types") or []
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        return f"layer_types={layer_types!r:.80}"
    if config.get("is_causal"):
        return "is_causal=true"
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        return f"partial_rotary_factor={config['partial_rotary_factor']!r:.20}"
    found = [k for k, off in OTHER_VARIANTS.items() if dflash.get(k, off) not in (off, None, 0)]
    return f"dflash_config.{found[0]}={dflash[found[0]]!r:.40}" if found else None


ROPE_TYPES = ("default", "yarn")
_ROPE_KEYS = {
    "default": {"rope_theta", "rope_type"},
    "yarn": {"rope_theta", "rope_type", "factor", "original_max_position_embeddings"},
}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """The drafter's rotary embedding: "default" (plain RoPE) or "yarn" (drafter/rope.py)."""

    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None  # yarn only

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise DrafterConfigError(
                f"rope_type={self.rope_type!r} is not supported: the drafter's rope is one of {ROPE_TYPES}."
            )
        factor, original = self.factor, self.original_max_position_embeddings
        if self.rope_type == "default":
            if factor != 1.0 or original is not None:
                raise DrafterConfigError(
                    f"default rope takes no factor or original length (got factor={factor!r}, "
                    f"original_max_position_embeddings={original!r}); use rope_type 'yarn' to scale it."
                )
            return
        if (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not (math.isfinite(factor) and factor > 1)
        ):
            raise DrafterConfigError(
                f"yarn rope factor={factor!r} must be a finite number > 1 (1 is the default rope)."
            )
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise DrafterConfigError(
                f"yarn rope original_max_position_embeddings={original!r} must be a positive integer."
            )
        object.__setattr__(self, "factor", float(factor))

    @property
    def is_yarn(self) -> bool:
        return self.rope_type == "yarn"

    def to_rope_parameters(self, theta: float) -> dict[str, Any]:
        """The `rope_parameters` object of config.json."""
        params = {"rope_theta": theta, "rope_type": self.rope_type}
        if self.is_yarn:
            params.update(factor=self.factor, original_max_position_embeddings=self.original_max_position_embeddings)
        return params

    @classmethod
    def from_rope_parameters(cls, params: Any) -> "RopeScaling":
        """From config.json's `rope_parameters` (or v4 `rope_scaling`) object; None = default rope."""
        if params is None:
            return cls()
        if not isinstance(params, Mapping):
            raise DrafterConfigError(f"draft config rope_parameters={params!r:.60} is not a JSON object.")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise DrafterConfigError(
                f"draft config rope_type={rope_type!r:.40} is not supported: the drafter serves {ROPE_TYPES} rope "
                "(`lilicorr train --rope-scaling yarn` writes YaRN); re-export the draft."
            )
        extra = sorted(set(params) - _ROPE_KEYS[rope_type] - {"type"})
        if extra:
            raise DrafterConfigError(
                f"draft config rope_parameters has {extra[:3]}, which this drafter does not apply ({rope_type} rope "
                f"takes {sorted(_ROPE_KEYS[rope_type])}); re-export the draft with `lilicorr export`."
            )
        if rope_type == "default":
            return cls()
        for key in ("factor", "original_max_position_embeddings"):
            if key not in params:
                raise DrafterConfigError(f"draft config yarn rope_parameters lacks {key!r}; re-export the draft.")
        factor = json_number(params["factor"], float, "rope_parameters.factor", DrafterConfigError)
        original, field = params["original_max_position_embeddings"], "rope_parameters.original_max_position_embeddings"
        return cls("yarn", factor, json_number(original, int, field, DrafterConfigError))

    def describe(self) -> str:
        if not self.is_yarn:
            return "default"
        return f"yarn x{self.factor:g} from {self.original_max_position_embeddings} positions"


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int  # must equal the target's (shared embedding and LM head)
    vocab_size: int  # the target's
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    mask_token: str = "<|MASK|>"
    num_hidden_layers: int = 1
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 64
    intermediate_size: int = 1024
    block_size: int = 16
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768  # positions it may be served at: the target's
    rope_scaling: RopeScaling = RopeScaling()

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        self.validate()

    @property
    def num_context_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def num_slots(self) -> int:
        return self.block_size - 1

    def validate(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise DrafterConfigError(f"DrafterConfig: {what}.")

        for name in (f.name for f in dataclasses.fields(self) if f.type == "int"):
            value = getattr(self, name)
            if name not in ("mask_token_id", "block_size"):  # checked below
                need(
                    isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                    f"{name}={value!r} must be a positive integer",
                )
        need(self.block_size >= 2, f"block_size={self.block_size} must be >= 2 (anchor + at least one slot)")
        need(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads={self.num_attention_heads} must be a multiple of "
            f"num_key_value_heads={self.num_key_value_heads}",
        )
        need(self.head_dim % 2 == 0, f"head_dim={self.head_dim} must be even (rotary embedding)")
        need(len(self.target_layer_ids) >= 1, "target_layer_ids must name at least one target layer")
        # SGLang captures the input of layer i + 1: the last layer's output is never captured.
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers - 1]
        need(
            not bad,
            f"target_layer_ids {bad} out of range: each must lie in [0, num_target_layers - 2 = "
            f"{self.num_target_layers - 2}] (the last layer's output is not capturable in SGLang)",
        )
        need(
            0 <= self.mask_token_id < self.vocab_size,
            f"mask_token_id={self.mask_token_id} must be a token id of the target vocabulary [0, {self.vocab_size})",
        )
        need(isinstance(self.mask_token, str) and bool(self.mask_token), "mask_token must be a non-empty string")
        need(self.rope_theta > 0 and self.rms_norm_eps > 0, "rope_theta and rms_norm_eps must be positive")
        need(
            isinstance(self.rope_scaling, RopeScaling), f"rope_scaling={self.rope_scaling!r:.60} must be a RopeScaling"
        )

    def to_hf_config(self) -> dict[str, Any]:
        return {
            "architectures": [VANILLA_ARCH],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": self.rope_scaling.to_rope_parameters(self.rope_theta),
            "attention_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "block_size": self.block_size,
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token": self.mask_token,
                "mask_token_id": self.mask_token_id,
            },
        }

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "DrafterConfig":
        if not isinstance(config, Mapping):
            raise DrafterConfigError(f"draft config {config!r:.80} is not a JSON object.")
        architecture_of(config)
        dflash = config.get("dflash_config")
        if not isinstance(dflash, Mapping):
            raise DrafterConfigError("draft config has no `dflash_config` object: not a DFlash draft config.")
        for key in ("target_layer_ids", "mask_token_id"):
            if key not in dflash:
                raise DrafterConfigError(
                    f"draft config lacks dflash_config.{key}; re-export it with `lilicorr export`."
                )
        required = "hidden_size vocab_size num_target_layers num_hidden_layers num_attention_heads intermediate_size"
        missing = [k for k in required.split() if k not in config]
        if missing:
            raise DrafterConfigError(f"draft config lacks {missing}.")
        if config.get("attention_bias"):
            raise DrafterConfigError("draft config has attention_bias=true: this drafter has bias-free projections.")
        variant = unsupported_variant(config, dflash)
        if variant:
            raise DrafterConfigError(
                f"draft config declares {variant}, which this drafter does not implement: it trains and serves "
                "DFlash drafters of bidirectional full-attention Qwen3 layers (as z-lab's Qwen3-*-DFlash-b16)."
            )
        layer_ids = dflash["target_layer_ids"]
        if not isinstance(layer_ids, list):
            raise DrafterConfigError(f"dflash_config.target_layer_ids={layer_ids!r:.80} is not a list of layer ids.")
        mask_token = dflash.get("mask_token", cls.mask_token)
        if not isinstance(mask_token, str):
            raise DrafterConfigError(f"dflash_config.mask_token={mask_token!r:.80} is not a string.")

        def number(mapping: Mapping[str, Any], key: str, kind: type, default: Any = None, field: str | None = None):
            return json_number(mapping.get(key, default), kind, field or key, DrafterConfigError)

        heads = number(config, "num_attention_heads", int)
        hidden = number(config, "hidden_size", int)
        rope = config.get("rope_parameters", config.get("rope_scaling"))  # v5 spelling, else v4
        if isinstance(rope, Mapping) and "rope_theta" in rope:  # where SGLang's get_rope_config reads it first
            theta = number(rope, "rope_theta", float, field="rope_parameters.rope_theta")
        else:
            theta = number(config, "rope_theta", float, 1_000_000.0)
        return cls(
            hidden_size=hidden,
            vocab_size=number(config, "vocab_size", int),
            num_target_layers=number(config, "num_target_layers", int),
            target_layer_ids=tuple(
                json_number(i, int, "dflash_config.target_layer_ids[]", DrafterConfigError) for i in layer_ids
            ),
            mask_token_id=number(dflash, "mask_token_id", int, field="dflash_config.mask_token_id"),
            mask_token=mask_token,
            num_hidden_layers=number(config, "num_hidden_layers", int),
            num_attention_heads=heads,
            num_key_value_heads=number(config, "num_key_value_heads", int, heads),
            head_dim=number(config, "head_dim", int, hidden // heads if heads > 0 else 0),
            intermediate_size=number(config, "intermediate_size", int),
            block_size=number(dflash, "block_size", int, config.get("block_size", 16), "dflash_config.block_size"),
            rope_theta=theta,
            rms_norm_eps=number(config, "rms_norm_eps", float, 1e-6),
            max_position_embeddings=number(config, "max_position_embeddings", int, 32768),
            rope_scaling=RopeScaling.from_rope_parameters(rope),
        )
