"""PyTorch reference speculative decoding, batch 1: propose, verify, the decoder loop and the greedy check."""

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
