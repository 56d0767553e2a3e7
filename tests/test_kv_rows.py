"""The req_to_token rows hold the DFlash verify-block reservation (sglang_lilicorr/serving/kv_rows.py), checked
against SGLang's own allocation arithmetic."""

import types

import pytest
from sglang.srt.mem_cache import allocation_sizing, kv_cache_configurator

from sglang_lilicorr.serving import kv_rows
from sglang_lilicorr.serving.draft_check import ServingConfigError

CONTEXT, BLOCK = 8192, 16


def request_at(committed: int):
    return types.SimpleNamespace(kv=types.SimpleNamespace(kv_allocated_len=committed, kv_committed_len=committed))


@pytest.mark.parametrize("page_size", [1, 2, 16, 64])
def test_the_reservation_at_the_context_end_fits_the_widened_row_and_not_sglangs(page_size):
    # SGLang's DFlash decode reserves 2 blocks ahead (DFlashDraftInputV2.prepare_for_decode), rounded up to a page
    _, nxt, _ = allocation_sizing.page_aligned_decode_alloc_lens(
        [request_at(CONTEXT)], reserve=2 * BLOCK, page_size=page_size
    )
    assert nxt[0] <= CONTEXT + kv_rows.needed_headroom(BLOCK, page_size)
    if page_size == 1:
        assert nxt[0] > CONTEXT + 4 + BLOCK  # SGLang 0.5.23's row at page size 1: the reservation spills


def test_widen_rows_raises_sglangs_headroom_once(monkeypatch):
    monkeypatch.setattr(kv_cache_configurator, "get_req_to_token_extra_context_len", lambda: 4 + BLOCK)
    monkeypatch.setattr(
        "sglang.srt.runtime_context.get_spec", lambda: types.SimpleNamespace(speculative_num_draft_tokens=BLOCK)
    )
    monkeypatch.setattr(allocation_sizing, "get_alloc_page_size", lambda: 1)
    kv_rows.widen_rows()
    kv_rows.widen_rows()  # idempotent: one wrap
    assert kv_cache_configurator.get_req_to_token_extra_context_len() == 4 + 2 * BLOCK
    assert kv_cache_configurator.get_req_to_token_extra_context_len.__wrapped__() == 4 + BLOCK
    monkeypatch.setattr(kv_cache_configurator, "get_req_to_token_extra_context_len", lambda: 100)
    kv_rows.widen_rows()
    assert kv_cache_configurator.get_req_to_token_extra_context_len() == 100  # never narrower than SGLang's


def test_check_rows_names_the_width_and_the_fix():
    kv_rows.check_rows(CONTEXT + 36, CONTEXT, BLOCK, 1)
    with pytest.raises(ServingConfigError) as refused:
        kv_rows.check_rows(CONTEXT + 20, CONTEXT, BLOCK, 1)
    assert str(refused.value) == (
        "LILICORR: the req_to_token rows hold 8212 token slots, but a request at the 8192-token context end reserves "
        "up to 8228 (two 16-token verify blocks, page size 1); the plugin's row widening "
        "(sglang_lilicorr.serving.kv_rows) did not reach SGLang's pool builder. Serve with the SGLang version this "
        "plugin supports (0.5.23), or with --context-length at most 8176."
    )


@pytest.mark.parametrize("block,page", [(16, 1), (16, 16), (8, 64), (5, 3)])
def test_headroom_values_and_the_check_boundary_at_page_sizes_above_1(block, page, monkeypatch):
    need = 4 + 2 * block + page - 1
    assert kv_rows.needed_headroom(block, page) == need
    worst = max(
        allocation_sizing.page_aligned_decode_alloc_lens([request_at(c)], reserve=2 * block, page_size=page)[1][0]
        for c in range(CONTEXT - 2 * page, CONTEXT + 1)
    )
    assert worst <= CONTEXT + need  # SGLang's reservation at any committed length up to the context end fits
    kv_rows.check_rows(CONTEXT + need, CONTEXT, block, page)  # exactly enough
    with pytest.raises(
        ServingConfigError, match=f"rows hold {CONTEXT + need - 1} token slots.*reserves up to {CONTEXT + need}"
    ):
        kv_rows.check_rows(CONTEXT + need - 1, CONTEXT, block, page)
    monkeypatch.setattr(kv_cache_configurator, "get_req_to_token_extra_context_len", lambda: 4 + block)
    monkeypatch.setattr(
        "sglang.srt.runtime_context.get_spec", lambda: types.SimpleNamespace(speculative_num_draft_tokens=block)
    )
    monkeypatch.setattr(allocation_sizing, "get_alloc_page_size", lambda: page)
    kv_rows.widen_rows()
    assert kv_cache_configurator.get_req_to_token_extra_context_len() == need
