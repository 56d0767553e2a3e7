"""Room in each request's req_to_token row for the verify-block reservation.

SGLang's DFlash decode, which LILICORR runs, reserves KV slots two verify blocks ahead of each request's committed
length (`DFlashDraftInputV2.prepare_for_decode`: reserve = 2 x block size, rounded up to a page) and writes their
slot ids into the request's row of the req_to_token table with no bound at the row's end. SGLang 0.5.23 gives a row
4 + block size columns beyond the context length at page size 1 (`allocation_sizing.
get_req_to_token_extra_context_len`), so a request within block - 4 tokens (12) of the context end writes past its
row into the first columns of the next request's row: that request's first KV slots then point at other tokens,
and its outputs stop being the target's greedy choice (benchmarks/results/long-inputs: 7,936-token inputs at an
8,192-token context, under SGLang's DFLASH and LILICORR alike).

`widen_rows()` makes SGLang's pool builder give every row room for the whole reservation. The plugin calls it when
SGLang asks for the LILICORR worker class, in the scheduler process, before the pools are built; `check_rows` then
verifies the table that was built.
"""

from __future__ import annotations

import functools

from .draft_check import ServingConfigError


def needed_headroom(block_size: int, page_size: int) -> int:
    """Columns a row needs beyond the context length: a committed length up to the context length, plus the
    reservation of two verify blocks rounded up to a page, plus SGLang's own 4."""
    return 4 + 2 * block_size + page_size - 1


def widen_rows() -> None:
    """Wrap the headroom function that SGLang's kv_cache_configurator builds req_to_token rows with, so it returns
    at least `needed_headroom` for the verify block and page size of this server. Idempotent."""
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
