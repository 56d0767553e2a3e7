"""Model classes SGLang's ModelRegistry loads for LILICORR (every module here lists its classes in
`EntryClass`, the registry's convention)."""

from __future__ import annotations

PACKAGE = __name__


def register_draft_model() -> None:
    """Make `architectures: ["LiLiCorrDraftModel"]` build OUR draft model in this process.

    Called from the worker factory, i.e. only in scheduler processes of a LILICORR server; there it
    replaces SGLang's built-in class of that name (which DFLASH serves). `ModelRegistry.register`
    is SGLang's extension point for out-of-tree models; repeated calls are harmless.
    """
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.register(PACKAGE, overwrite=True, strict=True)
