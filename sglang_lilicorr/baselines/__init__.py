"""The paper's two correctors, Domino and DSpark, as trainable heads in the tensors SGLang 0.5.23 serves."""

from typing import Any, Mapping

from .corrector import Proposal
from .domino import DominoConfig, DominoHead
from .dspark import MARKOV_HEAD_TYPES, DSparkConfig, DSparkHead

__all__ = [
    "Proposal",
    "corrector_config_from_keys",
    "DominoConfig",
    "DominoHead",
    "MARKOV_HEAD_TYPES",
    "DSparkConfig",
    "DSparkHead",
]


def corrector_config_from_keys(keys: Mapping[str, Any]) -> "DominoConfig | DSparkConfig | None":
    """A corrector's config from a training checkpoint's saved keys; None when they are LiLiCorr's."""
    for kind in (DominoConfig, DSparkConfig):
        if keys.get("kind") == kind.kind:
            return kind.from_keys(keys)
    return None
