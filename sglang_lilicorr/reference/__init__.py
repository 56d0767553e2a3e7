"""PyTorch reference speculative decoding, batch 1: propose.py (the drafter's argmax and LiLiCorr blocks), verify.py
(greedy and exact rejection sampling), decoder.py (the draft-verify loop), check.py (the greedy losslessness check)."""

from .check import GreedyReport, Mismatch, bf16_ulp, check_greedy
from .decoder import BlockRecord, DecodeResult, SpeculativeDecoder, speculative_decoder
from .propose import BlockProposer
from .verify import greedy_verify, sample_token, sample_verify

__all__ = [
    "GreedyReport",
    "Mismatch",
    "bf16_ulp",
    "check_greedy",
    "BlockRecord",
    "DecodeResult",
    "SpeculativeDecoder",
    "speculative_decoder",
    "BlockProposer",
    "greedy_verify",
    "sample_token",
    "sample_verify",
]
