"""LiLiCorrConfig: the head's geometry, validated, and its ``lilicorr_*`` keys in the draft's ``dflash_config``."""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
from typing import Any, Mapping

from .errors import LiLiCorrError
from .kernels.topk_reference import MAX_TOPK as MAX_CANDIDATE_TOPK  # the fused top-K and walk kernels' lane group


class ConfigError(LiLiCorrError, ValueError):
    """A LiLiCorr configuration field is missing or out of range."""


def json_number(raw: Any, kind: type, field: str, error: type[Exception] = ConfigError) -> int | float:
    """A JSON config number: an int (or integral float) for kind=int, int or float for float; else `error`."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        number = False
    elif kind is int:
        number = isinstance(raw, int) or (math.isfinite(raw) and raw.is_integer())
    else:
        number = isinstance(raw, float) or abs(raw) <= sys.float_info.max
    if not number:
        raise error(f"{field}={raw!r:.40} is not {'an integer' if kind is int else 'a number'}.")
    return kind(raw)


@dataclasses.dataclass(frozen=True)
class LiLiCorrConfig:
    block_size: int = 16  # B: anchor slot 0 + (B-1) drafted slots
    candidate_topk: int = 8  # K: candidates kept per slot
    factor_dim: int = 1024  # d_e: width of the unit out/in vectors
    logit_scale: float = 8.0  # sigma: pair score = sigma * cos(out_s, in_{s+1})
    num_layers: int = 2  # lattice transformer layers
    hidden_size: int = 1024  # head width (0 = as wide as the drafter)
    num_heads: int = 8
    mlp_ratio: float = 2.0  # FFN width = hidden_size * mlp_ratio (2048)
    vector_eps: float = 1e-6  # eps of the out/in unit normalisation
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_slots(self) -> int:
        return self.block_size - 1

    def head_width(self, model_hidden_size: int) -> int:
        return self.hidden_size or int(model_hidden_size)

    def ffn_width(self, model_hidden_size: int) -> int:
        return int(self.head_width(model_hidden_size) * self.mlp_ratio)

    def validate(self) -> None:
        def need(ok: bool, field: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"LiLiCorrConfig.{field}={getattr(self, field)!r}: expected {what}.")

        for name in ("block_size", "candidate_topk", "factor_dim", "num_layers", "hidden_size", "num_heads"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool), name, "an integer")
        need(self.block_size >= 2, "block_size", "at least 2 (anchor + one slot); the paper uses 16")
        k = self.candidate_topk
        need(
            1 <= k <= MAX_CANDIDATE_TOPK and k & (k - 1) == 0,
            "candidate_topk",
            f"a power of two in [1, {MAX_CANDIDATE_TOPK}] (the fused kernels' lane width); the paper uses 8",
        )
        need(self.factor_dim >= 1, "factor_dim", "a positive width (paper: 1024)")
        need(self.num_layers >= 1, "num_layers", "at least 1 transformer layer (paper: 2)")
        need(self.hidden_size >= 0, "hidden_size", "a width >= 0 (0 = the drafter's width)")
        need(self.num_heads >= 1, "num_heads", "at least 1 attention head (paper: 8)")
        need(
            self.hidden_size == 0 or self.hidden_size % self.num_heads == 0,
            "hidden_size",
            f"a multiple of the number of heads ({self.num_heads})",
        )
        for name in ("logit_scale", "mlp_ratio", "vector_eps", "rms_norm_eps"):
            value = getattr(self, name)
            finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            need(finite and value > 0, name, "a finite positive number")

    # the head's fields in a draft config.json, as SGLang's built-in head config names them (`lilicorr_<name>`)
    SERIALISED = (
        "candidate_topk",
        "hidden_size",
        "num_layers",
        "num_heads",
        "mlp_ratio",
        "factor_dim",
        "vector_eps",
        "logit_scale",
    )
    _FLOATS = ("mlp_ratio", "vector_eps", "logit_scale")

    def to_dflash_keys(self) -> dict[str, Any]:
        """The ``lilicorr_*`` entries of ``dflash_config`` (block size lives in ``block_size``)."""
        return {f"lilicorr_{name}": getattr(self, name) for name in self.SERIALISED}

    @classmethod
    def from_dflash_config(
        cls, dflash_config: Mapping[str, Any], *, block_size: int, rms_norm_eps: float
    ) -> "LiLiCorrConfig":
        if not isinstance(dflash_config, Mapping):
            raise ConfigError(f"dflash_config={dflash_config!r:.80} is not an object of lilicorr_* keys.")
        known = {f"lilicorr_{n}" for n in cls.SERIALISED} | {"lilicorr_enabled"}  # SGLang's switch for the head
        unknown = sorted(k for k in dflash_config if str(k).startswith("lilicorr_") and k not in known)
        if unknown:  # a typo would leave a field at what the checkpoint never said
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            raise ConfigError(
                f"unknown key dflash_config.{unknown[0]}"
                + (f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(sorted(known))})")
            )
        missing = [f"lilicorr_{n}" for n in cls.SERIALISED if f"lilicorr_{n}" not in dflash_config]
        if missing:
            raise ConfigError(
                f"dflash_config lacks {missing}: a LiLiCorr draft must carry every lilicorr_* "
                "geometry key (export it with `lilicorr export`, or serve the draft with "
                "--speculative-algorithm DFLASH if it has no LiLiCorr head)."
            )
        fields = {}
        for name in cls.SERIALISED:
            kind = float if name in cls._FLOATS else int
            fields[name] = json_number(dflash_config[f"lilicorr_{name}"], kind, f"dflash_config.lilicorr_{name}")
        return cls(
            block_size=json_number(block_size, int, "block_size"),
            rms_norm_eps=json_number(rms_norm_eps, float, "rms_norm_eps"),
            **fields,
        )
