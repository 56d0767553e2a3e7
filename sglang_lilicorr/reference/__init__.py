"""PyTorch reference speculative decoding: target + DFlash drafter (+ LiLiCorr head), batch 1.

- propose.py  BlockProposer: the drafter's argmax block and the LiLiCorr block for one context
- verify.py   greedy acceptance and exact rejection sampling of a deterministic drafted block
- decoder.py  SpeculativeDecoder / speculative_decoder: the draft-verify loop, per-block records, tau
- check.py    check_greedy: teacher-forced float32 check that every emitted token is the target's argmax
"""

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
