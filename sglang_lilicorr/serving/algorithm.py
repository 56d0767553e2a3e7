"""LiLiCorrSpecAlgo: LILICORR as SGLang sees it, DFLASH's answers plus what CustomSpecAlgo lacks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sglang.srt.speculative.spec_info import CustomSpecAlgo

from .server_args import resolve_server_args

if TYPE_CHECKING:
    import torch


class LiLiCorrSpecAlgo(CustomSpecAlgo):
    def is_dflash(self) -> bool:
        return True

    def is_dflash_family(self) -> bool:
        return True

    def supports_target_verify_for_draft(self) -> bool:
        return True  # the draft block runs as a TARGET_VERIFY-shaped forward (graphs too)

    def supports_prefill_shared_read_done(self) -> bool:
        return True

    def supports_grammar_overlap(self) -> bool:
        return True  # the v2 worker's verify advances the grammar FSM, as for DFLASH

    def supports_mixed_chunk(self) -> bool:
        # the anchor is published per prefill row, untested with mixed batches
        return False

    def need_topk(self) -> bool:
        return False  # no EAGLE-style top-k relay between iterations

    def carries_draft_hidden_states(self) -> bool:
        return False  # no disaggregated prefill -> decode hidden-state transfer

    def create_future_map(
        self,
        device: "torch.device",
        req_to_token_pool,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def get_platform_worker_cls(self) -> Optional[type]:
        return None  # no out-of-tree platform replaces the LILICORR worker

    def handle_server_args(self, server_args) -> None:
        resolve_server_args(server_args)
