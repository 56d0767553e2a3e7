"""Model classes SGLang's ModelRegistry loads for LILICORR (each module lists its classes in `EntryClass`)."""

from __future__ import annotations

PACKAGE = __name__


def register_draft_model() -> None:
    """Make `architectures: ["LiLiCorrDraftModel"]` build our draft model in this process (idempotent)."""
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.register(PACKAGE, overwrite=True, strict=True)
