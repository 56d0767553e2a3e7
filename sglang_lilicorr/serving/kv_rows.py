"""Room in each request's req_to_token row for the verify-block reservation: SGLang's DFlash decode writes KV slot ids
two verify blocks ahead, but SGLang 0.5.23 gives a row 4 columns past the context length (a request near the end
overwrote the next row: benchmarks/results/long-inputs). `widen_rows()` makes room; `check_rows` verifies it."""

from __future__ import annotations

import functools

from .draft_check import ServingConfigError


def needed_headroom(block_size: int, page_size: int) -> int:
    """Columns a row needs past the context length: two verify blocks rounded up to a page, plus 4."""
    return 4 + 2 * block_size + page_size - 1


def widen_rows() -> None:
    """Wrap SGLang's req_to_token headroom function to return at least `needed_headroom`. Idempotent."""
    from sglang.srt.mem_cache import kv_cache_configurator
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_page_size
    from sglang.srt.runtime_context import get_spec

    current = kv_cache_configurator.get_req_to_token_extra_context_len
    if getattr(current, "lilicorr_widened", False):
        return

    @functools.wraps(current)
    def headroom() -> int:
        block_size = int(get_spec().speculative_num_draft_tokens)
        return max(current(), needed_headroom(block_size, get_alloc_page_size()))

    headroom.lilicorr_widened = True
    kv_cache_configurator.get_req_to_token_extra_context_len = headroom


def check_rows(width: int, context_len: int, block_size: int, page_size: int) -> None:
    """Raise ServingConfigError unless a row of `width` columns holds the reservation at the context end."""
    need = context_len + needed_headroom(block_size, page_size)
    if width < need:
        raise ServingConfigError(
            f"LILICORR: the req_to_token rows hold {width} token slots, but a request at the {context_len}-token "
            f"context end reserves up to {need} (two {block_size}-token verify blocks, "
            f"page size {page_size}); the plugin's row "
            "widening (sglang_lilicorr.serving.kv_rows) did not reach SGLang's pool builder. Serve with the SGLang "
            "version this plugin supports (0.5.23), or with --context-length at most "
            f"{width - needed_headroom(block_size, page_size)}."
        )
